"""``hvd.elastic`` on torchrun's elastic agent: Horovod Elastic scripts, unchanged, on the native layer.

Horovod Elastic keeps the surviving processes: when a collective fails they restore the last commit held in
memory, re-initialise Horovod with the hosts left and run the wrapped function again. torchrun (``--nnodes
MIN:MAX``, c10d rendezvous) keeps none: when a worker fails, or a host joins, every agent stops its workers and
starts new ones with the hosts there are now. So here a commit is kept where a new process finds it: rank 0
writes the state's commit atomically into the job's folder (:func:`commit_dir`: ``$DPCOMPARE_ELASTIC_DIR``, else
one per torchrun run id in the temporary folder; it must be shared by the hosts), and :func:`run`'s first call in
a process restores the newest commit there, as Horovod's survivors restore theirs after a reset (then the reset
callbacks, then the sync from rank 0). A ``HorovodInternalError`` under torchrun ends the worker (one line, exit
:data:`RESTART_EXIT`) so that its agent restarts the group; without torchrun's elastic agent it is raised, as
there is no one to restart the job.

What differs from Horovod (docs/from-horovod.md): the steps since the last commit are redone when a host joins
too (torchrun restarts the group at once instead of at the next commit); ``check_host_updates`` never raises
(torchrun, not the script, acts on a new host); only ``TorchState`` and ``ObjectState`` survive a restart (their
objects must load with ``torch.load(weights_only=True)``: tensors, numbers, strings, lists, dicts); a custom
``State`` subclass is kept in memory only. The commit folder is removed when the wrapped function returns.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import random
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dpcompare.files import atomic_write
from dpcompare.launch.liveness import RESTART_EXIT
from dpcompare.native import state as _state
from dpcompare.native.collectives import HorovodInternalError, broadcast_object
from dpcompare.native.functions import broadcast_optimizer_state, broadcast_parameters
from dpcompare.native.record import ELASTIC_DIR_VAR

#: the folder commits are kept in (shared by every host of the job); default: one per torchrun run id
DIR_VAR = ELASTIC_DIR_VAR
COMMIT_FILE = "commit.pt"
#: what else a commit on disk keeps, by name: (read when committing, given back when restored). The runner's
#: recorder keeps its step count here, so that a restarted run's steps go on from the commit's.
extras: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {}


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's interrupt at a commit when hosts were added or removed (``skip_sync``: only removed)."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__()
        self.skip_sync = skip_sync


def under_torchrun() -> bool:
    """Is this process a worker of torchrun's elastic agent?"""
    return "TORCHELASTIC_RUN_ID" in os.environ


def commit_dir() -> Path | None:
    """Where this job's commits live (None: not under torchrun and no ``$DPCOMPARE_ELASTIC_DIR``: in memory)."""
    if os.environ.get(DIR_VAR):
        return Path(os.environ[DIR_VAR])
    if not under_torchrun():
        return None
    user = os.environ.get("USER") or str(os.getuid())
    return Path(tempfile.gettempdir()) / f"dpcompare-elastic-{user}" / os.environ["TORCHELASTIC_RUN_ID"]


# -- states ---------------------------------------------------------------------------------------------------
class State:
    """Horovod's ``State``: what a commit saves, a failure restores and a reset re-syncs from rank 0."""

    def __init__(self, bcast_object: Callable[..., Any] = broadcast_object,
                 get_rank: Callable[[], int] = _state.rank) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks: list[Callable[[], Any]] = []

    def register_reset_callbacks(self, callbacks: list[Callable[[], Any]]) -> None:
        """Functions run after every reset (a worker added or removed), e.g. to scale the learning rate."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state (and, under torchrun, write it for a restarted worker), then check for new hosts."""
        self.save()
        _persist(self)
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Horovod raises :class:`HostsUpdatedInterrupt` here; under torchrun the agent restarts the workers
        itself when hosts come or go, so there is nothing to raise."""

    def save(self) -> None:
        raise NotImplementedError()

    def restore(self) -> None:
        raise NotImplementedError()

    def sync(self) -> None:
        raise NotImplementedError()

    def reset(self) -> None:
        """Called after a reset, before the sync."""

    # what a commit on disk holds (None: this state cannot be written; only kept in memory)
    def snapshot(self) -> dict[str, Any] | None:
        return None

    def load_snapshot(self, saved: dict[str, Any]) -> None:
        raise NotImplementedError()


class ObjectState(State):
    """Horovod's ``ObjectState``: plain Python objects, given as keyword arguments, kept as attributes."""

    def __init__(self, bcast_object: Callable[..., Any] = broadcast_object,
                 get_rank: Callable[[], int] = _state.rank, **kwargs: Any) -> None:
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {name: getattr(self, name) for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, value)

    def snapshot(self) -> dict[str, Any] | None:
        return {"objects": copy.deepcopy(self._saved_state)}

    def load_snapshot(self, saved: dict[str, Any]) -> None:
        self._saved_state = dict(saved["objects"])


