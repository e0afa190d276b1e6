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
from dpcompare.versions import docs_page

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
    #: how it synchronises the gradients, one line (results.json's ``sync_mechanism``, the report's list)
    sync_mechanism: str = ""
    #: the report's card ("Why the phases differ"): a title and an HTML paragraph saying where its hooks sit and
    #: in which phase the waiting is counted; None: the report shows ``sync_mechanism`` (or the summary)
    card: tuple[str, str] | None = None
    #: the paragraph its elastic mode's card adds (``ddp-elastic``)
    elastic_card: str = ""
    #: its library's own threads, in words, for the report's "what took the cores" ("" : none to name)
    threads: str = ""
    #: what ``dpcompare doctor`` says to do when its library is missing (``{torch}``: torch's version); "": the
    #: error its ``check_available`` raised
    install: str = ""
    #: its processes must be started by mpirun or srun (Horovod's controller joins their ranks); False: it joins
    #: any launcher's processes through the rendezvous variables (``submit --local`` starts its own tasks)
    mpi_started: bool = False


#: what DDP's model hooks take (``ddp`` and ``zero``); FSDP2 runs no DDP comm hooks and no buckets
DDP_KNOBS = frozenset({"accumulate", "amp", "grad_compression", "bucket_mb", "powersgd_rank", "static_graph",
                       "find_unused_parameters"})


#: the report's cards, the elastic modes' paragraphs and doctor's install hints (:attr:`Entry.card` and the rest)
_DDP_CARD = (
    "PyTorch DDP: hooks on the model",
    "<code>DistributedDataParallel</code> wraps the <em>model</em>. An autograd hook on every parameter all-reduces a "
    "bucket (25&nbsp;MB by default) asynchronously as soon as its gradients are ready during "
    "<code>loss.backward()</code>, while autograd computes the earlier layers' gradients. <code>backward()</code> "
    "returns only when every bucket is reduced: the communication that did not overlap is counted in "
    "<strong>backward</strong>, and <code>optimizer.step()</code> is a local update. With buffers (BatchNorm "
    "statistics) DDP also broadcasts rank 0's buffers at the start of every <strong>forward</strong>. gloo runs the "
    "collectives on its own threads.")
_HOROVOD_CARD = (
    "Horovod: hooks in the optimizer",
    "<code>hvd.DistributedOptimizer</code> wraps the <em>optimizer</em>. Per-parameter hooks enqueue an asynchronous "
    "all-reduce when a gradient is ready; Horovod's <em>background thread</em> negotiates which tensors are ready on "
    "every rank and fuses them (tensor fusion, 128&nbsp;MB, every HOROVOD_CYCLE_TIME). <code>backward()</code> returns "
    "without waiting; <code>optimizer.step()</code> calls <code>synchronize()</code> first, so the waiting is counted "
    "in <strong>optimizer</strong>. The background thread runs all the time, polling every cycle: on a machine with "
    "few cores it competes with the compute of every phase, the forward included.")
_ZERO_CARD = (
    "ZeRO-1: DDP, then a sharded update",
    "DDP's hooks on the model (bucketed all-reduce in <strong>backward</strong>, buffers broadcast in forward), with "
    "torch's <code>ZeroRedundancyOptimizer</code>: each rank keeps the optimizer state of its shard of the parameters, "
    "updates only that shard and broadcasts it to the others, a collective counted in <strong>optimizer</strong>.")
_FSDP_CARD = (
    "FSDP2: parameters gathered per layer",
    "<code>fully_shard</code> on each layer and the root: parameters, gradients and optimizer state are sharded. Each "
    "layer's parameters are all-gathered before its <strong>forward</strong> and again in <strong>backward</strong>, "
    "where its gradients are reduce-scattered; the optimizer updates the local shards without communicating.")
_SINGLE_CARD = ("One process: no communication",
                "The baseline: one process with the global batch, nothing communicated; every phase is compute.")
_HOROVOD_INSTALL = (
    "module load your site's Horovod built for this torch, or build Horovod 0.28.1 into this environment with "
    "`make setup` (the checkout's .venv) or `DPCOMPARE_VENV=$VIRTUAL_ENV bash scripts/setup.sh` from a dpcompare "
    "checkout (it keeps torch and applies the "
    "C++17 patch torch>=2.1 needs); see " + docs_page("install"))
GLOO_THREADS = "gloo's threads"

