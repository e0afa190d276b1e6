"""Horovod's negotiation on torch.distributed: collectives matched by name, checked across ranks before they run.

Horovod's background thread pairs the ranks' requests by tensor name, checks that they agree (dtype, shape, root
rank, reduction op, scale factors) and answers a mismatch with an error on every rank instead of a hang; a rank
that called ``join()`` answers the others' all-reduces with zeros; a stall inspector names the tensors some ranks
wait for. The layer does the same without a thread:

- a call (``hvd.allreduce_async``, ``hvd.broadcast``...) queues a :class:`Request` and returns: nothing is sent;
- where a result is needed (``synchronize``, a blocking call, ``barrier``, ``join``, ``poll``), the rank runs
  *rounds*: one all-gather, on a gloo group of its own, of a fixed-size table of int64 descriptors (one row per
  queued request: name hash, kind, dtype, device, shape, root, op, factors, process set); a second all-gather only
  when some rank has more than :data:`SLOTS` requests queued;
- from those rows every rank derives the same list of requests submitted by every rank that has not joined, in
  the same order, checks each for agreement and starts its collective (or fails it with Horovod's message,
  naming the tensor and the ranks); a request not ready waits for a later round.

Rounds are collectives, so every rank counts the same rounds and starts the same collectives in the same order,
whatever order its own calls came in. Unnamed requests are named ``KIND.noname.N`` on each rank (one counter per
rank, as Horovod names them by handle), but they are matched by position: each rank's oldest unnamed request
waiting with each rank's oldest, and so on. Horovod matches them by that name, which a rank that joined and skipped
a call no longer shares with the others (at three ranks its next unnamed call never meets theirs); the position
among the calls waiting is the same on every rank that has not joined, whatever each skipped before.

A rank that leaves the job (``hvd.shutdown()``, or its script ended, by an exception too) writes in the job's store
how many rounds of each set it took part in (:func:`leave`). A rank whose round has waited a second looks there: a
member that left before this round will never come, and the round fails with Horovod's shutdown error (Horovod's
background thread spreads a shutdown the same way) instead of waiting forever.

Process sets: each set negotiates apart, among its own ranks, on a gloo group of its own (:mod:`.process_sets`
makes it when the set is registered); ranks outside a set take no part in its rounds. ``join()`` is the global
set's.

The gradients of ``DistributedOptimizer`` do not come here (:mod:`.fusion` issues them directly, in the same order
on every rank), so a rank that joined does not answer them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from dpcompare.native import state
from dpcompare.native.process_sets import control_of

KINDS = ("allreduce", "allgather", "broadcast", "barrier", "alltoall", "reducescatter")
DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64, torch.bool)
#: requests one all-gather carries per rank (more: a second, sized to the longest queue)
SLOTS = 8
MAX_DIMS = 6
NAME, KIND, DTYPE, DEVICE, NDIM, NUMEL, SHAPE, REST, ROOT, OP, PRE, POST, PSET, DIMS = range(14)
WIDTH = DIMS + MAX_DIMS
#: the header row of each rank's table: how many requests follow, the round it joined in (-1: has not)
COUNT, JOINED = 0, 1
#: kinds a rank that joined answers (with zeros); the others fail while a rank has joined, as in Horovod
JOIN_ANSWERS = {"allreduce": "", "barrier": "",
                "allgather": "Allgather is not supported with Join at this time. Specify sparse_to_dense=True if "
                             "using DistributedOptimizer",
                "broadcast": "Broadcast is not supported with Join at this time.",
                "alltoall": "Alltoall is not supported with Join at this time.",
                "reducescatter": "Reducescatter is not supported with Join at this time."}
DUPLICATE_NAME = ("Requested to allreduce, allgather, or broadcast a tensor with the same name as another tensor "
                  "that is currently being processed.  If you want to request another tensor, use a different "
                  "tensor name.")


class HorovodInternalError(RuntimeError):
    """A collective failed (the ranks disagreed on it, a peer died, the network broke, a stall was stopped):
    Horovod's exception, raised where Horovod raises it."""


NegotiationError = HorovodInternalError


