"""The parts a :class:`~dpcompare.backends.base.Strategy` holds, each built once in its ``__init__``:

- :class:`Precision` (``strategy.precision``): the device this rank computes on (``--device``) and the gradient
  scaler (``--amp fp16`` on a GPU);
- :class:`FullState` (``strategy.full_state``): the plain state of the model and the optimizer, for checkpoints
  and the memory figures (a sharding strategy gathers it: ZeRO and FSDP hold their own kind);
- :class:`Tracer` (``strategy.tracer``): ``--trace``, what is hooked and patched while the traced steps run and
  undone after (a strategy that records its communication holds its own kind);
- :class:`Restarts` (``strategy.elastic``): what an elastic run (``--commit-every N``) does, a checkpoint per
  commit and a restart from it (Horovod Elastic holds its own kind, rolling back in memory).

A strategy chooses the kind of a part by a class attribute (``full_state_class``, ``tracer_class``,
``elastic_class``); a part
reads what it needs (rank, device, settings) from the strategy it belongs to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch
from torch import nn

from dpcompare.errors import ConfigError
from dpcompare.launch.env import LaunchEnv
from dpcompare.trace import CAT_GRAD

if TYPE_CHECKING:
    from dpcompare.config import TrainConfig
    from dpcompare.trace import TraceRecorder


class Holder(Protocol):
    """What a part reads of the strategy that holds it (:class:`~dpcompare.backends.base.Strategy`; this module
    is below it and never imports it)."""

    cfg: TrainConfig
    timeout_s: float

    @property
    def world_size(self) -> int: ...

    @property
    def is_main(self) -> bool: ...

    def unwrap_model(self, model: nn.Module) -> nn.Module: ...

    def broadcast_initial_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None: ...


T = TypeVar("T")


class ElasticState(Protocol):
    """What an elastic run keeps besides the model and the optimizer: the training loop's progress, as plain
    values (step, epoch, position in the epoch, history), and what it redoes when the world changes."""

    def progress(self) -> dict[str, Any]:
        """The loop's position now, as plain values (committed, broadcast, restored)."""
        ...

    def resume_from(self, progress: dict[str, Any]) -> None:
        """Continue from ``progress`` (a committed one after a rollback, or rank 0's after a sync)."""
        ...

    def on_reset(self) -> None:
        """The world changed (ranks lost or added): lay out the data and the learning rate for the new size."""
        ...


class Restarts:
    """An elastic run (``--commit-every N``) as under torchrun: nothing survives inside the process; the launcher
    restarts every process with the survivors and each resumes from the newest checkpoint (``--resume auto``),
    which :meth:`commit` wrote. Horovod Elastic holds its own kind: the survivors roll back in memory."""

    def __init__(self, strategy: Holder) -> None:
        self.strategy = strategy

    def run(self, body: Callable[[], T], model: nn.Module, optimizer: torch.optim.Optimizer,
            state: ElasticState) -> T:
        """Start every rank from rank 0's state and run ``body`` (the epochs) so that a lost host costs only the
        steps since the last :meth:`commit`."""
        self.strategy.broadcast_initial_state(model, optimizer)
        return body()

    def commit(self, save: Callable[[], object]) -> None:
        """Keep the training state so that a lost host costs only the steps after this one: here a checkpoint
        (``save`` writes it: a restarted process resumes from it)."""
        save()


class Precision:
    """Where and in what precision this rank computes: its device (``auto``: this rank's GPU when torch sees one,
    picked on first use) and the gradient scaler fp16 autocast needs on a GPU."""

    def __init__(self, env: LaunchEnv, requested: str = "auto") -> None:
        self.env, self.requested = env, requested
        self._device: torch.device | None = None

    @property
    def device(self) -> torch.device:
        if self._device is None:
            self._device = self._pick()
        return self._device

    def _pick(self) -> torch.device:
        want = self.requested
        if want == "auto":
            want = "cuda" if torch.cuda.is_available() else "cpu"
        if want == "cuda":
            if not torch.cuda.is_available():
                raise ConfigError("--device cuda but torch sees no GPU; use --device cpu")
            dev = torch.device("cuda", self.env.local_rank % torch.cuda.device_count())
            torch.cuda.set_device(dev)
            return dev
        return torch.device(want)

    def grad_scaler(self, amp: str) -> Any:
        """A gradient scaler for fp16 autocast on a GPU (``amp``: ``--amp``), else None."""
        if amp == "fp16" and self.device.type == "cuda":
            return torch.amp.GradScaler("cuda")
        return None


