"""The strategy interface: everything that differs between DDP, Horovod and one process lives here.

The trainer calls only these methods, so one training loop serves every strategy. A strategy owns
joining and leaving the other processes (:meth:`Strategy.connect`, :meth:`Strategy.disconnect`, or ``with
strategy:``), the joint set-up of the model and its optimizer (:meth:`Strategy.setup`), the initial
broadcast, every step's gradient work (:meth:`~Strategy.zero_grad`, :meth:`~Strategy.backward`, the
accumulation context, :meth:`~Strategy.synchronize`, :meth:`~Strategy.clip_grad_norm`,
:meth:`~Strategy.optimizer_step`) and the collectives the trainer needs for metrics.

A step, as :class:`~dpcompare.training.step.StepRunner` runs it::

    strategy.zero_grad(optimizer)
    for micro in range(accumulate):
        with strategy.accumulation_context(model, micro):      # DDP's no_sync covers forward and backward
            strategy.backward(loss(model(x), y) / accumulate, scaler)
    strategy.clip_grad_norm(model, optimizer, max_norm, scaler)  # only when clipping: synchronize, unscale, clip
    strategy.optimizer_step(optimizer, scaler)                   # synchronize (unless done), then update

A new strategy writes the six abstract methods (``connect``, ``disconnect``, ``broadcast_initial_state``,
``_do_all_reduce``, ``broadcast_buffers``, ``barrier``) and overrides what differs; the ``@final`` methods do
the shared work once (``all_reduce`` copies into float64 and calls ``_do_all_reduce``). What is not a step's
work is a part it holds (:mod:`~dpcompare.backends.parts`): ``precision`` (device, gradient scaler),
``full_state`` (checkpoints, memory), ``tracer`` (``--trace``) and ``elastic`` (``--commit-every``).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Literal, final

import torch
from torch import nn

from dpcompare import knobs
from dpcompare.backends.catalog import BASE_KNOBS, STRATEGIES
from dpcompare.backends.parts import ElasticState, FullState, Precision, Restarts, Tracer, patch, tensor_bytes
from dpcompare.config import TrainConfig
from dpcompare.errors import ConfigError, DpcompareError
from dpcompare.launch.env import LaunchEnv, detect_launch_env
from dpcompare.trace import CAT_COMM

if TYPE_CHECKING:
    from dpcompare.data.workload import ModelTraits
    from dpcompare.trace import TraceRecorder

__all__ = ["ElasticState", "ReduceOp", "Strategy", "StrategyUnavailable", "fill_missing_grads", "listed", "patch",
           "require_gpu_for_sync_bn", "sparse_bytes", "tensor_bytes", "timed_collective"]

ReduceOp = Literal["mean", "sum", "max", "min"]


class Strategy(ABC):
    """One way of running data-parallel training.

    Built-in strategies register themselves by ``name`` and take ``summary``, ``knobs``, ``communication``,
    ``distributed`` and ``sync_mechanism`` from their line in :mod:`~dpcompare.backends.catalog`; a strategy outside the
    package (``--strategy path/to/file.py:Class``) declares them here, as class attributes.
    """

    name: ClassVar[str]
    #: one line for --help and reports
    summary: ClassVar[str] = ""
    #: how gradients are synchronised, for teaching material and reports
    sync_mechanism: ClassVar[str] = ""
    #: the communication knobs (TrainConfig fields, see dpcompare.knobs) this strategy honours
    knobs: ClassVar[frozenset[str]] = BASE_KNOBS
    #: phase of the step → the communication done there (reports say which sits in a phase that differs)
    communication: ClassVar[Mapping[str, str]] = {}
    #: False only for one process with no communication (parity's reference run with the global batch)
    distributed: ClassVar[bool] = True
    #: the kinds of the parts it holds (:mod:`~dpcompare.backends.parts`): a sharding strategy gathers its full
    #: state its own way; a strategy that records its communication under ``--trace`` has its own tracer
    full_state_class: ClassVar[type[FullState]] = FullState
    tracer_class: ClassVar[type[Tracer]] = Tracer
    #: what an elastic run (--commit-every N) does: here, restarts from checkpoints; Horovod Elastic's own
    elastic_class: ClassVar[type[Restarts]] = Restarts

    def __init__(self, env: LaunchEnv | None = None, device: str = "auto", iface: str | None = None,
                 timeout_s: float = 300.0) -> None:
        self.env = env or detect_launch_env()
        self.iface = iface
        self.timeout_s = timeout_s
        self.cfg = TrainConfig()
        #: what the strategy installed (hooks, compressor, sizes) and counted, for summary.json["comm"]
        self.installed: dict[str, Any] = {}
        self.counters: dict[str, int] = {"grad_allreduces": 0, "grad_allreduce_elements": 0}
        self._synchronized = False  # this step's averaged gradients are in place (synchronize ran)
        #: what the workload's pre-check saw of the model (:meth:`configure_model`); None: not checked
        self.traits: ModelTraits | None = None
        #: the parts it holds: device and gradient scaler; full state for checkpoints; --trace's hooks; elastic runs
        self.precision = Precision(self.env, device)
        self.full_state = self.full_state_class(self)
        self.tracer = self.tracer_class(self)
        self.elastic = self.elastic_class(self)

    # -- availability ---------------------------------------------------------------------------
    @classmethod
    def check_available(cls) -> None:
        """Raise :class:`StrategyUnavailable` with an install hint when the library is missing."""
        return None  # torch's own strategies are always available

    @classmethod
    def version(cls) -> str | None:
        return None

    @classmethod
    def build_info(cls) -> dict[str, object]:
        """What ``dpcompare doctor`` shows for this strategy: installed or not, version, build options."""
        try:
            cls.check_available()
        except (StrategyUnavailable, DpcompareError) as e:
            return {"installed": False, "error": str(e)}
        return {"installed": True, "version": cls.version()}

    # -- knobs ----------------------------------------------------------------------------------
    @classmethod
    def check_config(cls, cfg: TrainConfig, world_size: int) -> None:
        """Refuse, before any process group work, a knob this strategy cannot honour or a value it cannot take.

        The base version refuses the knobs other strategies own, naming who can
        (:func:`dpcompare.knobs.refuse_unhonoured`); subclasses add their own value checks (and call this).
        """
        honours = {n: e.knobs for n, e in STRATEGIES.items()}
        knobs.refuse_unhonoured(cfg, cls.name, {**honours, cls.name: cls.knobs})
        if cfg.emulate_ranks and cls.distributed:
            raise ConfigError(f"--emulate-ranks is for one process (parity's reference), not --strategy {cls.name}")

    def configure(self, cfg: TrainConfig) -> None:
        """Take the run's knobs; called before :meth:`connect` (Horovod reads some of them at init)."""
        self.cfg = cfg

    @classmethod
    def check_model(cls, traits: ModelTraits, cfg: TrainConfig) -> None:
        """Refuse, before any process group work, a model this strategy cannot train, from what the workload's
        pre-check saw of it (unused parameters, sparse gradients...). The base version accepts every model."""
        return None

    def configure_model(self, traits: ModelTraits | None) -> None:
        """Take what the workload's pre-check saw of the model (None: not checked); called after :meth:`configure`,
        before :meth:`setup` (DDP decides ``find_unused_parameters`` from it)."""
        self.traits = traits

    def unused_parameters_note(self) -> str:
        """How this strategy treats the trainable parameters the pre-check found without a gradient (the run
        banner says it)."""
        return "each gets a zero gradient before the update, as under every strategy"

    def library(self) -> str:
        """The library that carries the gradient exchange between processes (gloo, nccl, mpi), recorded as
        ``library`` in summary.json's ``comm``: the report reads it to advise on the library's own settings."""
        return "none"

    def comm_report(self) -> dict[str, Any]:
        """What this strategy installed for gradient exchange (hooks, compressor, sizes) and counted."""
        return {**self.installed, **self.counters}

    # -- joining and leaving the other processes ----------------------------------------------------
    @abstractmethod
    def connect(self) -> None:
        """Join the other processes. After this, rank/world_size/device are valid."""

    @abstractmethod
    def disconnect(self) -> None:
        """Leave the process group. Safe to call twice."""

    def __enter__(self) -> Strategy:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.disconnect()

    # -- who am I -------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def local_size(self) -> int:
        return self.env.local_size

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        """This rank's device (:class:`~dpcompare.backends.parts.Precision` picks it on first use)."""
        return self.precision.device

    # -- the model and its optimizer ---------------------------------------------------------------
    @final
    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The model and optimizer this strategy trains: BatchNorm synchronised if ``--sync-bn``, the model on
        the device and wrapped (:meth:`wrap_model`), the optimizer wrapped (:meth:`wrap_optimizer`).

        ``optimizer`` is a fresh one (no state yet) over ``model``'s parameters; where conversion or wrapping
        replaces a parameter (FSDP's DTensor shards, Horovod's SyncBatchNorm), the optimizer is pointed at the
        new one of the same name, in the same order. A checkpoint's optimizer state is loaded afterwards
        (``full_state.load_optimizer``), then :meth:`broadcast_initial_state` runs.
        """
        names = {id(p): n for n, p in self.unwrap_model(model).named_parameters()}
        if self.cfg.sync_bn:
            model = self.convert_sync_batchnorm(model)
        model = self.wrap_model(model.to(self.device))
        _rebind(optimizer, names, dict(self.unwrap_model(model).named_parameters()))
        return model, self.wrap_optimizer(optimizer, model)

    def convert_sync_batchnorm(self, model: nn.Module) -> nn.Module:
        """Replace BatchNorm layers by this strategy's synchronised version (one process: nothing to sync)."""
        return model

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """The model as this strategy runs it (part of :meth:`setup`)."""
        return model

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The plain module under any wrapper (its state_dict has no ``module.`` prefix)."""
        return getattr(model, "module", model)

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> torch.optim.Optimizer:
        """The optimizer as this strategy steps it (part of :meth:`setup`, after :meth:`wrap_model`)."""
        return optimizer

    # -- one step's gradients ------------------------------------------------------------------------
    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """Start a step: no gradients (``set_to_none``, torch's default; Horovod's takes no arguments)."""
        self._synchronized = False
        optimizer.zero_grad()

    def accumulation_context(self, model: nn.Module, micro_step: int) -> contextlib.AbstractContextManager[Any]:
        """Context for the forward and backward of micro-batch ``micro_step`` (0-based) of ``cfg.accumulate``.

        Gradients are summed locally over the micro-batches and exchanged once, after the last one.
        """
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, scaler: Any = None) -> None:
        """Gradients of ``loss`` (scaled by the gradient scaler when there is one) added to each ``.grad``."""
        (scaler.scale(loss) if scaler is not None else loss).backward()

    def synchronize(self, optimizer: torch.optim.Optimizer) -> None:
        """Finish the gradient exchange: afterwards every parameter's ``.grad`` holds its averaged gradient
        (or, sharded, this rank's shard of it). Here nothing: the exchange ran inside backward.

        Not called directly: :meth:`ensure_synchronized` runs it once per step, before anything reads the
        gradients (:meth:`clip_grad_norm`, the gradient scaler, :meth:`optimizer_step`).
        """
        return None

    @final
    def ensure_synchronized(self, optimizer: torch.optim.Optimizer) -> None:
        """:meth:`synchronize`, unless it already ran in this step; then every trainable parameter left without a
        gradient gets a zero one (:func:`fill_missing_grads`), so that every strategy updates alike."""
        if not self._synchronized:
            self.synchronize(optimizer)
            fill_missing_grads(optimizer)
            self._synchronized = True

    def clip_grad_norm(self, model: nn.Module, optimizer: torch.optim.Optimizer, max_norm: float,
                       scaler: Any = None) -> float:
        """Scale the averaged gradients so that their global 2-norm is at most ``max_norm``; the norm before.

        Synchronises first (Horovod's all-reduces land in ``.grad`` there) and unscales the gradient scaler's
        gradients; the norm is over every parameter of the whole model on every rank (a DTensor's shards
        included, :meth:`global_grad_norm`), so every rank clips by the same factor, ``max_norm / (norm +
        1e-6)`` when below 1 (torch's ``clip_grad_norm_`` formula). Call it between the last backward and
        :meth:`optimizer_step`.
        """
        self.ensure_synchronized(optimizer)
        if scaler is not None:
            scaler.unscale_(optimizer)
        grads = [p.grad for p in self.unwrap_model(model).parameters() if p.grad is not None]
        norm = self.global_grad_norm(grads)
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            for g in grads:
                _local(g).mul_(coef)
        return norm

    @final
    def global_grad_norm(self, grads: list[torch.Tensor]) -> float:
        """The 2-norm of every gradient in ``grads`` together, summed in float64: a sharded DTensor's squares
        are added up on each rank and all-reduced once (its shards cover the whole tensor over the ranks).

        float64 makes the norm independent of how the tensors are cut: torch's own ``clip_grad_norm_`` takes
        float32 norms per shard, which differ from the whole tensor's in the last bits, so FSDP would clip by
        another factor than DDP. Here the sums differ by about 1e-16 and the float32 gradients get the same
        factor.
        """
        # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
        from torch.distributed.tensor import DTensor

        whole = torch.zeros((), dtype=torch.float64)
        sharded = torch.zeros((), dtype=torch.float64)
        for g in grads:
            sq = torch.linalg.vector_norm(_local(g), dtype=torch.float64).cpu() ** 2
            if isinstance(g, DTensor) and any(p.is_shard() for p in g.placements):
                sharded += sq
            else:
                whole += sq
        if any(isinstance(g, DTensor) for g in grads):
            whole += self.all_reduce(sharded, "sum")
        return float(whole.sqrt())

    @final
    def optimizer_step(self, optimizer: torch.optim.Optimizer, scaler: Any = None) -> None:
        """One optimizer step on the averaged gradients: :meth:`synchronize` unless it already ran (after
        :meth:`clip_grad_norm`), then :meth:`update`."""
        self.ensure_synchronized(optimizer)
        self.update(optimizer, scaler)
        self._synchronized = False

    def update(self, optimizer: torch.optim.Optimizer, scaler: Any = None) -> None:
        """Apply the synchronised gradients (through the gradient scaler when there is one)."""
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()

    @abstractmethod
    def broadcast_initial_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Make every rank start from rank 0's parameters, buffers and (if any) optimizer state.

        Optimizer state is broadcast only when it exists (after a resume): broadcasting a fresh
        optimizer's state would take an optimizer step on some libraries (see shared NOTES).
        """

    # -- evaluation (the full state for checkpoints and memory: the part ``full_state``) ---------------
    @contextmanager
    def evaluating(self, model: nn.Module) -> Iterator[nn.Module]:
        """The module each rank evaluates its share of the test set with (no collectives in its forward)."""
        yield self.unwrap_model(model)

    # -- collectives (every strategy implements them; `single` holds the one-process versions) ----------
    @final
    def all_reduce(self, value: torch.Tensor | float, op: ReduceOp = "mean") -> torch.Tensor:
        """Reduce over ranks; returns a new CPU float64 tensor (the input is not modified): the copy is made
        here, once, and :meth:`_do_all_reduce` reduces it."""
        t = torch.as_tensor(value, dtype=torch.float64).detach().clone().cpu()
        return self._do_all_reduce(t, op).cpu()

    @abstractmethod
    def _do_all_reduce(self, t: torch.Tensor, op: ReduceOp) -> torch.Tensor:
        """Reduce ``t`` (a float64 CPU tensor of this rank's own, free to change) over ranks; the result."""

    @final
    def all_gather_floats(self, values: list[float]) -> list[list[float]]:
        """Every rank's list of floats (same length on each rank), indexed by rank."""
        table = torch.zeros(self.world_size, len(values), dtype=torch.float64)
        table[self.rank] = torch.tensor(values, dtype=torch.float64)
        return self.all_reduce(table, "sum").tolist()

    @abstractmethod
    def broadcast_buffers(self, model: nn.Module) -> None:
        """Copy rank 0's buffers (BatchNorm running statistics) to every rank."""

    @abstractmethod
    def barrier(self) -> None:
        """Wait for every rank."""

    @final
    def gather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's bytes, indexed by rank (built on :meth:`all_reduce`, so every strategy has it)."""
        sizes = [int(n) for (n,) in self.all_gather_floats([float(len(data))])]
        table = torch.zeros(self.world_size, max(sizes, default=0), dtype=torch.float64)
        table[self.rank, :len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.float64)
        table = self.all_reduce(table, "sum") if self.world_size > 1 else table
        return [bytes(table[r, :n].to(torch.uint8).tolist()) for r, n in enumerate(sizes)]


def fill_missing_grads(optimizer: torch.optim.Optimizer) -> None:
    """A zero gradient for every trainable parameter of ``optimizer`` that has none after the exchange.

    Horovod's ``synchronize()`` does this itself (it all-reduces a zero gradient for each parameter whose hook did
    not fire, since another rank may have used it), while DDP leaves a parameter that no rank used at ``None``,
    and optimizers skip ``None`` but not zero: under weight decay a zero gradient still moves the weight, and Adam
    still counts the step. One rule for every strategy keeps them computing the same thing: a trainable parameter
    without a gradient has a zero gradient. Frozen parameters (``requires_grad=False``) are left alone.
    """
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is None and p.requires_grad:
                p.grad = torch.zeros_like(p)


def timed_collective(recorder: TraceRecorder, run: Callable[[], Any], name: str, collective: str, nbytes: int,
                     tid: int) -> Callable[[], Any]:
    """``run`` that records itself as a blocking collective span (``bytes``, ``collective``) on lane ``tid``."""
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = recorder.now()
        try:
            return run(*args, **kwargs)
        finally:
            recorder.span(name, CAT_COMM, t0, recorder.now(), tid=tid, bytes=nbytes, collective=collective,
                          blocking=True)

    return timed


def sparse_bytes(t: torch.Tensor) -> int:
    """Bytes a sparse COO tensor holds: its indices and its values."""
    return t._indices().numel() * t._indices().element_size() + t._values().numel() * t._values().element_size()


def listed(names: Iterable[str], most: int = 4) -> str:
    """``a, b, c, d and 2 more``: parameter names for a one-line message."""
    names = list(names)
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _rebind(optimizer: torch.optim.Optimizer, names: dict[int, str], now: dict[str, nn.Parameter]) -> None:
    """Point ``optimizer`` at the parameters the model holds ``now`` (name → parameter), where set-up replaced
    one (``names``: id of each original parameter → its name)."""
    for group in optimizer.param_groups:
        fresh = [now.get(names.get(id(p), ""), p) for p in group["params"]]
        if any(a is not b for a, b in zip(fresh, group["params"], strict=True)):
            if optimizer.state:
                raise ValueError("Strategy.setup needs a fresh optimizer: load its state after set-up")
            group["params"] = fresh


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (the same storage); another tensor as it is."""
    # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def require_gpu_for_sync_bn(device: torch.device, cls_name: str) -> None:
    if device.type != "cuda":
        raise ConfigError(f"--sync-bn uses {cls_name}, which runs on GPUs only; drop --sync-bn on CPU "
                          "(or use a model without BatchNorm, such as mlp)")


class StrategyUnavailable(Exception):
    """The strategy's library is missing; the message says how to install it."""
