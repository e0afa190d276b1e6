"""The prediction interval: the inputs' band widened by the model's own error, as a validation measured it.

The band (:mod:`.sweep`) holds the inputs' noise only: the traced steps and the bench's repeats drawn again. What
the model leaves out (a link's burst, cores the communication takes, the machine drifting between the trace and
the run) is not in it, and two runs of the same procedure can give bands that miss each other. The interval adds
it the way conformalized quantile regression does (Romano, Patterson and Candès, 2019): a validation
(``bench/validate_predict.py``) predicts configurations and measures them; on the rows it chose its calibration on,
each row's **score** is how far the measured step fell outside the band, as a fraction of the predicted step (0
inside). At level L the interval widens every band on each side by the ⌈(n+1)·L⌉-th smallest of the n scores
times the predicted step: where later configurations err as the choosing set did, the interval holds the measured
step with probability at least L. Whether they do is what the held-out families of the validation show
(bench/predict-validation.md; the user's guide: docs/predict.md).

``--model-error FILE`` reads another validation's figure (``validate_predict.py analyse --model-error-out FILE``),
``none`` leaves the band alone. May import: numpy and the top-level modules.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from dpcompare.errors import ConfigError
from dpcompare.files import atomic_write_json
from dpcompare.versions import docs_page

LEVEL = 0.9


@dataclass(frozen=True)
class ModelError:
    """How much to widen a band: ``widen`` × the predicted step on each side, from ``n`` scores at ``level``."""

    widen: float
    level: float
    n: int
    source: str

    def interval(self, step: float, band: tuple[float, float]) -> tuple[float, float]:
        return max(0.0, band[0] - self.widen * step), band[1] + self.widen * step

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def describe(self) -> str:
        return (f"{100 * self.level:.0f} % interval: the band widened by {100 * self.widen:.1f} % of the step on each "
                f"side, the model's error on {self.n} configurations of {self.source}")


#: the figure `dpcompare predict` uses unless told otherwise: the mlp rows (the choosing set) of the validation in
#: bench/predict-validation.md (its "Result"), calibration profilefloor, 2 and 4 hosts on the lab, 2-core AMD EPYC
VALIDATED = ModelError(widen=0.105, level=LEVEL, n=24, source="the 2026-11-26 lab validation's choosing set (mlp2048)")


def score(predicted: float, low: float, high: float, measured: float) -> float:
    """How far ``measured`` fell outside the band [low, high], as a fraction of ``predicted`` (0 inside)."""
    return max(0.0, low - measured, measured - high) / predicted


def conformal(scores: Sequence[float], level: float = LEVEL, source: str = "a validation") -> ModelError:
    """The widening that holds the measured step with probability at least ``level`` where later configurations
    score like these: the ⌈(n+1)·level⌉-th smallest score (all of them, the largest, when n is small)."""
    n = len(scores)
    if n == 0:
        raise ConfigError("no configurations to measure the model's error on")
    q = min(1.0, math.ceil((n + 1) * level) / n)
    return ModelError(float(np.quantile(np.asarray(scores, dtype=float), q, method="inverted_cdf")), level, n, source)


def load(spec: str | None) -> ModelError | None:
    """``--model-error``: None → :data:`VALIDATED`, ``none`` → no interval, else a JSON file written by
    ``validate_predict.py analyse --model-error-out``."""
    if spec is None:
        return VALIDATED
    if spec.lower() == "none":
        return None
    try:
        doc = json.loads(Path(spec).read_text())
        return ModelError(float(doc["widen"]), float(doc["level"]), int(doc["n"]), str(doc["source"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--model-error {spec}: not a model-error file ({e}); give one a validation wrote "
                          f"({docs_page('predict')}), or none") from None


def write(path: Path, me: ModelError) -> Path:
    return atomic_write_json(path, me.as_dict())
