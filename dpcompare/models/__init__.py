"""Models by name: ``build_model(name, input_shape, num_classes, width=...)``."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from dpcompare.errors import ConfigError
from dpcompare.models.convnet import ConvNet
from dpcompare.models.mlp import MLP
from dpcompare.models.resnet import resnet

Builder = Callable[..., nn.Module]

MODELS: dict[str, tuple[Builder, str]] = {
    "convnet": (lambda shape, n, **kw: ConvNet(shape, n), "two conv+BatchNorm blocks, as the IDRIS MNIST tutorial"),
    "mlp": (lambda shape, n, width=256, **kw: MLP(shape, n, width), "two hidden layers of --width units, no BatchNorm"),
    "resnet18": (lambda shape, n, **kw: resnet("resnet18", shape, n), "torchvision ResNet-18 (needs [vision])"),
    "resnet50": (lambda shape, n, **kw: resnet("resnet50", shape, n), "torchvision ResNet-50 (needs [vision])"),
}


def names() -> list[str]:
    return list(MODELS)


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, **options: object) -> nn.Module:
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return MODELS[name][0](tuple(input_shape), num_classes, **options)


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
