"""Horovod: gradients are synchronised by hooks in the *optimizer*.

``hvd.DistributedOptimizer`` registers a hook per parameter that enqueues an asynchronous
all-reduce as soon as its gradient is ready; Horovod's background thread negotiates which tensors
every rank has ready and fuses them into one buffer (``HOROVOD_FUSION_THRESHOLD``) per cycle
(``HOROVOD_CYCLE_TIME``). ``synchronize()`` waits for every outstanding all-reduce (dpcompare calls
it before anything reads the gradients: clipping, the gradient scaler, the update), and the update then
runs inside ``skip_synchronize()``. The model is not wrapped.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from dpcompare import trace as tr
from dpcompare.backends.base import ReduceOp, Strategy, StrategyUnavailable, require_gpu_for_sync_bn
from dpcompare.backends.catalog import STRATEGIES
from dpcompare.backends.horovod_elastic import HorovodElastic
from dpcompare.backends.horovod_timeline import horovod_timeline_events
from dpcompare.backends.horovod_watch import HandleWatcher
from dpcompare.backends.parts import Tracer
from dpcompare.errors import ConfigError, LaunchError
from dpcompare.launch.env import comm_thread_cores
from dpcompare.launch.openmpi import YIELD_VAR, mpi_allreduce_mca

if TYPE_CHECKING:
    from dpcompare.config import TrainConfig

T = TypeVar("T")

TIMELINE_FILE = "horovod_timeline.json"

#: the one install advice for Horovod is its catalog entry's (doctor shows the same)
INSTALL_HINT = ("--strategy horovod needs Horovod, which is not installed in this Python: "
                + STRATEGIES["horovod"].install)


#: the variables Horovod reads at init that dpcompare's knobs set (recorded in summary.json's comm)
HOROVOD_VARS = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_CPU_OPERATIONS",
                "HOROVOD_THREAD_AFFINITY")


def mpi_allreduce_env(algorithm: str) -> dict[str, str]:
    """:func:`~dpcompare.launch.openmpi.mpi_allreduce_mca` as environment variables (Open MPI reads them at
    MPI_Init)."""
    return {f"OMPI_MCA_{k}": v for k, v in mpi_allreduce_mca(algorithm).items()}


def _hvd() -> Any:
    import horovod.torch as hvd  # optional: Horovod may not be installed

    return hvd


class HorovodTracer(Tracer):
    """The all-reduces from their handles (or Horovod's own timeline, with ``HOROVOD_TIMELINE=DYNAMIC``) and the
    wait inside ``step()``."""

    strategy: HorovodStrategy

    def __init__(self, strategy: HorovodStrategy) -> None:
        super().__init__(strategy)
        self.timeline: Path | None = None  # where Horovod writes its timeline, when asked for
        self.timeline_on = False  # Horovod is writing it now
        self.watcher: HandleWatcher | None = None  # the handles' watcher while tracing without a timeline

    def prepare(self, folder: Path) -> None:
        """Horovod's timeline only when the user asks for it with ``HOROVOD_TIMELINE=DYNAMIC``: it must be set
        before init, and then its writer thread spins on rank 0 for the whole run, slowing every step
        (:mod:`dpcompare.backends.horovod_watch` says more). Otherwise the handles are watched."""
        super().prepare(folder)
        if os.environ.get("HOROVOD_TIMELINE") == "DYNAMIC":
            self.timeline = Path(folder) / TIMELINE_FILE

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer, recorder: tr.TraceRecorder) -> None:
        super().start(model, optimizer, recorder)
        s, self.timeline_on = self.strategy, False
        if s.world_size == 1:  # DistributedOptimizer registers no hooks at size 1: no all-reduce, no wait
            return
        if self.timeline is not None:
            try:
                s._hvd.start_timeline(str(self.timeline.resolve()), mark_cycles=False)
                self.timeline_on = True
            except ValueError as e:
                recorder.notes.append(f"Horovod's timeline is not traced: {e}")
        self.watcher = None if self.timeline is not None else HandleWatcher(recorder, s._hvd.poll)
        if self.watcher is not None:
            self.patch(optimizer, "_allreduce_grad_async", self._watched(optimizer, self.watcher))
        wait, watcher = optimizer.synchronize, self.watcher  # type: ignore[attr-defined]

        def synchronize() -> None:
            t0 = recorder.now()
            if watcher is not None:
                watcher.wait_idle(s.timeout_s)
            wait()
            recorder.span("wait in step()", tr.CAT_WAIT, t0, recorder.now(), tid=tr.LANE_PHASES)

        self.patch(optimizer, "synchronize", synchronize)

    def _watched(self, optimizer: torch.optim.Optimizer, watcher: HandleWatcher) -> Callable[[torch.Tensor], Any]:
        """The optimizer's ``_allreduce_grad_async``, telling ``watcher`` of each handle it starts."""
        send, names = optimizer._allreduce_grad_async, optimizer._parameter_names  # type: ignore[attr-defined]
        wire = 2 if self.strategy.cfg.grad_compression in ("fp16", "bf16") else None
        world = self.strategy.world_size

        def allreduce_grad_async(p: torch.Tensor) -> Any:
            handle, ctx = send(p)
            g = p.grad if p.grad is not None else p
            if callable(handle):  # a sparse gradient: all-gathers of its indices and values
                _watch_sparse(watcher, handle, names.get(p, "?"), g, world)
            else:
                watcher.enqueued(handle, names.get(p, "?"), g.numel() * (wire or g.element_size()))
            return handle, ctx

        return allreduce_grad_async

    def stop(self) -> None:
        if self.timeline_on:
            self.strategy._hvd.stop_timeline()
            self.timeline_on = False
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher.recorder.events.extend(self.watcher.events())
            self.watcher = None
        super().stop()

    def library_events(self, recorder: tr.TraceRecorder,
                       steps: list[tuple[float, float]]) -> tuple[list[dict[str, Any]], list[str]]:
        path = self.timeline
        if path is None:
            return [], []
        if not path.is_file():
            return [], [f"Horovod wrote no timeline ({path})"]
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            return [], [f"Horovod's timeline {path} could not be read ({e})"]
        return horovod_timeline_events(raw, recorder.rank, steps), [
            "HOROVOD_TIMELINE=DYNAMIC: Horovod's timeline writer spins on rank 0 for the whole run, which slows "
            "every step (not only the traced ones)"]


class HorovodStrategy(Strategy):
    name = "horovod"
    tracer_class = HorovodTracer
    elastic_class = HorovodElastic

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hvd: Any = None  # horovod.torch, once connected

    @classmethod
    def check_config(cls, cfg: TrainConfig, world_size: int) -> None:
        super().check_config(cfg, world_size)
        if cfg.adasum and world_size & (world_size - 1):
            raise ConfigError(f"--adasum needs a power-of-two number of processes (Horovod supports no other), not "
                              f"{world_size}; use -np {1 << (world_size.bit_length() - 1)} or "
                              f"{1 << world_size.bit_length()}, or drop --adasum")
        if cfg.adasum and cfg.clip_grad_norm:
            raise ConfigError("--clip-grad-norm needs averaged gradients, which --adasum never forms (each rank takes "
                              "its own step and Adasum combines the steps); drop one of the two")
        if cfg.grad_compression == "bf16" and not _allreduces_bf16():
            raise ConfigError(f"--grad-compression bf16: Horovod {cls.version()}'s torch binding cannot all-reduce "
                              "bfloat16 tensors; only --strategy ddp can (fp16 works under both)")
        gloo_controller = _gloo_controller()
        if cfg.horovod_ops == "gloo" and not gloo_controller:
            raise ConfigError("--horovod-ops gloo needs Horovod's gloo controller: launch with `horovodrun --gloo "
                              "-np N dpcompare train ...` (under mpirun Horovod's gloo operations crash)")
        if cfg.mpi_allreduce != "default" and (gloo_controller or cfg.horovod_ops == "gloo"):
            raise ConfigError(f"--mpi-allreduce {cfg.mpi_allreduce} chooses Open MPI's all-reduce, but this run's "
                              "all-reduces go through gloo: launch with mpirun and drop --horovod-ops gloo, or drop "
                              "--mpi-allreduce")
        if cfg.horovod_ops == "mpi" and gloo_controller:
            raise ConfigError("--horovod-ops mpi needs Horovod's MPI controller: launch with mpirun (or horovodrun "
                              "--mpi), not horovodrun --gloo")

    def configure(self, cfg: TrainConfig) -> None:
        """Horovod reads its fusion threshold, cycle time, CPU operations and where its background thread runs
        (``HOROVOD_THREAD_AFFINITY``, set here under ``--bind comm`` unless the user set it) from the environment
        at init."""
        super().configure(cfg)
        if cfg.bucket_mb:
            os.environ["HOROVOD_FUSION_THRESHOLD"] = str(int(cfg.bucket_mb * 1024 * 1024))
        if cfg.horovod_cycle_ms:
            os.environ["HOROVOD_CYCLE_TIME"] = f"{cfg.horovod_cycle_ms:g}"
        if cfg.horovod_ops != "default":
            os.environ["HOROVOD_CPU_OPERATIONS"] = cfg.horovod_ops
        if cfg.mpi_allreduce != "default":  # Open MPI reads its MCA parameters from the environment at MPI_Init
            os.environ.update(mpi_allreduce_env(cfg.mpi_allreduce))
        pinned = comm_thread_cores(self.env)  # --bind comm: the background thread on a core of its own
        if pinned and "HOROVOD_THREAD_AFFINITY" not in os.environ:
            os.environ["HOROVOD_THREAD_AFFINITY"] = pinned
        if _gloo_controller():  # a collective waits --timeout for a lost peer, as DDP's do (Horovod's default: 30 s)
            os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(max(1, round(cfg.timeout))))

    @classmethod
    def check_available(cls) -> None:
        try:
            _hvd()
        except ImportError as e:
            raise StrategyUnavailable(f"{INSTALL_HINT} ({e})") from None

    @classmethod
    def version(cls) -> str | None:
        try:
            return metadata.version("horovod")
        except metadata.PackageNotFoundError:
            return None

    @classmethod
    def build_info(cls) -> dict[str, object]:
        """Horovod's build, as ``horovodrun --check-build`` shows it."""
        info = super().build_info()
        if not info["installed"]:
            return info
        hvd = _hvd()
        info["controllers"] = {"MPI": bool(hvd.mpi_built()), "Gloo": bool(hvd.gloo_built())}
        info["tensor_operations"] = {name: bool(fn()) for name, fn in (
            ("NCCL", hvd.nccl_built), ("DDL", hvd.ddl_built), ("CCL", hvd.ccl_built), ("MPI", hvd.mpi_built),
            ("Gloo", hvd.gloo_built))}
        info["cuda_built"] = bool(hvd.cuda_built())
        return info

    def connect(self) -> None:
        hvd = _hvd()
        # torch.optim imports torch._dynamo on first use, about 2 s of CPU. Import it before hvd.init():
        # Horovod's background thread cycles even while idle and, on 2 cores, stretched that import to 3.5 s.
        importlib.import_module("torch._dynamo")
        hvd.init()
        if hvd.size() != self.env.world_size or hvd.rank() != self.env.rank:
            raise LaunchError(f"Horovod sees rank {hvd.rank()} of {hvd.size()} but {self.env.launcher} says "
                              f"{self.env.rank} of {self.env.world_size}; launch with mpirun/srun/horovodrun")
        self._hvd = hvd

    def library(self) -> str:
        """Horovod's tensor operations: NCCL on GPUs; on CPUs gloo under its gloo controller or with
        ``--horovod-ops gloo``, else MPI."""
        if self.device.type == "cuda":
            return "nccl"
        return "gloo" if _gloo_controller() or self.cfg.horovod_ops == "gloo" else "mpi"

    def disconnect(self) -> None:
        hvd = self._hvd
        if hvd is not None and hvd.is_initialized():
            hvd.shutdown()

    def convert_sync_batchnorm(self, model: nn.Module) -> nn.Module:
        require_gpu_for_sync_bn(self.device, "hvd.SyncBatchNorm")
        return _convert_bn(model, self._hvd.SyncBatchNorm)

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> torch.optim.Optimizer:
        hvd, cfg = self._hvd, self.cfg
        compression = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16,
                       "bf16": bf16_compressor()}[cfg.grad_compression]
        if cfg.adasum:
            op, kw = hvd.Adasum, {}
        else:  # pre-divide by the world size before summing, as DDP does, so both average identically
            op, kw = hvd.Average, {"gradient_predivide_factor": float(hvd.size())}
        opt = hvd.DistributedOptimizer(optimizer, named_parameters=self.unwrap_model(model).named_parameters(),
                                       op=op, compression=compression, backward_passes_per_step=cfg.accumulate, **kw)
        if cfg.count_allreduces:
            send = opt._allreduce_grad_async

            def counted(p: torch.Tensor) -> Any:
                self.counters["grad_allreduces"] += 1
                self.counters["grad_allreduce_elements"] += p.numel()
                return send(p)

            opt._allreduce_grad_async = counted
        self.installed = {
            "compression": getattr(compression, "__name__", type(compression).__name__),
            "wire_dtype": {"fp16": "float16", "bf16": "bfloat16"}.get(cfg.grad_compression, "float32"),
            "op": "Adasum" if cfg.adasum else "Average", "backward_passes_per_step": cfg.accumulate,
            **{k: os.environ[k] for k in (*HOROVOD_VARS, *mpi_allreduce_env("default"), YIELD_VAR)
               if k in os.environ}}
        return opt

    def unused_parameters_note(self) -> str:
        return ("Horovod's synchronize() all-reduces a zero gradient for each (another rank may have used it), as "
                "dpcompare does under every strategy")

    def synchronize(self, optimizer: torch.optim.Optimizer) -> None:
        """Wait for the all-reduces the optimizer's hooks enqueued: the averaged gradients are in ``.grad``."""
        optimizer.synchronize()  # type: ignore[attr-defined]

    def update(self, optimizer: torch.optim.Optimizer, scaler: Any = None) -> None:
        """The step without waiting again (:meth:`synchronize` ran; the scaler unscales averaged gradients).

        Adasum's optimizer is another kind: each hook takes the local step and sends its delta, ``step()``
        combines the deltas, ``synchronize()`` does nothing and ``skip_synchronize()`` refuses to run.
        """
        if self.cfg.adasum:
            super().update(optimizer, scaler)
            return
        with optimizer.skip_synchronize():  # type: ignore[attr-defined]
            super().update(optimizer, scaler)

    def clip_grad_norm(self, model: nn.Module, optimizer: torch.optim.Optimizer, max_norm: float,
                       scaler: Any = None) -> float:
        if self.cfg.adasum:  # no averaged gradient ever exists: each rank steps locally inside backward's hooks
            raise ConfigError("gradient clipping needs averaged gradients, which --adasum never forms (each rank "
                              "takes its own step and Adasum combines the steps); drop one of the two")
        return super().clip_grad_norm(model, optimizer, max_norm, scaler)

    def broadcast_initial_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        hvd = self._hvd
        hvd.broadcast_parameters(self.unwrap_model(model).state_dict(), root_rank=0)
        if optimizer.state:  # never on a fresh optimizer: that would take an optimizer step
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def _do_all_reduce(self, t: torch.Tensor, op: ReduceOp) -> torch.Tensor:
        hvd = self._hvd
        ops = {"sum": hvd.Sum, "mean": hvd.Average, "max": hvd.Max, "min": hvd.Min}
        return hvd.allreduce(t, op=ops[op])

    def broadcast_buffers(self, model: nn.Module) -> None:
        with torch.no_grad():
            for name, b in self.unwrap_model(model).named_buffers():
                self._hvd.broadcast_(b, root_rank=0, name=f"dpcompare.buffer.{name}")

    def barrier(self) -> None:
        self._hvd.barrier()


