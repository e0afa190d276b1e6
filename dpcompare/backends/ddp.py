"""PyTorch DistributedDataParallel: gradients are synchronised by hooks on the *model*.

During ``backward()`` autograd hooks on each parameter mark its gradient ready; DDP packs ready
gradients into buckets (``bucket_cap_mb``) and starts an all-reduce per bucket while backward is
still computing earlier layers, so communication overlaps computation. By ``optimizer.step()`` the
gradients are already averaged; the optimizer itself is untouched.

The model hooks live in :class:`DDPModelHooks`, which ``zero`` shares; both stand on
:class:`~dpcompare.backends.torchdist.TorchDistributedStrategy` for the process group.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from dpcompare.backends.base import listed, sparse_bytes, tensor_bytes, timed_collective
from dpcompare.backends.catalog import DDP_KNOBS
from dpcompare.backends.parts import Holder, Tracer
from dpcompare.backends.torchdist import TorchDistributedStrategy
from dpcompare.errors import ConfigError
from dpcompare.trace import (
    ALL_REDUCE,
    BROADCAST,
    CAT_COMM,
    LANE_BROADCAST,
    LANE_BUCKETS,
    SPARSE_ALL_REDUCE,
    TraceRecorder,
)

if TYPE_CHECKING:
    from dpcompare.config import TrainConfig
    from dpcompare.data.workload import ModelTraits

_DDP_ARGS = inspect.signature(DistributedDataParallel.__init__).parameters  # renamed across torch versions
CommHook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]


class DDPTracer(Tracer):
    """DDP's bucket all-reduces (through its communication hook, wrapped when tracing was prepared before the
    model was) and its broadcast of rank 0's buffers at each forward."""

    def __init__(self, strategy: Holder) -> None:
        super().__init__(strategy)
        self.param_names: dict[int, str] = {}  # id of each parameter → its name, while tracing

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer, recorder: TraceRecorder) -> None:
        super().start(model, optimizer, recorder)
        self.param_names = {id(p): n for n, p in self.strategy.unwrap_model(model).named_parameters()}
        if not self.on:
            recorder.notes.append("DDP's bucket all-reduces are not traced: the model was wrapped before "
                                  "tracing was prepared")
        if isinstance(model, DistributedDataParallel) and hasattr(model, "_sync_buffers"):
            # DDP broadcasts rank 0's buffers at the start of each forward (when it has buffers to sync)
            nbytes = tensor_bytes(getattr(model, "modules_buffers", None) or model.module.buffers())
            timed = timed_collective(recorder, model._sync_buffers, "broadcast buffers", BROADCAST, nbytes,
                                     LANE_BROADCAST)
            recorder.lanes[LANE_BROADCAST] = "broadcast"
            self.patch(model, "_sync_buffers", timed)


