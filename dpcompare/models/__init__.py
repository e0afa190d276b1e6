"""Models by name: ``build_model(name, input_shape, num_classes, width=...)``.

The table names and describes every model without importing torch (the command line lists it); a model's
module is imported when it is built. Language models (``gpt-*``, ``hf:NAME``) take ``input_shape=(seq_len,)``
and ``num_classes=vocabulary size``.

May import: the top-level modules only (errors).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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


def _gpt(size: str) -> Builder:
    def build(shape: tuple[int, ...], n: int, seed: int = 0, **kw: object) -> nn.Module:
        from dpcompare.models.gpt import GPT, config_for

        c = config_for(size, vocab_size=n)
        if shape[0] > c.block_size:
            raise ConfigError(f"--seq-len {shape[0]} is longer than {size}'s context of {c.block_size} tokens; "
                              f"use --seq-len {c.block_size} or less")
        return GPT(c, seed=seed)
    return build


#: language models: (layers, heads, width, context) and their parameters with the 256-byte vocabulary
GPT_SIZES: dict[str, str] = {
    "gpt-tiny": "4 layers, 4 heads, 128 wide, context 256: 0.86 M parameters",
    "gpt-mini": "6 layers, 8 heads, 256 wide, context 256: 4.9 M parameters",
    "gpt-small": "6 layers, 6 heads, 384 wide, context 256 (nanoGPT's shakespeare-char): 10.8 M parameters",
    "gpt-base": "8 layers, 8 heads, 512 wide, context 512: 25.6 M parameters",
    "gpt2-small": "GPT-2 small's shape (12 layers, 12 heads, 768 wide, context 1024): 86.0 M parameters with "
                  "the byte vocabulary (GPT-2's 50257-token table makes it 124 M)",
}

#: the prefix of Hugging Face architectures built from transformers' own config classes (models/hf.py)
HF_PREFIX = "hf:"

#: hf:NAME → (transformers' config class, model class, config overrides, what it is); causal LMs over the config's own vocabulary
HF_ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {}, "GPT-2 small, 124 M parameters"),
    "distilgpt2": ("GPT2Config", "GPT2LMHeadModel", {"n_layer": 6}, "DistilGPT-2's shape, 82 M parameters"),
    "gpt2-medium": ("GPT2Config", "GPT2LMHeadModel", {"n_embd": 1024, "n_layer": 24, "n_head": 16},
                    "GPT-2 medium, 355 M parameters"),
    "bert-base-uncased": ("BertConfig", "BertLMHeadModel", {"is_decoder": True},
                          "BERT base (uncased vocabulary size) as a causal decoder, 110 M parameters"),
    "bert-base-cased": ("BertConfig", "BertLMHeadModel", {"is_decoder": True, "vocab_size": 28996},
                        "BERT base (cased vocabulary size) as a causal decoder, 108 M parameters"),
    "bert-large-uncased": ("BertConfig", "BertLMHeadModel",
                           {"is_decoder": True, "hidden_size": 1024, "num_hidden_layers": 24,
                            "num_attention_heads": 16, "intermediate_size": 4096},
                           "BERT large as a causal decoder, 335 M parameters"),
}

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
        from dpcompare.models.hf import build_hf

        return build_hf(name[len(HF_PREFIX):], input_shape, num_classes, **options)
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return MODELS[name][0](tuple(input_shape), num_classes, **options)


def has_batchnorm(model: nn.Module) -> bool:
    from torch import nn

    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
