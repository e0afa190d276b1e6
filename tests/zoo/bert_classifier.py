"""A BERT-style sentence classifier from Hugging Face transformers, built offline from a tiny ``BertConfig`` with
random weights (nothing is downloaded), as a user writes a plug-in. Its traits: dropout (0.1, transformers'
default) in the embeddings, attention and classifier, LayerNorm, an attention mask, a dict of inputs from a
collate function, and the model's own output object (``.logits``).

    dpcompare parity --np 2 --strategies ddp,horovod,zero,fsdp --workload tests/zoo/bert_classifier.py:workload
"""

import os

import torch
import torch.nn.functional as F

from dpcompare.data.workload import Metric, Workload

os.environ.setdefault("HF_HUB_OFFLINE", "1")
WORDS, LENGTH, LABELS = 100, 10, 2


class Sentences(torch.utils.data.Dataset):
    """Sentences of 4 to 10 word ids; the label says whether word 7 occurs."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.rows = [
            torch.randint(1, WORDS, (int(k),), generator=g) for k in torch.randint(4, LENGTH + 1, (n,), generator=g)
        ]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.rows[i], int(bool((self.rows[i] % 10 == 7).any()))


def collate(samples):
    ids = torch.zeros(len(samples), LENGTH, dtype=torch.long)  # 0 is the padding id
    for i, (row, _) in enumerate(samples):
        ids[i, :len(row)] = row
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}, torch.tensor([y for _, y in samples])


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertForSequenceClassification

        config = BertConfig(vocab_size=WORDS, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=LENGTH, num_labels=LABELS)
        self.bert = BertForSequenceClassification(config)

    def forward(self, inputs):
        return self.bert(**inputs).logits


def accuracy(logits, y):
    return float((logits.argmax(1) == y).sum()), len(y)


def workload() -> Workload:
    return Workload("tiny BERT classifier", build_model=Classifier,
                    build_data=lambda: (Sentences(256, 0), Sentences(64, 1)), loss=F.cross_entropy,
                    metrics=(Metric("accuracy", True, accuracy, unit="%"),), collate=collate)
