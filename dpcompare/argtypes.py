"""argparse ``type=`` converters and ``choices``: each turns a bad value into a one-line error that says what is
expected. Names that come from a catalog (models, datasets) are read from it when a value is checked; ``--trackers``'
trackers are listed here (:data:`TRACKERS`), for the command line and ``dpcompare doctor`` to read without the
training room.
Link rates (:func:`parse_rate_bits`, :func:`format_rate_bits`) are the one reading of ``1gbit``, ``300gbyte``."""

from __future__ import annotations

import argparse
import importlib.util
import math
import re

from dpcompare.backends.catalog import check_name
from dpcompare.data.catalog import DATASETS, TEXT_DATASETS
from dpcompare.errors import ConfigError
from dpcompare.models import HF_PREFIX, MODELS


def _int_at_least(text: str, low: int, words: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"{text!r} must be {words}")
    return v


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "at least 1")


def nonneg_int(text: str) -> int:
    return _int_at_least(text, 0, "0 or more")


def _finite(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number")
    return v


def positive_float(text: str) -> float:
    v = _finite(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return v


def nonneg_float(text: str) -> float:
    v = _finite(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return v


def fraction(text: str) -> float:
    """A number from 0 to 1 (an accuracy)."""
    v = _finite(text)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a fraction from 0 to 1 (0.95 for 95 %)")
    return v


def shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape like 3,32,32") from None
    if not dims or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape like 3,32,32")
    return dims


class NameList(list):
    """argparse ``choices`` for a comma-separated list of names: a value is "in" it when each of its names is."""

    def __contains__(self, value: object) -> bool:
        return isinstance(value, str) and all(list.__contains__(self, n) for n in value.split(",") if n and n != "none")


class PluginNames(list):
    """argparse ``choices`` that list the built-in names and also hold every plug-in ``MODULE:ATTR``."""

    def __contains__(self, value: object) -> bool:
        return list.__contains__(self, value) or (isinstance(value, str) and ":" in value)


def strategy_arg(text: str) -> str:
    """A built-in strategy or a plug-in ``MODULE:CLASS`` / ``path/to/file.py:CLASS`` (imported when used)."""
    try:
        return check_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


#: ``--trackers``' trackers (opened by :mod:`dpcompare.training.trackers`): name → (the module it needs, the pip
#: extra that brings it or None, what it writes)
TRACKERS: dict[str, tuple[str | None, str | None, str]] = {
    "tensorboard": ("tensorboard", None, "events in OUT/tensorboard"),
    "csv": (None, None, "OUT/metrics.csv and OUT/timing.csv"),
    "wandb": ("wandb", "wandb", "a Weights & Biases run (offline unless WANDB_MODE says otherwise) in OUT/wandb"),
    "mlflow": ("mlflow", "mlflow", "an MLflow run in --mlflow-uri's store (default: OUT/mlflow.db)"),
}


def install_hint(name: str) -> str:
    """What brings tracker ``name``'s module: ``pip install -e '.[EXTRA]'`` (in a dpcompare checkout) or
    ``pip install MODULE``."""
    module, extra, _ = TRACKERS[name]
    return f"pip install -e '.[{extra}]'" if extra else f"pip install {module}"


def tracker_list(text: str) -> str:
    """``--trackers``: comma-separated trackers (``none``: only dpcompare's own files), checked for installation
    here, while the command line is read, so that a missing one stops the run before anything starts."""
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip() and n.strip() != "none"))
    for n in names:
        if n not in TRACKERS:
            raise argparse.ArgumentTypeError(f"unknown tracker {n!r}; choose from {', '.join(TRACKERS)} (or none)")
        module = TRACKERS[n][0]
        if module and importlib.util.find_spec(module) is None:
            raise argparse.ArgumentTypeError(f"{n} is not installed: {install_hint(n)}")
    return ",".join(names) or "none"  # stored as written: an empty value reads as a missing one


def model_arg(text: str) -> str:
    """A built-in model, ``hf:NAME`` (checked when built) or a plug-in ``MODULE:FACTORY`` / ``FILE.py:FACTORY``."""
    if text in MODELS or text.startswith(HF_PREFIX) or ":" in text:
        return text
    raise argparse.ArgumentTypeError(f"unknown model {text!r}; choose from {', '.join(MODELS)}, {HF_PREFIX}NAME "
                                     "(a Hugging Face architecture) or MODULE:FACTORY (your own)")


def dataset_arg(text: str) -> str:
    """A built-in dataset (images or text) or a plug-in ``MODULE:FACTORY`` / ``FILE.py:FACTORY``."""
    if text in DATASETS or text in TEXT_DATASETS or ":" in text:
        return text
    raise argparse.ArgumentTypeError(f"unknown dataset {text!r}; choose from {', '.join([*DATASETS, *TEXT_DATASETS])} "
                                     "or MODULE:FACTORY (your own)")


def workload_arg(text: str) -> str:
    """A plug-in ``MODULE:ATTR`` or ``path/to/file.py:ATTR``."""
    if ":" not in text.strip(":") or text.startswith(":") or text.endswith(":"):
        raise argparse.ArgumentTypeError(f"{text!r} is not MODULE:ATTR or path/to/file.py:ATTR "
                                         "(e.g. my_pkg.bench:workload)")
    return text


#: link rates: tc's bit units, and bytes spelt out (``300gbyte`` for an NVLink-class link); tc's own ``bps``
#: (bytes) is left out on purpose: one spelling, no surprises
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
               "byte": 8, "kbyte": 8 * 10**3, "mbyte": 8 * 10**6, "gbyte": 8 * 10**9, "tbyte": 8 * 10**12}
_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt]?(?:bit|byte))(?:/s)?$")
#: what an unshaped link is called (where one is allowed: the lab's links)
UNLIMITED = ("unlimited", "unshaped", "none")


def parse_rate_bits(text: str, *, unlimited: bool = False) -> int | None:
    """A link rate in bits per second: ``1gbit`` → 1_000_000_000, ``200Mbit/s`` → 200_000_000, ``300gbyte`` →
    2_400_000_000_000; with ``unlimited``, ``unlimited`` (or ``unshaped``, ``none``) → None. ConfigError otherwise."""
    t = text.strip().lower()
    if unlimited and t in UNLIMITED:
        return None
    m = _RATE.match(t)
    bps = round(float(m.group(1)) * _RATE_UNITS[m.group(2)]) if m else 0
    if bps <= 0:
        raise ConfigError(f"link rate {text!r}: write a number and a unit, e.g. 1gbit, 200mbit or 300gbyte (bits: "
                          "bit, kbit, mbit, gbit, tbit; bytes: byte ... tbyte)"
                          + (", or unlimited" if unlimited else ""))
    return bps


def format_rate_bits(bps: float | None) -> str:
    """1e9 → ``1gbit``, 2e8 → ``200mbit``, None → ``unlimited``: the spelling :func:`parse_rate_bits` reads back."""
    if bps is None:
        return "unlimited"
    for unit in ("tbit", "gbit", "mbit", "kbit", "bit"):
        scale = _RATE_UNITS[unit]
        if bps >= scale and (bps / scale) == round(bps / scale, 3):
            return f"{bps / scale:g}{unit}"
    return f"{int(bps)}bit"


def rate_bits(text: str) -> int:
    """A link rate flag (``--link 25gbit``) in bits per second; a bad one is argparse's one-line error."""
    try:
        return int(parse_rate_bits(text) or 0)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