def name_hash(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") >> 1


def _bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _shape_hash(dims: Sequence[int]) -> int:
    return name_hash(",".join(map(str, dims)))


@dataclass(eq=False)
class Request:
    """One call of this rank waiting for the others: what its row says, and how to start it once agreed."""

    name: str
    kind: str
    tensor: torch.Tensor | None
    #: starts the collective given every rank's row for it (None: that rank joined); returns what ``wait`` gives
    start: Callable[[list[list[int] | None]], Any]
    root: int = -1
    op: int = -1
    prescale: float = 1.0
    postscale: float = 1.0
    process_set: int = 0
    #: named by the layer (``KIND.noname.N``): matched with the other ranks' by position, not by name
    unnamed: bool = False
    started: Any = None
    done: bool = False
    error: BaseException | None = None

    def row(self) -> list[int]:
        t = self.tensor
        dims = list(t.shape) if t is not None else []
        row = [0] * WIDTH
        row[NAME], row[KIND] = -1 if self.unnamed else name_hash(self.name), KINDS.index(self.kind) + 1
        if t is not None:
            row[DTYPE] = DTYPES.index(t.dtype) + 1 if t.dtype in DTYPES else 100 + name_hash(str(t.dtype)) % 1000
            row[DEVICE] = 1 if t.is_cuda else 0
            row[NDIM], row[NUMEL] = t.dim(), t.numel()
            row[SHAPE], row[REST] = _shape_hash(dims), _shape_hash(dims[1:])
            row[DIMS:DIMS + min(len(dims), MAX_DIMS)] = dims[:MAX_DIMS]
        row[ROOT], row[OP], row[PRE], row[POST] = self.root, self.op, _bits(self.prescale), _bits(self.postscale)
        row[PSET] = self.process_set
        return row


def dtype_of(row: Sequence[int]) -> torch.dtype:
    return DTYPES[row[DTYPE] - 1]


def first_dim(row: Sequence[int]) -> int:
    """The rows a rank contributes to an all-gather (a scalar counts as one)."""
    return row[DIMS] if row[NDIM] else 1


def _shape(row: Sequence[int]) -> str:
    dims = row[DIMS:DIMS + min(row[NDIM], MAX_DIMS)]
    return "[" + ", ".join(map(str, dims)) + (", ...]" if row[NDIM] > MAX_DIMS else "]")


def _dtype_name(row: Sequence[int]) -> str:
    return str(dtype_of(row)).replace("torch.", "") if 0 < row[DTYPE] <= len(DTYPES) else f"dtype#{row[DTYPE]}"


def _differs(rows: dict[int, list[int]], show: Callable[[list[int]], str]) -> str:
    """``rank 0 sent X, rank 1 sent Y`` (ranks that sent the same thing grouped)."""
    groups: dict[str, list[int]] = {}
    for r, row in sorted(rows.items()):
        groups.setdefault(show(row), []).append(r)
    return ", ".join(f"rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))} sent {v}" for v, rs in groups.items())


#: (columns that must agree, for which kinds, what Horovod calls the difference, how a row shows it)
_CHECKS: list[tuple[tuple[int, ...], tuple[str, ...] | None, str, Callable[[list[int]], str]]] = [
    ((KIND,), None, "Mismatched operations", lambda r: KINDS[r[KIND] - 1]),
    ((DTYPE,), None, "Mismatched data types", _dtype_name),
    ((DEVICE,), None, "Mismatched devices (CPU and GPU)", lambda r: "cuda" if r[DEVICE] else "cpu"),
    ((NDIM, SHAPE), ("allreduce", "broadcast"), "Mismatched {kind} tensor shapes", _shape),
    ((NDIM, REST), ("allgather", "alltoall"), "Mismatched {kind} tensor shapes (all but the first dimension)",
     _shape),
    ((ROOT,), ("broadcast",), "Mismatched broadcast root ranks", lambda r: f"root rank {r[ROOT]}"),
    ((OP,), ("allreduce", "reducescatter"), "Mismatched reduction operation", lambda r: _op_name(r[OP])),
    ((PRE, POST), ("allreduce", "reducescatter"), "Mismatched prescale and/or postscale factors",
     lambda r: "factors ({}, {})".format(*(struct.unpack("<d", struct.pack("<q", r[c]))[0] for c in (PRE, POST)))),
]


def _op_name(op: int) -> str:
    names = ("hvd.Average", "hvd.Sum", "hvd.Adasum", "hvd.Min", "hvd.Max", "hvd.Product")
    return names[op] if 0 <= op < len(names) else f"op {op}"


def disagreement(name: str, rows: dict[int, list[int]]) -> str | None:
    """Horovod's message for the first thing the ranks' rows of one request disagree on, naming the tensor and
    what each rank sent; None when they agree."""
    kind = KINDS[next(iter(rows.values()))[KIND] - 1]
    for cols, kinds, what, show in _CHECKS:
        if kinds is not None and kind not in kinds:
            continue
        if len({tuple(row[c] for c in cols) for row in rows.values()}) > 1:
            return f"{what.format(kind=kind)} for tensor '{name}': {_differs(rows, show)}."
    return None


@dataclass
class _Stall:
    """Horovod's stall inspector: names the tensors waited for and the ranks that have not submitted them."""

    check_s: float = 60.0
    shutdown_s: float = 0.0
    disabled: bool = False
    since: float = 0.0
    warned: float = 0.0
    published: bool = False
    stopped: bool = False
    #: the global ranks of the set whose rounds this inspects, and the set's id (the store's keys)
    ranks: list[int] = field(default_factory=list)
    set_id: int = 0

    @classmethod
    def from_env(cls) -> _Stall:
        def seconds(var: str, default: float) -> float:
            try:
                return float(os.environ.get(var, "") or default)
            except ValueError:
                return default
        check = seconds("HOROVOD_STALL_CHECK_TIME_SECONDS", 60.0)
        stop = seconds("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", 0.0)
        disabled = os.environ.get("HOROVOD_STALL_CHECK_DISABLE", "").strip() in ("1", "true", "True")
        return cls(check, stop if stop <= 0 or stop >= check else 0.0, disabled)

    def begin(self) -> None:
        """A wait starts: the limits read again (a script may set them after ``init()``), the clock started."""
        fresh = _Stall.from_env()
        self.check_s, self.shutdown_s, self.disabled = fresh.check_s, fresh.shutdown_s, fresh.disabled
        self.since = self.warned = time.monotonic()

    def end(self) -> None:
        """A wait ended: what this rank published withdrawn (kept when it stopped the job: others may read it)."""
        if self.published and not self.stopped:
            self.published = False
            with contextlib.suppress(Exception):  # a store gone with the job: nothing left to tidy
                _store().delete_key(self._key(state.rank()))

    def next_check(self) -> float:
        """Seconds until :meth:`tick` has something to do (the longest a wait may block before calling it)."""
        if self.disabled:
            return 3600.0
        due = self.warned + self.check_s
        if self.shutdown_s:
            due = min(due, self.since + self.shutdown_s)
        return max(due - time.monotonic(), 0.001)

    def tick(self, waiting: list[str], round_no: int = 0) -> None:
        """Warn every ``check_s`` of waiting; past ``shutdown_s`` raise with the same message (``round_no``: the
        set's round this rank waits in, marked for the others: see :meth:`stopped_by_peer`)."""
        if self.disabled:
            return
        now = time.monotonic()
        lag = now - self.since
        stop = bool(self.shutdown_s) and lag > self.shutdown_s
        if lag < self.check_s or (now - self.warned < self.check_s and not stop):
            return
        self.warned = now
        if stop:
            self.stop(waiting, round_no)
        sys.stderr.write(f"[{state.rank()}]: WARNING: {self._message(waiting, False)}\n")
        sys.stderr.flush()

    def stop(self, waiting: list[str], round_no: int, after: float | None = None) -> NoReturn:
        """Stop this rank's wait with the inspector's message, the round marked first: Horovod's coordinator
        stops every rank of the job, so the set's other ranks stop with it instead of finding this one gone
        (``after``: the stopping rank's limit, which the others' message repeats)."""
        if after is not None:
            self.shutdown_s = after
        message = self._message(waiting, True)
        self.stopped = True
        with contextlib.suppress(Exception):  # no store: the others find this rank gone instead
            _store().set(self._key(-1), json.dumps({"round": round_no, "after": self.shutdown_s}))
        raise NegotiationError(message)

    def stopped_by_peer(self, round_no: int) -> float | None:
        """The limit after which another rank of the set stopped its wait for a stall in round ``round_no`` (the
        one this rank waits in); None if none did."""
        try:
            store = _store()
            mark = json.loads(store.get(self._key(-1))) if store.check([self._key(-1)]) else {}
        except Exception:  # noqa: BLE001  (no store: nothing marked)
            return None
        return mark["after"] if mark.get("round") == round_no else None

    def _key(self, rank: int) -> str:
        return _stall_key(self.set_id, rank)

    def _message(self, waiting: list[str], stop: bool) -> str:
        """Publish what this rank waits for; read what the others wait for (the job's store); Horovod's words."""
        ranks, me = self.ranks or list(range(state.size())), state.rank()
        queued: dict[int, list[str]] = {me: waiting}
        try:
            store = _store()
            store.set(self._key(me), json.dumps(waiting))
            self.published = True
            for r in ranks:
                if r != me and store.check([self._key(r)]):
                    queued[r] = json.loads(store.get(self._key(r)))
        except Exception:  # noqa: BLE001  (no store: this rank's view only)
            pass
        names = sorted({x for q in queued.values() for x in q})
        missing = {r: [x for x in names if x not in queued.get(r, [])] for r in ranks}
        lines = [f"{r}{'' if r in queued else '!'}: [{', '.join(xs[:5])}{' ...' if len(xs) > 5 else ''}]"
                 for r, xs in missing.items() if xs]
        text = ("One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and "
                f"are waiting for remainder of ranks for more than {self.check_s:g} seconds. This may indicate that "
                "different ranks are trying to submit different tensors or that only subset of ranks is "
                "submitting tensors, which will cause deadlock.\nMissing ranks (\"!\": not waiting in any Horovod "
                "call):\n" + "\n".join(lines))
        if stop:
            text += (f"\nOne or more rank (marked by \"!\") is stalled for longer than {self.shutdown_s:g} seconds. "
                     "Will shutdown.")
        return text


def _store() -> Any:
    return dist.distributed_c10d._get_default_store()


def _stall_key(set_id: int, rank: int) -> str:
    return f"dpcompare.native.stall/{set_id}/{rank}"


#: Horovod's words for a collective that cannot finish because a rank left (``SHUT_DOWN_ERROR``)
SHUT_DOWN = ("Horovod has been shut down. This was caused by an exception on one of the ranks or an attempt to "
             "allreduce, allgather or broadcast a tensor after one of the ranks finished execution. If the shutdown "
             "was caused by an exception, you should see the exception in the log before the first shutdown message.")
#: seconds a round waits before it looks for ranks that left (rounds take milliseconds: nothing to pay for)
LEFT_POLL_S = 1.0


def keys(names: Sequence[int]) -> list[int]:
    """What identifies each of one rank's queued requests across ranks, given their ``NAME`` column: the name's
    hash, or for an unnamed request (-1) ``-1 - i``, ``i`` its position among that rank's unnamed requests (which
    survives a rank that skipped calls)."""
    out, unnamed = [], 0
    for h in names:
        if h >= 0:
            out.append(h)
        else:
            out.append(-1 - unnamed)
            unnamed += 1
    return out


@dataclass
class Negotiator:
    """This rank's queue of requests of one process set, and its side of that set's rounds."""

    group: Any = None                   # the gloo group the rounds run on
    ranks: list[int] = field(default_factory=list)   # the set's global ranks
    set_id: int = 0
    queue: list[Request] = field(default_factory=list)
    in_flight: dict[str, Request] = field(default_factory=dict)
    rounds: int = 0
    joined_at: int = -1
    last_joined: int = -1
    counter: int = 0
    broken: str = ""
    stall: _Stall = field(default_factory=_Stall.from_env)
    #: what a rank that joined contributes to an all-reduce it did not submit (set by the collectives module)
    answer_joined: Callable[[list[int]], Any] | None = None

    def auto_name(self, kind: str, name: str | None) -> str:
        self.counter += 1
        return name if name is not None else f"{kind}.noname.{self.counter}"

    def submit(self, request: Request) -> Request:
        """Queue ``request``; a name still in flight on this rank (queued, or its collective not finished) is
        Horovod's ValueError, at this call."""
        if self.broken:
            raise NegotiationError(self.broken)
        earlier = self.in_flight.get(request.name)
        if earlier is not None and earlier.done and (earlier.started is None or earlier.started.done()):
            earlier = None      # finished, though its handle was never synchronized: the name is free again
        if earlier is not None:
            raise ValueError(f"{DUPLICATE_NAME} (tensor '{request.name}')")
        self.in_flight[request.name] = request
        self.queue.append(request)
        return request

    def release(self, request: Request) -> None:
        """The request's handle was synchronized: its name may be used again."""
        if self.in_flight.get(request.name) is request:
            del self.in_flight[request.name]

    def wait(self, request: Request) -> Any:
        """Run rounds until ``request`` has started (or failed); what its start returned."""
        self.progress(lambda: request.done)
        if request.error is not None:
            self.release(request)
            raise request.error
        return request.started

    def progress(self, finished: Callable[[], bool]) -> None:
        if finished():
            return
        self.stall.begin()
        pause = 0.0005
        try:
            while not finished():
                if self.round():
                    pause = 0.0005
                else:
                    time.sleep(pause)
                    pause = min(pause * 2, 0.05)
                    self.stall.tick(self.waiting(), self.rounds + 1)
        finally:
            self.stall.end()

    def poll(self) -> None:
        """One round (``hvd.poll`` on a request not started yet: the others may be waiting for this rank)."""
        self.stall.begin()
        try:
            self.round()
        finally:
            self.stall.end()

    def waiting(self) -> list[str]:
        return [r.name for r in self.queue] + (["join"] if self.joined_at >= 0 else [])

    # -- one round ------------------------------------------------------------------------------------------
    def _table(self, slots: int) -> torch.Tensor:
        table = torch.zeros((1 + slots, WIDTH), dtype=torch.int64)
        table[0, COUNT], table[0, JOINED] = len(self.queue), self.joined_at
        for i, req in enumerate(self.queue[:slots]):
            table[1 + i] = torch.tensor(req.row(), dtype=torch.int64)
        return table

    def _gather(self, table: torch.Tensor) -> torch.Tensor:
        """Every rank's table (n × rows × WIDTH), waited for with the stall inspector awake."""
        n = len(self.ranks)
        out = torch.empty((n * table.shape[0], WIDTH), dtype=torch.int64)
        work = dist.all_gather_into_tensor(out, table, group=self.group, async_op=True)
        while True:
            try:
                work.wait(timeout=timedelta(seconds=min(self.stall.next_check(), LEFT_POLL_S)))
                return out.view(n, *table.shape)
            except RuntimeError as e:
                if "timed out" not in str(e):   # a peer gone (its connection closed): Horovod's error
                    raise HorovodInternalError(str(e)) from e
            try:
                after = self.stall.stopped_by_peer(self.rounds + 1)
                if after is not None:
                    self.stall.stop(self.waiting(), self.rounds + 1, after)
                gone = self.left()
                if gone:
                    raise NegotiationError(f"{SHUT_DOWN} (rank{'s' if len(gone) > 1 else ''} "
                                           f"{', '.join(map(str, gone))} left the job)")
                self.stall.tick(self.waiting(), self.rounds + 1)
            except NegotiationError as e:
                self.broken = str(e)        # the gather is still posted: this group cannot be used again
                raise

    def left(self) -> list[int]:
        """The set's ranks that left the job before the round this rank waits in (:func:`leave`): they will not
        come. Nothing when the store cannot tell (a rank that died closes its connections: the gather fails)."""
        me, waiting, gone = state.rank(), self.rounds + 1, []
        try:
            store = _store()
            for r in self.ranks:
                key = state.LEFT_KEY.format(r)
                if r != me and store.check([key]) and json.loads(store.get(key)).get(str(self.set_id), 0) < waiting:
                    gone.append(r)
        except Exception:  # noqa: BLE001  (a store gone with its host: the gather itself will fail)
            return []
        return gone

    def round(self) -> bool:
        """One round: exchange the tables, start (or fail) what every rank submitted. True if anything moved."""
        if self.broken:
            raise NegotiationError(self.broken)
        every = self._gather(self._table(SLOTS))
        longest = int(every[:, 0, COUNT].max())
        if longest > SLOTS:
            every = self._gather(self._table(longest))
        self.rounds += 1
        n = len(self.ranks)
        joined = {r: int(every[r, 0, JOINED]) for r in range(n) if int(every[r, 0, JOINED]) >= 0}
        rows = [[every[r, 1 + i].tolist() for i in range(min(int(every[r, 0, COUNT]), every.shape[1] - 1))]
                for r in range(n)]
        moved = self._start_ready(rows, set(joined))
        if len(joined) == n and self.joined_at >= 0:
            last = max(joined.values())
            self.last_joined = max(r for r, at in joined.items() if at == last)
            self.joined_at = -1
            moved = True
        return moved

    def _start_ready(self, rows: list[list[list[int]]], joined: set[int]) -> bool:
        """Start, in the same order on every rank, each request every member that has not joined submitted."""
        seen: dict[int, dict[int, list[int]]] = {}
        for r, table in enumerate(rows):
            for key, row in zip(keys([row[NAME] for row in table]), table, strict=True):
                seen.setdefault(key, {})[r] = row
        mine = dict(zip(keys([-1 if q.unnamed else name_hash(q.name) for q in self.queue]), self.queue, strict=True))
        me, moved = self.ranks.index(state.rank()), False
        for h, by_rank in seen.items():
            group = range(len(rows))
            if any(r not in by_rank for r in group if r not in joined) or all(r in joined for r in group):
                continue
            moved = True
            request = mine.get(h)
            kind = KINDS[next(iter(by_rank.values()))[KIND] - 1]
            problem = disagreement(request.name if request else f"#{h}", by_rank)
            if problem is None and joined & set(group):
                problem = JOIN_ANSWERS.get(kind) or None
            if request is not None:
                self.queue.remove(request)
                request.done = True
                if problem is not None:
                    request.error = NegotiationError(problem)
                else:
                    request.started = self._start(request, [by_rank.get(r) for r in range(len(rows))])
            elif me in joined and me in group and problem is None and kind == "allreduce" \
                    and self.answer_joined is not None:
                self.answer_joined(next(iter(by_rank.values())))
        return moved

    @staticmethod
    def _start(request: Request, rows: list[list[int] | None]) -> Any:
        """Start an agreed request; a check of its own that fails (the same on every rank: what it checks was
        gathered from all) fails the request, not the round."""
        try:
            return request.start(rows)
        except (RuntimeError, ValueError) as e:
            request.error = e
            return None

    def join(self) -> int:
        """Horovod's join: answer the others' all-reduces with zeros until every rank has joined; the last
        rank to join (the same on every rank)."""
        self.joined_at = self.rounds + 1
        self.last_joined = -1
        self.progress(lambda: self.joined_at < 0)
        return self.last_joined


_negotiators: dict[int, Negotiator] = {}


def leave() -> None:
    """This rank leaves the job (``hvd.shutdown()``, the script's end): how many rounds of each process set it
    took part in, written in the job's store, where a round left waiting for it looks (:meth:`Negotiator.left`)."""
    if not state.is_initialized():
        return
    world = state.world()
    rounds = {str(n.set_id): n.rounds for n in _negotiators.values() if getattr(n, "_world", None) is world}
    with contextlib.suppress(Exception):  # no store (the group already gone): nobody left to tell
        _store().set(state.LEFT_KEY.format(world.rank), json.dumps(rounds))


def negotiator(process_set: int = 0) -> Negotiator:
    """This process's negotiator for a process set (new ones after each ``init()``, as Horovod's state is, and
    for a set id given again to a new set)."""
    world = state.world()
    if process_set == 0:
        group, ranks = world.control, list(range(world.size))
    else:
        group, ranks = control_of(process_set)
    neg = _negotiators.get(process_set)
    if neg is None or neg.group is not group or getattr(neg, "_world", None) is not world:
        neg = Negotiator(group=group, ranks=ranks, set_id=process_set)
        neg.stall.ranks, neg.stall.set_id = ranks, process_set
        neg._world = world  # type: ignore[attr-defined]
        _negotiators[process_set] = neg
    return neg
