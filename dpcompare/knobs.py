"""The communication knobs people tune, what each library calls them, and whether the two agree exactly.

The knobs themselves are :class:`~dpcompare.config.TrainConfig` fields (group ``KNOBS``); each strategy
plugin declares which of them it honours (``Strategy.knobs``) and translates them. This table is what
``parity`` uses to decide how to judge a difference, and what the README's knob table shows.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal, NamedTuple

from dpcompare.config import KNOBS, TrainConfig
from dpcompare.errors import ConfigError
from dpcompare.options import flag_of

Exactness = Literal["exact", "lossy", "different"]


class Knob(NamedTuple):
    ddp: str
    horovod: str
    exactness: Exactness
    note: str


#: knob field → how each library spells it and whether ddp and horovod should agree
TABLE: dict[str, Knob] = {
    "grad_compression": Knob(
        "register_comm_hook(fp16_compress_hook) / dpcompare's bf16 hook", "compression=hvd.Compression.fp16 / "
        "dpcompare's bf16 Compressor", "lossy",
        "DDP casts each flattened bucket to fp16/bf16, divides it by the number of processes, sums it in that dtype "
        "and copies the result back into the fp32 gradients; Horovod casts tensor by tensor, fuses them, applies "
        "its 1/N prescale in the fusion buffer and casts each tensor back after the sum: same idea, different "
        "grouping, rounding points and overflow risk"),
    "accumulate": Knob("with ddp.no_sync(): for K-1 micro-batches", "backward_passes_per_step=K", "exact",
                       "both sum the K micro-batch gradients locally, then average once over processes"),
    "bucket_mb": Knob("bucket_cap_mb", "HOROVOD_FUSION_THRESHOLD (bytes)", "exact",
                      "same sums grouped differently (at 2 processes the order of a sum of two cannot differ)"),
    "horovod_cycle_ms": Knob("—", "HOROVOD_CYCLE_TIME", "exact", "when fusion happens, not what is summed"),
    "horovod_ops": Knob("—", "HOROVOD_CPU_OPERATIONS", "exact", "another implementation of the same sum"),
    "mpi_allreduce": Knob("—", "OMPI_MCA_coll_tuned_allreduce_algorithm (+ use_dynamic_rules)", "exact",
                          "another algorithm for the same sum; beyond 2 processes it may add in another order"),
    "adasum": Knob("— (no equivalent)", "op=hvd.Adasum", "different",
                   "Adasum combines gradients by their angles instead of averaging them: not meant to match"),
    "powersgd_rank": Knob("register_comm_hook(powerSGD_hook)", "— (no equivalent)", "different",
                          "PowerSGD sends a low-rank approximation with error feedback: not meant to match"),
    "static_graph": Knob("DistributedDataParallel(static_graph=True)", "—", "exact",
                         "an optimisation of DDP's bookkeeping, the same all-reduces"),
    "find_unused_parameters": Knob(
        "DistributedDataParallel(find_unused_parameters=True)", "— (synchronize() all-reduces a zero gradient for "
        "each parameter without one)", "exact",
        "DDP's bookkeeping for parameters that get no gradient (it marks them ready after a traversal of the "
        "autograd graph); the same all-reduces, and dpcompare gives such a parameter a zero gradient under "
        "every strategy"),
    "amp": Knob("torch.autocast (+ GradScaler for fp16 on GPU)", "torch.autocast (+ GradScaler with "
                "optimizer.synchronize()/skip_synchronize())", "exact",
                "the same autocast forward on both sides; only the gradient exchange differs"),
}

#: parity tolerance for a compressed exchange, by wire dtype (machine epsilon of the dtype × a margin for
#: a few tens of steps of momentum SGD on weights of order 0.1)
COMPRESSION_TOLERANCE = {"fp16": 1e-3, "bf16": 1e-2}


#: knob settings that change what is computed (the values leave the arithmetic of plain averaging)
LOSSY: dict[str, Any] = {"grad_compression": "none", "adasum": False, "powersgd_rank": 0, "amp": "none"}


def lossy(settings: dict[str, Any]) -> list[str]:
    """The knobs among ``settings`` (field → value) set to something lossy: compression, Adasum, PowerSGD, AMP."""
    return [k for k, off in LOSSY.items() if k in settings and settings[k] != off]


def exact_equivalents(arm_settings: list[dict[str, Any]]) -> bool:
    """True when arms that override only these settings must train the same model bit for bit (whatever their
    strategy): every override is a communication knob that is neither lossy nor a different algorithm, so only
    how and when the same sum is exchanged differs. Any other setting (batch, lr, model...) may change the result."""
    exact = {k for k, v in TABLE.items() if v.exactness == "exact"} - set(LOSSY)
    return all(not lossy(s) and set(s) <= exact | set(LOSSY) for s in arm_settings)


def names() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainConfig) if f.metadata.get("group") == KNOBS]


def active(cfg: TrainConfig) -> dict[str, Any]:
    """The knobs ``cfg`` sets away from their defaults."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(TrainConfig)
            if f.metadata.get("group") == KNOBS and getattr(cfg, f.name) != f.default}


