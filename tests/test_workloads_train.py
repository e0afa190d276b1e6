"""Workloads trained by the loop: a plug-in transformer written here trains to the same loss under ddp and
horovod, and the Python API example runs under mpirun. (The built-in GPT's parity under every strategy is
test_training_features.py's gpt-tiny test: the same run with every training feature on, exact everywhere.)

These need the loop that takes a Workload (branch "training")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import ROOT, dpcompare, mpi_env, needs_horovod, needs_mpi, run, summary

TRANSFORMER = '''
import torch
from torch import nn
from dpcompare.data.text import LM_METRICS, lm_loss, pydoc_corpus
from dpcompare.data.workload import Workload


class TinyLM(nn.Module):
    """A one-layer causal transformer over bytes."""

    def __init__(self, seq_len, width=32):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(256, width), nn.Embedding(seq_len, width)
        self.layer = nn.TransformerEncoderLayer(width, 2, 2 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.head = nn.Linear(width, 256)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tokens(idx) + self.positions.weight[:t]
        return self.head(self.layer(x, src_mask=self.mask[:t, :t], is_causal=True))


def workload(cfg):
    return Workload("tiny transformer", build_model=lambda: TinyLM(cfg.seq_len),
                    build_data=lambda: pydoc_corpus(cfg.seq_len), loss=lm_loss, metrics=LM_METRICS)
'''

FLAGS = ("--seq-len", "32", "--batch-size", "8", "--epochs", "1", "--max-steps", "6", "--no-tensorboard",
         "--threads", "1", "--warmup-steps", "1", "--progress", "none")


@needs_mpi
@needs_horovod
def test_a_plugin_transformer_compares_the_same_under_ddp_and_horovod(tmp_path: Path) -> None:
    """A compare of the plug-in: both arms end 0.0 apart, and the report names the workload's metric."""
    plugin = tmp_path / "tiny_lm.py"
    plugin.write_text(TRANSFORMER)
    out = tmp_path / "ab"
    dpcompare("compare", "--np", "2", "--strategies", "ddp,horovod", "--repeats", "1", "--min-steps", "0",
              "--workload", f"{plugin}:workload", *FLAGS, "--workers", "persistent", "--out", str(out))
    results = json.loads((out / "results.json").read_text())
    ddp, hvd = ({r["strategy"]: r for r in results["runs"]}[s] for s in ("ddp", "horovod"))
    assert ddp["status"] == hvd["status"] == "ok"
    assert ddp["metric"]["name"] == "perplexity" and not ddp["metric"]["higher_is_better"]
    assert ddp["final_train_loss"] == hvd["final_train_loss"]  # 0.0 apart
    assert ddp["final_metric"] == hvd["final_metric"] < 256  # it learnt something about the bytes
    s = summary(out / ddp["dir"])
    assert s["workload"]["source"] == f"{plugin}:workload"
    html = (out / "report.html").read_text()
    assert "test perplexity" in html and "test accuracy" not in html


@needs_mpi
@needs_horovod
def test_the_python_api_example_runs_under_mpirun(tmp_path: Path) -> None:
    """examples/train_my_model.py as docs/workloads.md tells users to run it (runs/ lands in the cwd)."""
    run(["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", sys.executable,
         str(ROOT / "examples" / "train_my_model.py")], env=mpi_env({"OMP_NUM_THREADS": "1"}), cwd=tmp_path)
    s = summary(tmp_path / "runs" / "example-horovod")
    assert s["strategy"] == "horovod" and s["world_size"] == 2 and s["metric"]["name"] == "accuracy"
    assert s["workload"]["source"] == "python:halves" and s["final_metric"] > 0.6