class DDPModelHooks:
    """Mix-in for a :class:`~dpcompare.backends.torchdist.TorchDistributedStrategy`: the model wrapped in
    DistributedDataParallel, with the communication knobs DDP takes (bucket size, compression and PowerSGD
    hooks, static graph), its ``no_sync`` for accumulation and its tracing.

    ``ddp`` and ``zero`` both use it (they differ only in the optimizer): ``class X(DDPModelHooks,
    TorchDistributedStrategy)``.
    """

    bucket_cap_mb: float = 25.0  # torch's default
    knobs = DDP_KNOBS  # (a built-in strategy's come from its catalog line: the same)
    tracer_class: type[Tracer] = DDPTracer
    tracer: DDPTracer

    @classmethod
    def check_config(cls, cfg: TrainConfig, world_size: int) -> None:
        super().check_config(cfg, world_size)
        if cfg.powersgd_rank and cfg.grad_compression != "none":
            raise ConfigError(f"--powersgd-rank and --grad-compression {cfg.grad_compression} both replace DDP's "
                              "communication hook; choose one")

    def wrap_model(self, model: nn.Module) -> nn.Module:
        ids = [self.device.index] if self.device.type == "cuda" else None
        # The constructor broadcasts rank 0's parameters and buffers; buffers are re-synced before each forward.
        sync = ({"forward_sync_buffers": True} if "forward_sync_buffers" in _DDP_ARGS
                else {"broadcast_buffers": True})
        cfg = self.cfg
        bucket = cfg.bucket_mb or self.bucket_cap_mb
        find_unused = self.finds_unused_parameters()
        ddp = DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=bucket, static_graph=cfg.static_graph,
                                      find_unused_parameters=find_unused, **sync)
        state, hook, name = self.comm_hook()
        tracer = self.tracer
        tracing = tracer.on  # only with --trace
        # DDP takes one hook: counting and tracing wrap the one the knobs chose
        if cfg.count_allreduces or tracing or name != "allreduce_hook":  # else DDP's built-in all-reduce
            if cfg.count_allreduces:
                hook = self._counted(hook)
            if tracing:
                hook = tracing_comm_hook(hook, lambda: tracer.recorder, lambda p: tracer.param_names.get(id(p), "?"))
            ddp.register_comm_hook(state, hook)
        shown = name if name != "allreduce_hook" or cfg.count_allreduces or tracing else "built-in all-reduce"
        self.installed = {"comm_hook": shown, "bucket_cap_mb": bucket, "static_graph": cfg.static_graph,
                           "wire_dtype": {"fp16": "float16", "bf16": "bfloat16"}.get(cfg.grad_compression,
                                                                                     "float32"),
                           "powersgd_rank": cfg.powersgd_rank, "find_unused_parameters": find_unused,
                           **({"unused_parameters": list(self.traits.unused)} if self.traits and self.traits.unused
                              else {})}
        return ddp

    def finds_unused_parameters(self) -> bool:
        """``find_unused_parameters`` as ``--find-unused-parameters`` asks: on, off, or (auto) on exactly when the
        pre-check found trainable parameters without a gradient."""
        setting = self.cfg.find_unused_parameters
        return setting == "on" or (setting == "auto" and bool(self.traits and self.traits.unused))

    @classmethod
    def check_model(cls, traits: ModelTraits, cfg: TrainConfig) -> None:
        super().check_model(traits, cfg)
        if traits.unused and cfg.find_unused_parameters == "off":
            raise ConfigError(f"--find-unused-parameters off, but the pre-check (one batch forward and backward) "
                              f"found trainable parameters without a gradient ({listed(traits.unused)}): DDP would "
                              "stop at the second step; use --find-unused-parameters auto or on")
        if traits.sparse and (cfg.grad_compression != "none" or cfg.powersgd_rank):
            hook = f"--grad-compression {cfg.grad_compression}" if cfg.powersgd_rank == 0 else "--powersgd-rank"
            raise ConfigError(f"{hook}: DDP's communication hooks take dense buckets, but {listed(traits.sparse)} "
                              "get sparse gradients; drop the knob, or make the embedding dense (sparse=False)")

    def unused_parameters_note(self) -> str:
        if self.finds_unused_parameters():
            return ("DDP runs with find_unused_parameters=True (a traversal of the autograd graph after every "
                    "forward; --find-unused-parameters on|off|auto), and each gets a zero gradient before the update, "
                    "as under every strategy")
        return super().unused_parameters_note()  # type: ignore[misc]

    def comm_hook(self) -> tuple[Any, CommHook, str]:
        """The (state, hook, name) the knobs ask DDP to run on each bucket; the default all-reduce (the same
        arithmetic as DDP's built-in one) when no knob asks for another."""
        cfg = self.cfg
        if cfg.grad_compression == "fp16":
            return None, default_hooks.fp16_compress_hook, "fp16_compress_hook"
        if cfg.grad_compression == "bf16":
            return None, bf16_compress_hook, "dpcompare.backends.ddp.bf16_compress_hook"
        if cfg.powersgd_rank:
            # from the second step on (torch's default waits 1000 steps, longer than most comparisons)
            state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=cfg.powersgd_rank,
                                                start_powerSGD_iter=2)
            return state, powerSGD_hook.powerSGD_hook, "powerSGD_hook"
        return None, default_hooks.allreduce_hook, "allreduce_hook"

    def _counted(self, hook: Any) -> Any:
        """``hook`` that also counts the buckets it exchanges (one all-reduce per bucket)."""
        def counted(state, bucket):  # type: ignore[no-untyped-def]  (DDP rejects string annotations)
            self.counters["grad_allreduces"] += 1
            self.counters["grad_allreduce_elements"] += bucket.buffer().numel()
            return hook(state, bucket)
        return counted

    def accumulation_context(self, model: nn.Module, micro_step: int) -> contextlib.AbstractContextManager[Any]:
        sync = model.no_sync() if micro_step < self.cfg.accumulate - 1 else contextlib.nullcontext()  # type: ignore[operator]
        return _explained(sync, self.finds_unused_parameters())



