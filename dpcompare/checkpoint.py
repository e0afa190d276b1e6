"""One checkpoint format for every strategy and world size.

A checkpoint is a plain dict of tensors and primitives, so ``torch.load(path, weights_only=True)``
reads it: the model's state_dict without any ``module.`` prefix, the optimizer state, epoch and
global step, the sampler's seed and position, the RNG states, the run config, who wrote it, and
library versions. Rank 0 writes it atomically (temporary file, fsync, rename).
"""

from __future__ import annotations

import pickle
import random
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from dpcompare.errors import CheckpointError
from dpcompare.files import atomic_write

FORMAT = "dpcompare-checkpoint"
FORMAT_VERSION = 1
CKPT_DIR = "checkpoints"


#: what a checkpoint's file name counts: ``epoch-<N>.pt`` (epochs done) or ``step-<S>.pt`` (``--checkpoint-steps``,
#: ``--commit-every``: optimizer steps done, possibly mid-epoch)
KINDS = ("epoch", "step")


def checkpoint_path(out: str | Path, epoch: int) -> Path:
    return Path(out) / CKPT_DIR / f"epoch-{epoch}.pt"


def step_checkpoint_path(out: str | Path, step: int) -> Path:
    return Path(out) / CKPT_DIR / f"step-{step}.pt"


def list_checkpoints(out: str | Path, kind: str = "epoch") -> list[tuple[int, Path]]:
    """(N, path) for every ``<kind>-<N>.pt`` in ``OUT/checkpoints``, oldest first."""
    found = []
    for p in (Path(out) / CKPT_DIR).glob(f"{kind}-*.pt"):
        try:
            found.append((int(p.stem.split("-", 1)[1]), p))
        except ValueError:
            continue
    return sorted(found)


def prune_checkpoints(out: str | Path, keep_last: int, keep_every: int = 0,
                      keep: tuple[Path, ...] = (), kind: str = "epoch") -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints of ``OUT/checkpoints`` of one ``kind`` (0: delete none).

    Epochs (or steps) that are multiples of ``keep_every`` and the paths in ``keep`` (the one just written, the
    final one) stay. The newest checkpoint, which ``--resume auto`` reads, always stays. Call it only
    after the new checkpoint is completely written. Returns what was deleted.
    """
    found = list_checkpoints(out, kind)
    if keep_last <= 0 or len(found) <= keep_last:
        return []
    kept = {p for _, p in found[-keep_last:]} | set(keep)
    deleted = []
    for epoch, p in found[:-keep_last]:
        if p in kept or (keep_every and epoch % keep_every == 0):
            continue
        p.unlink(missing_ok=True)
        deleted.append(p)
    return deleted


def latest_checkpoint(out: str | Path) -> Path | None:
    """The checkpoint of ``OUT`` furthest into training (``--resume auto``): the newest epoch one or the newest
    step one, whichever has taken more optimizer steps (the epoch one on a tie); None when there is none."""
    epochs, steps = list_checkpoints(out), list_checkpoints(out, "step")
    if not (epochs and steps):
        return (epochs or steps)[-1][1] if epochs or steps else None
    try:
        epoch_step = int(load_checkpoint(epochs[-1][1])["global_step"])
    except (CheckpointError, KeyError, TypeError, ValueError):
        return steps[-1][1]
    return epochs[-1][1] if epoch_step >= steps[-1][0] else steps[-1][1]


def seed_everything(seed: int) -> None:
    """Python's, NumPy's and torch's random state from ``seed`` (a training run's start, a script's before it runs;
    what :func:`rng_state` saves and :func:`set_rng_state` puts back)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"key": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    v, inner, gauss = state["python"]
    random.setstate((v, tuple(inner), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def atomic_save(obj: object, path: str | Path) -> Path:
    """Write ``obj`` with torch.save so that ``path`` is either absent, the old file, or the whole new one."""
    return atomic_write(path, lambda f: torch.save(obj, f))


def plain_state_dict(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of ``state`` without the ``module.`` prefix DDP (and DataParallel) adds."""
    sd = dict(state)
    consume_prefix_in_state_dict_if_present(sd, "module.")
    return sd


def _read(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist; check the path (or use --resume auto)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        why = next(
            (ln.split("error:", 1)[-1].strip() for ln in lines if "Unsupported" in ln), lines[0] if lines else ""
        )
        why = why.split(" was not an allowed global")[0]
        raise CheckpointError(f"checkpoint {path} holds pickled objects that torch.load(weights_only=True) refuses "
                              f"({why[:100]}); re-save it with plain tensors and containers only") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({msg[:120]}); "
                              "use an earlier checkpoint") from None


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a dpcompare checkpoint written by any strategy at any world size."""
    ckpt = _read(path)
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a dpcompare checkpoint; for a bare state_dict use --init-from")
    if ckpt.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(f"{path} was written by a newer dpcompare (format {ckpt['format_version']}); "
                              "upgrade dpcompare")
    return ckpt


def load_model_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Weights for ``--init-from``: a dpcompare checkpoint, a plain state_dict or a DDP (``module.``) one."""
    obj = _read(path)
    if isinstance(obj, dict) and obj.get("format") == FORMAT:
        obj = obj["model"]
    elif isinstance(obj, dict) and isinstance(obj.get("model_state_dict"), dict):
        obj = obj["model_state_dict"]  # a common hand-written layout
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path} holds no state_dict (a mapping of names to tensors)")
    return plain_state_dict(obj)


def check_fits(model: nn.Module, state: Mapping[str, torch.Tensor], path: str | Path, what: str = "") -> None:
    """Refuse weights that do not fit ``model`` (other architecture, other sizes) with one clear line."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    wrong = [k for k in own if k in state and tuple(own[k].shape) != tuple(state[k].shape)]
    if missing or unexpected or wrong:
        detail = (f"missing {missing[:2]}" if missing else f"unexpected {unexpected[:2]}" if unexpected
                  else f"shape of {wrong[0]} is {tuple(state[wrong[0]].shape)}, not {tuple(own[wrong[0]].shape)}")
        raise CheckpointError(f"{path} holds weights of another model{what} ({detail}); "
                              "pass the --model/--width/--dataset it was trained with, or another checkpoint")