STRATEGIES: dict[str, Entry] = {
    "ddp": Entry(
        "dpcompare.backends.ddp:DDPStrategy", "torch DistributedDataParallel (gloo on CPU, nccl on CUDA)",
        {"forward": "broadcast of rank 0's buffers (BatchNorm statistics) at the start of every forward "
                    "(broadcast_buffers=True)" + IF_BUFFERS,
         "backward": "bucketed all-reduce of the gradients, started from hooks on the model as each bucket "
                     "fills; whatever backward's remaining computation does not hide is waited for here"},
        knobs=DDP_KNOBS, schedule="dpcompare.prediction.ddp:DDPSchedule", elastic="torchrun",
        sync_mechanism=("model hooks: per-parameter autograd hooks fill buckets that are all-reduced during "
                        "backward(), overlapping communication with computation"),
        card=_DDP_CARD, threads=GLOO_THREADS,
        elastic_card=("Elastic (torchrun): every process is restarted with the survivors when a host is lost, and "
                      "resumes from the newest checkpoint (written every --commit-every steps).")),
    "fsdp": Entry(
        "dpcompare.backends.fsdp:FSDPStrategy",
        "FSDP2 fully_shard per layer and the root (parameters, gradients, optimizer state sharded)",
        {"forward": "all-gather of each layer's parameter shards before its forward",
         "backward": "all-gather of each layer's parameters again, and reduce-scatter of its gradients"},
        schedule="dpcompare.prediction.fsdp:FSDPSchedule",
        sync_mechanism=("sharded everything: each layer's parameters are all-gathered before its forward and "
                        "backward; its gradients are reduce-scattered, so each process updates only its shard"),
        card=_FSDP_CARD, threads=GLOO_THREADS),
    "horovod": Entry(
        "dpcompare.backends.horovod:HorovodStrategy", "Horovod DistributedOptimizer (MPI or gloo controller)",
        {"backward": "all-reduces enqueued from hooks in the optimizer as gradients are ready; Horovod's "
                     "background thread negotiates, fuses and reduces them (nothing is waited for here)",
         "optimizer": "step() waits for the fused all-reduces (synchronize()) before it updates"},
        knobs=frozenset({"accumulate", "amp", "grad_compression", "bucket_mb", "horovod_cycle_ms", "horovod_ops",
                         "mpi_allreduce", "adasum"}),
        schedule="dpcompare.prediction.horovod:HorovodSchedule", elastic="horovodrun",
        sync_mechanism=("optimizer hooks: per-parameter hooks enqueue all-reduces that Horovod's background thread "
                        "fuses; optimizer.step() waits for them (synchronize) before updating"),
        card=_HOROVOD_CARD, threads="Horovod's background thread", install=_HOROVOD_INSTALL, mpi_started=True,
        elastic_card=("Elastic (horovodrun, gloo controller): the surviving processes stay, roll back to their last "
                      "in-memory commit (every --commit-every steps) and carry on at the smaller world size.")),
    "single": Entry("dpcompare.backends.single:SingleStrategy", "one process, no communication (the baseline)",
                    distributed=False, sync_mechanism="none: one process holds every gradient", card=_SINGLE_CARD),
    "zero": Entry(
        "dpcompare.backends.zero:ZeroStrategy",
        "ZeRO-1: DDP + torch ZeroRedundancyOptimizer (optimizer state sharded over processes)",
        {"forward": "DDP's buffer broadcast" + IF_BUFFERS,
         "backward": "DDP's bucketed gradient all-reduce",
         "optimizer": "each rank updates its shard of the parameters, then broadcasts it to the others"},
        knobs=DDP_KNOBS, schedule="dpcompare.prediction.zero:ZeroSchedule",
        sync_mechanism=("model hooks all-reduce gradients as in ddp; each process updates only its shard of the "
                        "parameters (holding only that shard's optimizer state), then broadcasts it to the others"),
        card=_ZERO_CARD, threads=GLOO_THREADS),
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


def mpi_started(name: str) -> bool:
    """Whether strategy ``name`` needs its processes started by mpirun or srun (:attr:`Entry.mpi_started`); a
    plug-in joins through the rendezvous variables as the torch.distributed strategies do."""
    entry = STRATEGIES.get(name)
    return bool(entry and entry.mpi_started)



def folder(name: str) -> str:
    """Strategy ``name`` as one folder name (a plug-in's ``path/to/file.py:Class`` → ``path-to-file.py-Class``)."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", name).strip("-") or "strategy"


def check_name(name: str) -> str:
    """``name`` when it is a built-in strategy or a plug-in spec; else ValueError saying what is accepted."""
    if name in STRATEGIES or is_plugin(name):
        return name
    raise ValueError(f"unknown strategy {name or '(empty)'}; choose from {', '.join(names())}, or name your own "
                     "Strategy subclass as MODULE:CLASS or path/to/file.py:CLASS")
