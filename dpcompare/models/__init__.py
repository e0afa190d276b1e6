"""Models by name: ``build_model(name, input_shape, num_classes, width=...)``.

The table names and describes every model without importing torch (the command line lists it); a model's
module is imported when it is built. Language models (``gpt-*``, ``hf:NAME``) take ``input_shape=(seq_len,)``
and ``num_classes=vocabulary size``.

May import: the top-level modules only. This package and :mod:`.catalog` import no torch: any module may read
them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dpcompare.errors import ConfigError
from dpcompare.models.catalog import GPT_SIZES as GPT_SIZES
from dpcompare.models.catalog import HF_ARCHITECTURES as HF_ARCHITECTURES
from dpcompare.models.catalog import HF_PREFIX as HF_PREFIX

if TYPE_CHECKING:
    from torch import nn

Builder = Callable[..., "nn.Module"]


def _convnet(shape: tuple[int, ...], n: int, **kw: object) -> nn.Module:
    from dpcompare.models.convnet import ConvNet  # here, not at the top: it loads torch

    return ConvNet(shape, n)


def _mlp(shape: tuple[int, ...], n: int, width: int = 256, **kw: object) -> nn.Module:
    from dpcompare.models.mlp import MLP  # here, not at the top: it loads torch

    return MLP(shape, n, width)


def _resnet(arch: str) -> Builder:
    def build(shape: tuple[int, ...], n: int, **kw: object) -> nn.Module:
        from dpcompare.models.resnet import resnet  # here, not at the top: it loads torch

        return resnet(arch, shape, n)
    return build


def _gpt(size: str) -> Builder:
    def build(shape: tuple[int, ...], n: int, seed: int = 0, **kw: object) -> nn.Module:
        from dpcompare.models.gpt import GPT, config_for  # here, not at the top: it loads torch

        c = config_for(size, vocab_size=n)
        if shape[0] > c.block_size:
            raise ConfigError(f"--seq-len {shape[0]} is longer than {size}'s context of {c.block_size} tokens; "
                              f"use --seq-len {c.block_size} or less")
        return GPT(c, seed=seed)
    return build


MODELS: dict[str, tuple[Builder, str]] = {
    "convnet": (_convnet, "two conv+BatchNorm blocks, as the IDRIS MNIST tutorial"),
    "mlp": (_mlp, "two hidden layers of --width units, no BatchNorm"),
    "resnet18": (_resnet("resnet18"), "torchvision ResNet-18 (needs [vision])"),
    "resnet50": (_resnet("resnet50"), "torchvision ResNet-50 (needs [vision])"),
    **{name: (_gpt(name), f"decoder-only transformer LM, {text}") for name, text in GPT_SIZES.items()},
}


def is_language_model(name: str) -> bool:
    """True for the models that read token ids and predict the next token (gpt-*, hf:NAME)."""
    return name in GPT_SIZES or name.startswith(HF_PREFIX)


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, **options: object) -> nn.Module:
    if name.startswith(HF_PREFIX):
        # lazy: it loads torch, numpy
        from dpcompare.models.hf import build_hf

        return build_hf(name[len(HF_PREFIX):], input_shape, num_classes, **options)
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return MODELS[name][0](tuple(input_shape), num_classes, **options)


def has_batchnorm(model: nn.Module) -> bool:
    from torch import nn  # here, not at the top: dpcompare --help loads this module

    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
