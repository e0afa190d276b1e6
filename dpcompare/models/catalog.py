"""The language models' tables, without importing torch: the GPT sizes and the Hugging Face architectures
(read by :mod:`dpcompare.models`, which names every model, and by :mod:`.hf`, which builds ``hf:NAME``)."""

from __future__ import annotations

from typing import Any

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

#: hf:NAME → (transformers' config class, model class, config overrides, what it is); causal LMs over the config's
#: own vocabulary
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