class DDPStrategy(DDPModelHooks, TorchDistributedStrategy):
    name = "ddp"


#: how DDP says that a parameter got no gradient in the step before (without find_unused_parameters)
UNFINISHED = "Expected to have finished reduction in the prior iteration"


@contextlib.contextmanager
def _explained(inner: contextlib.AbstractContextManager[Any], finding: bool) -> Any:
    """``inner``, with DDP's error for a parameter that got no gradient said in one line: the pre-check's batch used
    every parameter, a later one did not (the parameters a step uses depend on its data)."""
    try:
        with inner:
            yield
    except RuntimeError as e:
        if UNFINISHED not in str(e) or finding:
            raise
        raise ConfigError("DDP stopped: a trainable parameter got no gradient in the previous step, though every one "
                          "got one on the pre-check's batch (which parameters a step uses depends on its data); run "
                          "with --find-unused-parameters on") from None


def bf16_compress_hook(process_group, bucket):  # type: ignore[no-untyped-def]  (DDP rejects string annotations)
    """torch's ``fp16_compress_hook`` with bfloat16: cast the bucket, divide, sum in bf16, copy back.

    torch's own ``bf16_compress_hook`` refuses anything but CUDA 11+ with NCCL 2.10+; gloo all-reduces
    bfloat16 tensors, so the same recipe works on CPU.
    """
    group = process_group if process_group is not None else dist.group.WORLD
    world = group.size()  # type: ignore[union-attr]
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(world)
    fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(f):  # type: ignore[no-untyped-def]
        buffer.copy_(f.value()[0])
        return buffer

    return fut.then(decompress)


def tracing_comm_hook(inner: CommHook, recorder: Callable[[], TraceRecorder | None],
                      name_of: Callable[[torch.Tensor], str] = lambda p: "") -> CommHook:
    """A DDP comm hook running ``inner`` that, while ``recorder()`` is not None, records each bucket's
    all-reduce as a span from the hook's call (the bucket is full) to its future's completion."""

    def hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        rec = recorder()
        if rec is None:
            return inner(state, bucket)
        start = rec.now()
        buf = bucket.buffer()
        names = [name_of(p) for p in bucket.parameters()]
        index, nbytes, collective = bucket.index(), buf.numel() * buf.element_size(), ALL_REDUCE
        if buf.is_sparse:  # its own bucket; gloo gathers every rank's coalesced rows (assumed as many as here)
            nbytes, collective = sparse_bytes(buf.coalesce()) * dist.get_world_size(), SPARSE_ALL_REDUCE
        what = f"{'sparse ' if buf.is_sparse else ''}all-reduce bucket {index}"
        fut = inner(state, bucket)
        rec.lanes[LANE_BUCKETS + index] = what

        def done(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            rec.span(what, CAT_COMM, start, rec.now(), tid=LANE_BUCKETS + index,
                     bucket=index, bytes=nbytes, tensors=names, collective=collective)
            return f.value()

        return fut.then(done)

    # DDP checks the annotations as objects; `from __future__ import annotations` made them strings
    hook.__annotations__ = {"state": Any, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
    return hook