def without(cfg: TrainConfig, drop: list[str]) -> TrainConfig:
    """``cfg`` with the knobs in ``drop`` back at their defaults."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    return dataclasses.replace(cfg, **{k: defaults[k] for k in drop})


def refuse_unhonoured(cfg: TrainConfig, strategy: str, honours: Mapping[str, Collection[str]]) -> None:
    """Refuse a knob set in ``cfg`` that ``strategy`` does not honour, naming the strategies that do.

    ``honours``: every strategy's name → the knobs it honours (``Strategy.knobs``). Also refuses an
    ``--amp`` dtype this torch cannot autocast to on the run's device.
    """
    mine = honours.get(strategy, ())
    for name, value in active(cfg).items():
        if name not in mine:
            who = [n for n, ks in honours.items() if name in ks]
            shown = flag_of(name) if isinstance(value, bool) else f"{flag_of(name)} {value}"
            raise ConfigError(f"{shown}: --strategy {strategy} cannot honour it; only "
                              f"{' or '.join('--strategy ' + w for w in who) or 'no strategy'} can")
    if cfg.amp != "none":
        # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
        import torch

        want = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        check_amp(cfg.amp, want)


def amp_dtype(name: str) -> Any:
    import torch  # here, not at the top: dpcompare --help loads this module

    return {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def check_amp(name: str, device_type: str) -> None:
    """Refuse an autocast dtype this torch cannot run on this device (autocast would only warn and run fp32)."""
    if name == "none":
        return
    import torch  # here, not at the top: dpcompare --help loads this module

    dtype = amp_dtype(name)
    ok = torch.amp.autocast_mode.is_autocast_available(device_type)
    if ok:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                with torch.autocast(device_type, dtype=dtype):
                    a = torch.ones(2, 2, device=device_type)
                    ok = (a @ a).dtype == dtype
        except Exception:  # noqa: BLE001  (an unsupported dtype warns or raises depending on the version)
            ok = False
    if not ok:
        other = "bf16" if name == "fp16" else "fp16"
        raise ConfigError(f"--amp {name}: torch {torch.__version__} cannot autocast to {name} on {device_type}; "
                          f"try --amp {other} or drop --amp")


# -- Horovod's tensor fusion, written once for the native layer (native/fusion.py) and predict (prediction/horovod.py)
HOROVOD_FUSION_VAR, HOROVOD_FUSION_BYTES = "HOROVOD_FUSION_THRESHOLD", 128 * 1024 * 1024
HOROVOD_CYCLE_VAR, HOROVOD_CYCLE_MS = "HOROVOD_CYCLE_TIME", 1.0


def horovod_fusion(order: Sequence[int], nbytes: Sequence[float], kinds: Sequence[Any] | None = None,
                   threshold: float = HOROVOD_FUSION_BYTES, times: Sequence[float] | None = None,
                   cycle: float = math.inf) -> list[list[int]]:
    """Horovod's fusion of the tensors ``order`` names (indices into ``nbytes``, ``kinds``, ``times``): consecutive
    runs that share a kind (dtype and device; None: all alike), fit ``threshold`` bytes (a larger tensor goes alone,
    a fused buffer never exceeds it; 0: every tensor alone) and, with ``times``, became ready within ``cycle``
    seconds of the run's first member."""
    groups: list[list[int]] = []
    current: list[int] = []
    size, start = 0.0, 0.0
    for i in order:
        t = times[i] if times is not None else 0.0
        late = times is not None and (t - start > cycle)
        if current and ((kinds is not None and kinds[i] != kinds[current[0]]) or size + nbytes[i] > threshold or late):
            groups.append(current)
            current, size = [], 0.0
        if not current:
            start = t
        current.append(i)
        size += nbytes[i]
    if current:
        groups.append(current)
    return groups
