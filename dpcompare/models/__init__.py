"""Models by name: ``build_model(name, input_shape, num_classes, width=...)``.

The table names and describes every model without importing torch (the command line lists it); a model's
module is imported when it is built.

May import: the top-level modules only (errors).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dpcompare.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

Builder = Callable[..., "nn.Module"]


def _convnet(shape: tuple[int, ...], n: int, **kw: object) -> nn.Module:
    from dpcompare.models.convnet import ConvNet

    return ConvNet(shape, n)


def _mlp(shape: tuple[int, ...], n: int, width: int = 256, **kw: object) -> nn.Module:
    from dpcompare.models.mlp import MLP

    return MLP(shape, n, width)


def _resnet(arch: str) -> Builder:
    def build(shape: tuple[int, ...], n: int, **kw: object) -> nn.Module:
        from dpcompare.models.resnet import resnet

        return resnet(arch, shape, n)
    return build


MODELS: dict[str, tuple[Builder, str]] = {
    "convnet": (_convnet, "two conv+BatchNorm blocks, as the IDRIS MNIST tutorial"),
    "mlp": (_mlp, "two hidden layers of --width units, no BatchNorm"),
    "resnet18": (_resnet("resnet18"), "torchvision ResNet-18 (needs [vision])"),
    "resnet50": (_resnet("resnet50"), "torchvision ResNet-50 (needs [vision])"),
}


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, **options: object) -> nn.Module:
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return MODELS[name][0](tuple(input_shape), num_classes, **options)


def has_batchnorm(model: nn.Module) -> bool:
    from torch import nn

    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
