"""argparse ``type=`` converters: each turns a bad value into a one-line error that says what is expected."""

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