class FullState:
    """The plain state of a replicated model and optimizer (every rank holds all of it)."""

    def __init__(self, strategy: Holder) -> None:
        self.strategy = strategy

    def dicts(self, model: nn.Module, optimizer: torch.optim.Optimizer
              ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The plain model state_dict and the plain ``torch.optim`` optimizer state (param ids 0..n-1).

        Called on every rank (sharding strategies gather here); only rank 0's result is complete.
        """
        from dpcompare.checkpoint import plain_state_dict  # here, not at the top: it loads numpy

        return plain_state_dict(self.strategy.unwrap_model(model).state_dict()), optimizer.state_dict()

    def load_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load a plain optimizer state (as :meth:`dicts` returns it) on every rank, after set-up (the model's
        weights were loaded into the plain module before it)."""
        optimizer.load_state_dict(state)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> Iterable[dict[str, Any]]:
        """The optimizer state this rank holds, one dict per parameter."""
        return optimizer.state.values()

    def memory_bytes(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
        """Bytes of parameters, gradients and optimizer state held by this rank (local shards only)."""
        params = list(self.strategy.unwrap_model(model).parameters())
        state = [v for s in self.optimizer_state(optimizer) if s for v in s.values()]
        return {"params": tensor_bytes(params), "grads": tensor_bytes(p.grad for p in params),
                "optimizer_state": tensor_bytes(state)}


class Tracer:
    """``--trace``: a tick when each parameter's gradient is ready; a strategy's own kind adds its communication
    (calling this one's :meth:`start` and :meth:`stop`). Nothing is hooked while not tracing."""

    def __init__(self, strategy: Holder) -> None:
        self.strategy = strategy
        self.on = False  # prepared: tracing was asked for before connecting (a library told at init is told)
        self.recorder: TraceRecorder | None = None  # while the traced steps run
        self._handles: list[Any] = []
        self._undo: list[Callable[[], None]] = []

    def prepare(self, folder: Path) -> None:
        """Called before the strategy connects when tracing is on."""
        self.on = True

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer, recorder: TraceRecorder) -> None:
        """Start recording into ``recorder``."""
        def ready(name: str) -> Callable[[torch.Tensor], None]:
            return lambda p: recorder.tick(name, CAT_GRAD, recorder.now(), bytes=p.numel() * p.element_size())

        self.recorder = recorder
        module = self.strategy.unwrap_model(model)
        self._handles = [p.register_post_accumulate_grad_hook(ready(n))
                         for n, p in module.named_parameters() if p.requires_grad]
        recorder.events.append({"name": "model_buffers", "ph": "M", "pid": recorder.rank,  # for dpcompare predict
                                "args": {"bytes": tensor_bytes(module.buffers())}})

    def patch(self, obj: object, name: str, value: Any) -> None:
        """``obj.name = value`` until :meth:`stop` (e.g. a method timed for the traced steps)."""
        self._undo.append(patch(obj, name, value))

    def undo_at_stop(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` at :meth:`stop` (a :func:`patch` made elsewhere)."""
        self._undo.append(undo)

    def stop(self) -> None:
        """Stop recording: remove every hook and undo every :meth:`patch`."""
        for h in self._handles:
            h.remove()
        self._handles = []
        for undo in reversed(self._undo):
            undo()
        self._undo = []
        self.recorder = None

    def library_events(self, recorder: TraceRecorder,
                       steps: list[tuple[float, float]]) -> tuple[list[dict[str, Any]], list[str]]:
        """On rank 0 after the run: events the library recorded itself during ``steps`` (start, end on the
        recorder's clock), converted to that clock, and notes. Most strategies have none."""
        return [], []


def patch(obj: object, name: str, value: Any) -> Callable[[], None]:
    """Set ``obj.name = value`` on the instance (tracing wraps a method for the traced steps only); return
    what restores the attribute as it was."""
    had, old = name in vars(obj), vars(obj).get(name)
    setattr(obj, name, value)

    def undo() -> None:
        if had:
            setattr(obj, name, old)
        elif name in vars(obj):
            delattr(obj, name)  # the class's attribute again

    return undo


def tensor_bytes(tensors: Iterable[object]) -> int:
    """Bytes held on this rank by the tensors in ``tensors`` (a DTensor counts its local shard; others skipped)."""
    # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        if isinstance(t, DTensor):
            t = t.to_local()
        if isinstance(t, torch.Tensor):
            total += t.numel() * t.element_size()
    return total