class _Handler:
    """How ``TorchState`` saves, restores and syncs one kind of object (a model, an optimizer, a sampler)."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.save()

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()

    def save(self) -> None:
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self.saved)

    def sync(self) -> None:
        raise NotImplementedError()


class _ModelHandler(_Handler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_Handler):
    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0))


def _handler(value: Any) -> _Handler | None:
    for kind, handler in ((torch.nn.Module, _ModelHandler), (torch.optim.Optimizer, _OptimizerHandler),
                          (ElasticSampler, _SamplerHandler)):
        if isinstance(value, kind):
            return handler(value)
    return None


class TorchState(ObjectState):
    """Horovod's ``TorchState``: a model, an optimizer, ``ElasticSampler``s (any keyword argument of those
    kinds) and plain objects, saved at each commit and re-synced from rank 0 after a reset."""

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers = {k: h for k, v in kwargs.items() if (h := _handler(v)) is not None}
        self._handlers = handlers
        for name, handler in handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=_state.rank,
                         **{k: v for k, v in kwargs.items() if k not in handlers})

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "_handlers" and name in getattr(self, "_handlers", {}) and hasattr(self, name):
            self._handlers[name].set_value(value)
        super().__setattr__(name, value)

    def snapshot(self) -> dict[str, Any] | None:
        return {**(super().snapshot() or {}), "handlers": {k: h.saved for k, h in self._handlers.items()}}

    def load_snapshot(self, saved: dict[str, Any]) -> None:
        super().load_snapshot(saved)
        for name, value in saved["handlers"].items():
            if name in self._handlers:
                self._handlers[name].saved = value


# -- the sampler ----------------------------------------------------------------------------------------------
class ElasticSampler(torch.utils.data.Sampler):
    """Horovod 0.28.1's ``ElasticSampler``: the epoch's order (shuffled with ``seed + epoch``) without the samples
    processed so far (``record_batch``), split among the ranks there are now; ``set_epoch`` at an epoch's end."""

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.processed_num = epoch, 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """``batch_size`` more samples processed on every rank."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.epoch, self.processed_num = state_dict["epoch"], state_dict["processed_num"]
        self.reset()

    def reset(self) -> None:
        self.num_replicas, self.rank = _state.size(), _state.rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Any:
        padded = self.remaining_indices + self.remaining_indices[: self.total_size - len(self.remaining_indices)]
        self.indices = padded[self.rank: self.total_size: self.num_replicas]
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples


# -- commits on disk ------------------------------------------------------------------------------------------
def _persist(state: State) -> None:
    """Rank 0 writes the state's commit (and the extras) into the job's folder, atomically."""
    folder = commit_dir()
    snap = state.snapshot() if folder is not None and _state.rank() == 0 else None
    if snap is None or folder is None:
        return
    record = {"version": 1, "world_size": _state.size(), "state": snap,
              "extras": {name: get() for name, (get, _) in extras.items()}}
    atomic_write(folder / COMMIT_FILE, lambda f: torch.save(record, f))


def _load_commit(state: State) -> bool:
    """Load the job's newest commit into ``state``'s saved copy (every rank reads it); True when there was one."""
    folder = commit_dir()
    path = folder / COMMIT_FILE if folder is not None else None
    if path is None or not path.is_file() or state.snapshot() is None:
        return False
    record = torch.load(path, weights_only=True)
    state.load_snapshot(record["state"])
    for name, value in record.get("extras", {}).items():
        if name in extras:
            extras[name][1](value)
    if _state.rank() == 0:
        sys.stderr.write(f"hvd.elastic: restoring the commit in {path} (written by a world of "
                         f"{record['world_size']}; now {_state.size()})\n")
    return True


def _forget_commits() -> None:
    """The wrapped function returned everywhere: its commit is no one's to resume from any more."""
    folder = commit_dir()
    if folder is None:
        return
    if dist.is_initialized():
        dist.barrier()
    if _state.rank() == 0:
        (folder / COMMIT_FILE).unlink(missing_ok=True)


def _restart_worker(error: BaseException) -> None:
    """Under torchrun: end this worker so that its agent restarts the group from the last commit."""
    sys.stderr.write(f"hvd.elastic: a collective failed on rank {_state.rank()} ({str(error).splitlines()[0][:200]}"
                     f"); torchrun restarts the workers from the last commit\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(RESTART_EXIT)  # no teardown: the process group's peers are gone, and gloo's threads wait on them


# -- run --------------------------------------------------------------------------------------------------------
def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """``@hvd.elastic.run``: run ``func(state, ...)`` so that it survives lost and new workers.

    Its first call in a process restores the job's last commit when there is one (a restarted worker), then runs
    the reset callbacks, as Horovod's survivors do after a reset; then the state is synced from rank 0 and
    ``func`` runs. ``HostsUpdatedInterrupt`` (raised by the script) resets in place and runs ``func`` again."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        if _load_commit(state):
            state.restore()
            state.reset()  # the reset callbacks, without on_reset (a restart, not a reset: see record.py)
            for callback in state._reset_callbacks:
                callback()
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                result = func(state, *args, **kwargs)
                _forget_commits()
                return result
            except (HorovodInternalError, dist.DistError) as e:
                if not under_torchrun():
                    raise
                _restart_worker(e)
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            state.on_reset()
    return wrapper


def run_fn(func: Callable[..., Any], reset: Callable[[], Any]) -> Callable[..., Any]:
    """``horovod.common.elastic.run_fn``: :func:`run` (``reset`` is torchrun's restart here, not a call)."""
    return run(func)


__all__ = ["ElasticSampler", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState", "run", "run_fn"]
