"""Horovod's process sets on ``dist.new_group``: ``hvd.ProcessSet``, ``hvd.init(process_sets=...)``,
``hvd.add_process_set``/``remove_process_set`` and the ``process_set=`` every collective takes.

As in Horovod 0.28.1 (horovod/common/process_sets.py and its C++ table):

- a set is built from a list of global ranks (kept sorted); it gets an id when it is registered, by ``hvd.init``
  (static sets, in the order given) or by ``add_process_set`` (with ``HOROVOD_DYNAMIC_PROCESS_SETS=1`` or
  ``hvd.init(process_sets="dynamic")``); ids count up from 1 and a removed set's id is given again first;
- registering a set with the ranks of one that exists (the global set included) is a ``ValueError``; removing the
  global set, or one never registered, returns False;
- ``rank()``/``size()`` are None before registration; ``rank()`` raises ``ValueError`` on a process outside the set;
- a collective on a set the calling rank is not in raises ``ValueError`` (Horovod's message); ``root_rank`` stays a
  global rank.

Registering and removing are collectives over the whole job, as in Horovod: every rank calls them, in the same order
(``dist.new_group`` requires it). A set built from an mpi4py communicator is refused (the layer has no MPI).
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch.distributed as dist

from dpcompare.native import state
from dpcompare.native.calls import unsupported

DYNAMIC_VAR = "HOROVOD_DYNAMIC_PROCESS_SETS"


class ProcessSet:
    """A set of Horovod processes that run collectives together; ``group`` is its torch process group (None for
    the global set, and on ranks outside the set)."""

    process_set_id: int | None = None
    ranks: list[int] | None = None
    mpi_comm: Any = None

    def __init__(self, ranks_or_comm: Sequence[int] | Any) -> None:
        if not isinstance(ranks_or_comm, Iterable):
            raise unsupported("hvd.ProcessSet(mpi_comm)", "ProcessSet")
        ranks = sorted(ranks_or_comm)
        if any(not isinstance(r, int) for r in ranks):
            raise ValueError("ProcessSet should be initialized with a list of process ranks or an mpi4py Comm object")
        self.ranks = ranks
        self.group: Any = None
        self.control: Any = None

    def _invalidate(self) -> None:
        self.process_set_id = None
        self.group = None

    def size(self) -> int | None:
        """The number of processes in the set, None when it is not registered."""
        if self.process_set_id is None:
            return None
        if self.process_set_id == 0:
            return state.size()
        return len(_known(self).ranks or [])

    def rank(self) -> int | None:
        """This process's rank within the set (None when it is not registered)."""
        if self.process_set_id is None:
            return None
        if self.process_set_id == 0:
            return state.rank()
        ranks = _known(self).ranks or []
        if state.rank() not in ranks:
            raise ValueError("Process is not part of provided process set.")
        return ranks.index(state.rank())

    def included(self) -> bool | None:
        """Whether this process belongs to the set (None when the set has no ranks)."""
        if self.process_set_id == 0:
            return True
        if self.ranks is None:
            return None
        return state.rank() in self.ranks

    def __str__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_table: dict[int, ProcessSet] = {}
_free_ids: collections.deque[int] = collections.deque()
_next_id = 1


def _known(ps: ProcessSet) -> ProcessSet:
    if ps.process_set_id not in _table and ps.process_set_id != 0:
        raise ValueError("Process set does not exist or has not been registered.")
    return ps


