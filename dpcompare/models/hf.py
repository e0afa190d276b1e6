"""Hugging Face architectures by name (``--model hf:gpt2``), built from ``transformers``' config classes.

Nothing is ever downloaded: the architectures dpcompare knows are written here as config classes with
their published sizes (transformers keeps the defaults of GPT-2 and BERT in code), the weights are random
(seeded), and no tokenizer is used (the text datasets are bytes, which every vocabulary here holds).
``HF_HUB_OFFLINE=1`` is set before transformers is imported, so a mistake cannot reach the hub either.
Dropout is set to 0: its random masks would differ between strategies and break parity.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from dpcompare.errors import ConfigError
from dpcompare.models.catalog import HF_ARCHITECTURES as ARCHITECTURES

_NO_DROPOUT = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout_prob", "attention_probs_dropout_prob")


def import_transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        # lazy: an optional dependency, tried where it is used
        import transformers
    except ImportError:
        raise ConfigError("--model hf:NAME needs the transformers package: pip install -e '.[hf]'") from None
    return transformers


def refuse_unknown(name: str) -> None:
    """One line for a name dpcompare cannot build offline (a hub id, pretrained weights, a tokenizer)."""
    if name in ARCHITECTURES:
        return
    why = ("a Hugging Face hub id would need a download" if "/" in name
           else f"{name!r} is not an architecture dpcompare can build from transformers' code")
    raise ConfigError(f"--model hf:{name}: {why}; dpcompare never downloads weights, configs or tokenizers. "
                      f"Offline it builds hf:{', hf:'.join(ARCHITECTURES)} with random weights")


class CausalLM(nn.Module):
    """Token ids → logits, hiding transformers' output object (the loss and metrics take a tensor)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=idx, use_cache=False).logits


def hf_config(name: str) -> Any:
    refuse_unknown(name)
    cfg_cls, _, overrides, _ = ARCHITECTURES[name]
    config = getattr(import_transformers(), cfg_cls)(**overrides)
    for key in _NO_DROPOUT:
        if hasattr(config, key):
            setattr(config, key, 0.0)
    return config


def build_hf(name: str, input_shape: tuple[int, ...], vocab: int, seed: int = 0, **_: object) -> nn.Module:
    """The architecture ``name`` with random weights drawn from ``seed``, reading ``input_shape=(seq_len,)``."""
    config = hf_config(name)
    positions = getattr(config, "n_positions", None) or config.max_position_embeddings
    if input_shape[0] > positions:
        raise ConfigError(f"--seq-len {input_shape[0]} is longer than hf:{name}'s {positions} positions")
    if vocab > config.vocab_size:
        raise ConfigError(f"hf:{name}'s vocabulary of {config.vocab_size} tokens cannot hold the dataset's {vocab}")
    model_cls = getattr(import_transformers(), ARCHITECTURES[name][1])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return CausalLM(model_cls(config))
