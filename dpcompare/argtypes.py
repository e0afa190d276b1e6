"""argparse ``type=`` converters and ``choices``: each turns a bad value into a one-line error that says what is
expected. Names that come from a catalog (models, datasets, trackers) are read from it when a value is checked."""

from __future__ import annotations

import argparse
import math


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
        return isinstance(value, str) and all(list.__contains__(self, n) for n in value.split(",") if n)


def tracker_list(text: str) -> str:
    """``--log``: comma-separated trackers (``none``: only dpcompare's own files), checked for installation
    here, while the command line is read, so that a missing one stops the run before anything starts."""
    import importlib.util

    from dpcompare.training.trackers import TRACKERS, install_hint

    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip() and n.strip() != "none"))
    for n in names:
        if n not in TRACKERS:
            raise argparse.ArgumentTypeError(f"unknown tracker {n!r}; choose from {', '.join(TRACKERS)} (or none)")
        module = TRACKERS[n][0]
        if module and importlib.util.find_spec(module) is None:
            raise argparse.ArgumentTypeError(f"{n} is not installed: {install_hint(n)}")
    return ",".join(names)


def model_arg(text: str) -> str:
    """A built-in model, ``hf:NAME`` (checked when built) or a plug-in ``MODULE:FACTORY`` / ``FILE.py:FACTORY``."""
    from dpcompare.models import HF_PREFIX, MODELS

    if text in MODELS or text.startswith(HF_PREFIX) or ":" in text:
        return text
    raise argparse.ArgumentTypeError(f"unknown model {text!r}; choose from {', '.join(MODELS)}, {HF_PREFIX}NAME "
                                     "(a Hugging Face architecture) or MODULE:FACTORY (your own)")


def dataset_arg(text: str) -> str:
    """A built-in dataset (images or text) or a plug-in ``MODULE:FACTORY`` / ``FILE.py:FACTORY``."""
    from dpcompare.data.catalog import DATASETS, TEXT_DATASETS

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
