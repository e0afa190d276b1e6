"""Language modelling on real text that ships with every CPython, and on random tokens for throughput.

The corpus is ``pydoc_data/topics.py``: the Python reference's help texts (79 topics, ~0.47 M bytes, almost
all ASCII English). Tokens are its UTF-8 **bytes** (a vocabulary of 256): nothing to build, store or
download, every string encodes, and no token is ever unknown — a character vocabulary would depend on the
characters of this CPython's copy of the corpus, a registry tokenizer on a download. The split is the last
tenth of every topic (topics sorted by name): the test text is never trained on, and covers every topic
(the topics' sizes vary too much for a split by whole topics to hold a tenth of the text). Samples are
non-overlapping windows of ``seq_len + 1`` bytes: the model reads the first ``seq_len`` and predicts each next.

Metrics: perplexity (exp of the mean token negative log-likelihood, lower is better) and token accuracy.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from dpcompare import models
from dpcompare.data.catalog import TEXT_DATASETS
from dpcompare.data.workload import Metric, Workload
from dpcompare.errors import ConfigError

if TYPE_CHECKING:
    from dpcompare.config import TrainConfig

VOCAB = 256
TEST_SHARE = 10  # the last tenth of every topic is held out


class TokenWindows(Dataset):
    """Non-overlapping windows of a token stream: item i is (tokens[iT : iT+T], tokens[iT+1 : iT+T+1])."""

    def __init__(self, tokens: torch.Tensor, seq_len: int) -> None:
        self.tokens, self.seq_len = tokens, seq_len
        self.n = max((len(tokens) - 1) // seq_len, 0)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        w = self.tokens[i * self.seq_len: (i + 1) * self.seq_len + 1].long()
        return w[:-1], w[1:]


def pydoc_topics() -> dict[str, str]:
    # lazy: only the text dataset reads it
    from pydoc_data.topics import topics

    return topics


def pydoc_corpus(seq_len: int, **_: object) -> tuple[TokenWindows, TokenWindows]:
    """The pydoc topics as bytes: (train, test) windows of ``seq_len`` tokens; each topic's last tenth is test."""
    topics = pydoc_topics()
    train, test = [], []
    for name in sorted(topics):
        data = topics[name].encode()
        cut = len(data) - len(data) // TEST_SHARE
        train.append(data[:cut])
        test.append(data[cut:])
    as_tokens = lambda parts: torch.frombuffer(bytearray(b"\n\n".join(parts)), dtype=torch.uint8)  # noqa: E731
    return TokenWindows(as_tokens(train), seq_len), TokenWindows(as_tokens(test), seq_len)


def random_tokens(seq_len: int, samples: int = 1024, **_: object) -> tuple[TokenWindows, TokenWindows]:
    """``samples`` windows of fixed random bytes (whatever the run seed), an eighth of them for test."""
    g = torch.Generator().manual_seed(1234)
    n_test = max(samples // 8, 1)
    make = lambda n: torch.randint(0, VOCAB, (n * seq_len + 1,), generator=g, dtype=torch.uint8)  # noqa: E731
    return TokenWindows(make(samples - n_test), seq_len), TokenWindows(make(n_test), seq_len)


def lm_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every position of the batch."""
    return F.cross_entropy(output.flatten(0, 1), target.flatten())


def _nll(output: torch.Tensor, target: torch.Tensor) -> tuple[float, int]:
    nll = F.cross_entropy(output.detach().flatten(0, 1).float(), target.flatten(), reduction="sum")
    return float(nll), target.numel()


def _correct(output: torch.Tensor, target: torch.Tensor) -> tuple[float, int]:
    return float((output.detach().argmax(-1) == target).sum()), target.numel()


def _exp(mean_nll: float) -> float:
    return math.exp(min(mean_nll, 700.0))  # past e^700 a float overflows; such a model predicts nothing anyway


PERPLEXITY = Metric("perplexity", higher_is_better=False, batch=_nll, finish=_exp)
TOKEN_ACCURACY = Metric("token accuracy", higher_is_better=True, batch=_correct, unit="%")
LM_METRICS = (PERPLEXITY, TOKEN_ACCURACY)


def text_data(cfg: TrainConfig) -> tuple[Dataset, Dataset]:
    loader = globals()[TEXT_DATASETS[cfg.dataset][0]]
    train, test = loader(seq_len=cfg.seq_len, samples=cfg.samples)
    if len(train) == 0 or len(test) == 0:
        raise ConfigError(
            f"--seq-len {cfg.seq_len} leaves no whole sample in --dataset {cfg.dataset}; use a shorter one"
        )
    return train, test


def text_workload(cfg: TrainConfig) -> Workload:
    """A built-in language model (gpt-*, hf:NAME) on a built-in text dataset (pydoc, tokens)."""
    if cfg.dataset not in TEXT_DATASETS:
        raise ConfigError(f"--model {cfg.model} reads tokens: use a text --dataset ({', '.join(TEXT_DATASETS)})")
    if not models.is_language_model(cfg.model):
        lms = [n for n in models.MODELS if models.is_language_model(n)]
        raise ConfigError(f"--dataset {cfg.dataset} is text: use a language --model ({', '.join(lms)}, or "
                          f"{models.HF_PREFIX}NAME)")

    def build_model() -> torch.nn.Module:
        return models.build_model(cfg.model, (cfg.seq_len,), VOCAB, seed=cfg.seed)

    info: dict[str, Any] = {"model": cfg.model, "dataset": cfg.dataset, "tokens": "bytes", "vocab_size": VOCAB,
                            "seq_len": cfg.seq_len}
    return Workload(name=f"{cfg.model} on {cfg.dataset}", build_model=build_model, build_data=lambda: text_data(cfg),
                    loss=lm_loss, metrics=LM_METRICS, info=info)
