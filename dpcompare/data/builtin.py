"""The built-in workloads: a model of :mod:`dpcompare.models` trained on a dataset of :mod:`.datasets` to
classify, with cross-entropy loss and test accuracy (what every run did before workloads existed)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from dpcompare import models
from dpcompare.data.workload import Metric, Workload

if TYPE_CHECKING:
    import torch

    from dpcompare.config import TrainConfig
    from dpcompare.data.datasets import DataBundle


def _correct(output: torch.Tensor, target: torch.Tensor) -> tuple[float, int]:
    """Correct answers and samples in one batch: the accuracy metric's share."""
    return float((output.argmax(1) == target).sum()), len(target)


#: test accuracy, a share of the test set (0-1, shown in per cent)
ACCURACY = Metric("accuracy", higher_is_better=True, batch=_correct, unit="%")


def builtin(cfg: TrainConfig) -> Workload:
    """``cfg.model`` classifying ``cfg.dataset``; nothing is built until the loop asks.

    The loop builds the data first and the model second (from the run seed), as before workloads.
    """
    from torch import nn  # here, not at the top: dpcompare --help loads this module

    from dpcompare.data.datasets import build_dataset  # here, not at the top: it loads torch and numpy

    @functools.cache
    def data() -> DataBundle:
        return build_dataset(cfg.dataset, cfg.data_dir, cfg.input_shape, cfg.samples, cfg.augment)

    def build_model() -> nn.Module:
        d = data()
        return models.build_model(cfg.model, d.input_shape, d.num_classes, width=cfg.width)

    def build_data() -> tuple[Any, Any]:
        return data().train, data().test

    return Workload(name="classification", build_model=build_model, build_data=build_data,
                    loss=nn.CrossEntropyLoss(), metrics=(ACCURACY,), source="builtin",
                    info={"model": cfg.model, "dataset": cfg.dataset})