def _watch_sparse(watcher: HandleWatcher, handle: Any, name: str, grad: torch.Tensor, world_size: int) -> None:
    """Watch the two all-gathers Horovod started for a sparse gradient (``sparse_allreduce_async``: indices, then
    values; ``synchronize()`` sums what they gathered). Their handles are in the closure it returns; the bytes are
    the gathered output (every rank assumed to send as many rows as this one)."""
    cells = dict(zip(handle.__code__.co_freevars, (c.cell_contents for c in handle.__closure__ or ()), strict=False))
    for part, key in (("indices", "indices_handle"), ("values", "values_handle")):
        t = grad._indices() if part == "indices" else grad._values()
        if isinstance(cells.get(key), int):
            watcher.enqueued(cells[key], f"{name}.{part}", t.numel() * t.element_size() * world_size, tr.ALL_GATHER)


def _gloo_controller() -> bool:
    """True when the job was started by ``horovodrun --gloo`` (Horovod's gloo rendezvous is set)."""
    return bool(os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")) or os.environ.get("HOROVOD_CONTROLLER") == "gloo"


def _allreduces_bf16() -> bool:
    """Whether this Horovod's torch binding has bfloat16 all-reduce kernels (0.28.1 has none)."""
    try:
        # lazy: an optional dependency, tried where it is used
        from horovod.torch import mpi_ops
    except ImportError:
        return True  # the missing library is reported by check_available
    return hasattr(mpi_ops.mpi_lib, "horovod_torch_allreduce_async_torch_BFloat16Tensor")


_BF16: Any = None


def bf16_compressor() -> Any:
    """A Horovod ``Compressor`` that sends bfloat16 (Horovod 0.28.1 ships fp16 only), built on first use."""
    global _BF16
    if _BF16 is None:
        # lazy: an optional dependency
        from horovod.torch.compression import Compressor

        class BF16Compressor(Compressor):
            """Cast floating-point tensors to bfloat16 for the all-reduce and back afterwards."""

            @staticmethod
            def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
                ctx = tensor.dtype
                if tensor.dtype.is_floating_point:
                    tensor = tensor.type(torch.bfloat16)
                return tensor, ctx

            @staticmethod
            def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
                return tensor.type(ctx) if ctx.is_floating_point else tensor

        _BF16 = BF16Compressor
    return _BF16


def _convert_bn(module: nn.Module, sync_cls: type[nn.Module]) -> nn.Module:
    """Replace every BatchNorm layer by ``sync_cls``, keeping its parameters and running statistics."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, sync_cls):
        new = sync_cls(module.num_features, module.eps, module.momentum, module.affine,
                       module.track_running_stats)
        new.load_state_dict(module.state_dict())
        new.train(module.training)
        return new
    for name, child in module.named_children():
        module.add_module(name, _convert_bn(child, sync_cls))
    return module