def _register(ps: ProcessSet) -> int | None:
    """Give ``ps`` an id and a torch group (every rank, same order); None when its ranks are already a set's."""
    global _next_id
    if ps.ranks == global_process_set.ranks or any(o.ranks == ps.ranks for o in _table.values()):
        return None
    bad = [r for r in ps.ranks or [] if not 0 <= r < state.size()]
    if bad or not ps.ranks:
        raise ValueError(f"{ps}: ranks must be between 0 and {state.size() - 1} (got {ps.ranks})")
    group = dist.new_group(ps.ranks)
    control = dist.new_group(ps.ranks, backend="gloo")   # the set's own rounds of agreement (:mod:`.negotiation`)
    new_id = _free_ids.popleft() if _free_ids else _next_id
    _next_id = max(_next_id, new_id + 1)
    ps.process_set_id = new_id
    ps.group = group if state.rank() in ps.ranks else None
    ps.control = control if state.rank() in ps.ranks else None
    _table[new_id] = ps
    return new_id


def setup(process_sets: Any) -> None:
    """``hvd.init``'s part: the global set's ranks, then the static sets in order (Horovod's duplicate error)."""
    global _next_id
    if process_sets is not None and isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise ValueError(f"process_sets must be a list of hvd.ProcessSet or 'dynamic' (got {process_sets!r})")
        os.environ[DYNAMIC_VAR] = "1"
        process_sets = []
    if global_process_set.ranks != list(range(state.size())):
        _table.clear()
        _free_ids.clear()
        _next_id = 1
        global_process_set.ranks = list(range(state.size()))
    for i, ps in enumerate(process_sets or []):
        if ps.process_set_id is not None and _table.get(ps.process_set_id) is ps:
            continue  # hvd.init called again with the same sets (it is idempotent)
        if _register(ps) is None:
            ps._invalidate()
            raise ValueError(f"Horovod could not be initialized because process_sets entry number {i} is a "
                             f"duplicate: {ps}")


def reset() -> None:
    """``hvd.shutdown()``'s part: every set unregistered (their groups went with the job's)."""
    global _next_id
    for ps in _table.values():
        ps._invalidate()
    _table.clear()
    _free_ids.clear()
    _next_id = 1
    global_process_set.ranks = []


def _dynamic(verb: str) -> None:
    state.world()  # Horovod's error before init
    if os.environ.get(DYNAMIC_VAR, "0") != "1":
        raise ValueError(f"Set {DYNAMIC_VAR}=1 to allow {verb} process sets after Horovod initialization.")


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a new set after ``hvd.init`` (every rank calls it, in the same order) and return it."""
    _dynamic("adding")
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if _register(ps) is None:
        raise ValueError(f"Attempted to add a duplicate process set: {ps}")
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` (every rank calls it); False for the global set or one never registered."""
    _dynamic("removing")
    ps_id = process_set.process_set_id
    if ps_id is None or ps_id == 0:
        return False
    process_set._invalidate()
    if _table.pop(ps_id, None) is None:
        return False
    _free_ids.append(ps_id)
    return True


def check_process_set(process_set: ProcessSet, call: str) -> ProcessSet:
    """``process_set`` when this rank may run ``call`` on it; Horovod's ValueError otherwise."""
    if process_set is global_process_set:
        return process_set
    op = call.removeprefix("hvd.").removeprefix("grouped_").split("(")[0].replace("_async", "").rstrip("_")
    op = op.capitalize()
    if not isinstance(process_set, ProcessSet) or process_set.process_set_id not in _table:
        raise ValueError(f"{op}: Process set provided does not exist, or has not been registered.")
    if not process_set.included():
        raise ValueError(f"{op}: Rank {state.rank()} is not a member of the provided process set.")
    return process_set


def group_of(process_set: ProcessSet) -> Any:
    """The torch process group a collective on ``process_set`` runs in (None: the default group)."""
    return process_set.group


def control_of(process_set_id: int) -> tuple[Any, list[int]]:
    """The gloo group the registered set with this id agrees on its collectives in, and its global ranks."""
    ps = _table[process_set_id]
    return ps.control, list(ps.ranks or [])


def first_rank(process_set: ProcessSet) -> int:
    """The set's lowest global rank (where a set-wide decision is taken)."""
    return 0 if process_set is global_process_set else (process_set.ranks or [0])[0]
