"""Every built-in strategy by name, with the facts other rooms read about it, without importing any of them.

The command line lists and checks strategy names (``--help``, ``--strategies``) from here, reports read the
communication each strategy declares, ``parity`` reads which strategies are distributed and ``predict`` which
schedule models each one, all without importing torch. :func:`dpcompare.backends.registry.get` imports a
strategy's module on first use and registers the class its line names, which takes these facts from the line.

A new built-in strategy is its module (one class on :class:`~dpcompare.backends.base.Strategy` or
:class:`~dpcompare.backends.torchdist.TorchDistributedStrategy`), its one :class:`Entry` line below and, if
``dpcompare predict`` should model it, its schedule module. A strategy outside the package (``--strategy
path/to/file.py:Class`` or ``module:Class``) needs no line: its class declares the same facts itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

from dpcompare.files import is_plugin

#: the ending of a declaration that holds only for models with buffers (the report drops it for models without)
IF_BUFFERS = ", when the model has buffers"


#: the knobs every strategy honours (the step runner does both): accumulation and autocast
BASE_KNOBS = frozenset({"accumulate", "amp"})


class Entry(NamedTuple):
    """What the rest of dpcompare may know about a strategy without importing it."""

    #: ``MODULE:CLASS`` that defines it (the registry imports it; a strategy's module never imports the registry)
    module: str
    #: one line for --help and reports
    summary: str
    #: phase of the step → the communication the strategy does there. Every collective a strategy issues is
    #: declared, so a report can say which communication sits in the phase that accounts for a difference.
    communication: Mapping[str, str] = {}
    #: False: one process, no communication (``parity``'s reference run with the global batch)
    distributed: bool = True
    #: the communication knobs (TrainConfig fields, :mod:`dpcompare.knobs`) it honours; it refuses the others
    knobs: frozenset[str] = BASE_KNOBS
    #: ``MODULE:CLASS`` of its ``dpcompare predict`` schedule (:mod:`dpcompare.prediction`), or None
    schedule: str | None = None
    #: the launcher of its elastic mode (``compare``'s ``NAME-elastic`` arms, ``--commit-every N``): ``torchrun``
    #: (every process restarted with the survivors, resuming from the newest checkpoint) or ``horovodrun`` (Horovod
    #: Elastic: the survivors roll back to their last in-memory commit); None: no elastic mode
    elastic: str | None = None


#: what DDP's model hooks take (``ddp`` and ``zero``); FSDP2 runs no DDP comm hooks and no buckets
DDP_KNOBS = frozenset({"accumulate", "amp", "grad_compression", "bucket_mb", "powersgd_rank", "static_graph",
                       "find_unused_parameters"})

STRATEGIES: dict[str, Entry] = {
    "ddp": Entry(
        "dpcompare.backends.ddp:DDPStrategy", "torch DistributedDataParallel (gloo on CPU, nccl on CUDA)",
        {"forward": "broadcast of rank 0's buffers (BatchNorm statistics) at the start of every forward "
                    "(broadcast_buffers=True)" + IF_BUFFERS,
         "backward": "bucketed all-reduce of the gradients, started from hooks on the model as each bucket "
                     "fills; whatever backward's remaining computation does not hide is waited for here"},
        knobs=DDP_KNOBS, schedule="dpcompare.prediction.ddp:DDPSchedule", elastic="torchrun"),
    "fsdp": Entry(
        "dpcompare.backends.fsdp:FSDPStrategy",
        "FSDP2 fully_shard per layer and the root (parameters, gradients, optimizer state sharded)",
        {"forward": "all-gather of each layer's parameter shards before its forward",
         "backward": "all-gather of each layer's parameters again, and reduce-scatter of its gradients"},
        schedule="dpcompare.prediction.fsdp:FSDPSchedule"),
    "horovod": Entry(
        "dpcompare.backends.horovod:HorovodStrategy", "Horovod DistributedOptimizer (MPI or gloo controller)",
        {"backward": "all-reduces enqueued from hooks in the optimizer as gradients are ready; Horovod's "
                     "background thread negotiates, fuses and reduces them (nothing is waited for here)",
         "optimizer": "step() waits for the fused all-reduces (synchronize()) before it updates"},
        knobs=frozenset({"accumulate", "amp", "grad_compression", "bucket_mb", "horovod_cycle_ms", "horovod_ops",
                         "mpi_allreduce", "adasum"}),
        schedule="dpcompare.prediction.horovod:HorovodSchedule", elastic="horovodrun"),
    "single": Entry("dpcompare.backends.single:SingleStrategy", "one process, no communication (the baseline)", distributed=False),
    "zero": Entry(
        "dpcompare.backends.zero:ZeroStrategy",
        "ZeRO-1: DDP + torch ZeroRedundancyOptimizer (optimizer state sharded over processes)",
        {"forward": "DDP's buffer broadcast" + IF_BUFFERS,
         "backward": "DDP's bucketed gradient all-reduce",
         "optimizer": "each rank updates its shard of the parameters, then broadcasts it to the others"},
        knobs=DDP_KNOBS, schedule="dpcompare.prediction.zero:ZeroSchedule"),
}


def names() -> list[str]:
    return list(STRATEGIES)


def one_process() -> str:
    """The built-in strategy that runs one process (``parity`` compares against it with the global batch)."""
    return next(n for n, e in STRATEGIES.items() if not e.distributed)


#: name → {phase: communication}, for readers of the built-ins' declarations (:attr:`Entry.communication`)
COMMUNICATION: dict[str, Mapping[str, str]] = {n: e.communication for n, e in STRATEGIES.items()}


#: an arm's name for a strategy's elastic mode: ``ddp-elastic``, ``horovod-elastic``
ELASTIC_SUFFIX = "-elastic"


def elastic_base(name: str) -> str | None:
    """The built-in strategy whose elastic mode ``name`` (``ddp-elastic``) names, or None."""
    base = name.removesuffix(ELASTIC_SUFFIX)
    return base if name.endswith(ELASTIC_SUFFIX) and base in STRATEGIES and STRATEGIES[base].elastic else None


def check_arm_name(name: str) -> str:
    """``name`` when it names a strategy (:func:`check_name`) or a built-in one's elastic mode (``ddp-elastic``)."""
    if elastic_base(name):
        return name
    try:
        return check_name(name)
    except ValueError as e:
        modes = ", ".join(f"{n}{ELASTIC_SUFFIX}" for n, e_ in STRATEGIES.items() if e_.elastic)
        raise ValueError(f"{e}; elastic modes: {modes}") from None


def folder(name: str) -> str:
    """Strategy ``name`` as one folder name (a plug-in's ``path/to/file.py:Class`` → ``path-to-file.py-Class``)."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", name).strip("-") or "strategy"


def check_name(name: str) -> str:
    """``name`` when it is a built-in strategy or a plug-in spec; else ValueError saying what is accepted."""
    if name in STRATEGIES or is_plugin(name):
        return name
    raise ValueError(f"unknown strategy {name or '(empty)'}; choose from {', '.join(names())}, or name your own "
                     "Strategy subclass as MODULE:CLASS or path/to/file.py:CLASS")
