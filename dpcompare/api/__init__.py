"""dpcompare from Python: train your own workload under any strategy from your script, compare finished runs.

Run the script the way you run ``dpcompare train``, under the launcher::

    mpirun -np 2 python my_script.py

``dpcompare.train`` and ``dpcompare.compare_runs`` are these functions (``import dpcompare`` stays light: torch
is imported on the first call). This module also holds ``dpcompare workloads``, the list of built-ins.

A package rather than a top-level module only to keep the count of top-level modules within the house limit.
May import: anything. Like ``cli`` it stands above every room; nothing imports it but ``dpcompare/__init__``
and ``cli``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpcompare.config import TrainConfig
from dpcompare.data.catalog import DATASETS, TEXT_DATASETS
from dpcompare.data.plugins import resolve_workload
from dpcompare.errors import ConfigError
from dpcompare.files import SUMMARY
from dpcompare.models import HF_ARCHITECTURES, HF_PREFIX, MODELS, is_language_model

if TYPE_CHECKING:
    from dpcompare.data.workload import Workload


def train(workload: Workload | str | None = None, strategy: str = "horovod", *, epochs: int = 3,
          batch_size: int = 32, lr: float = 0.05, out: str | None = None, seed: int = 42, max_steps: int = 0,
          **settings: Any) -> dict[str, Any]:
    """Train ``workload`` under ``strategy`` as this process's rank of the job; return the run summary.

    Args:
        workload: a :class:`~dpcompare.data.workload.Workload`, a plug-in path (``"my_pkg.bench:workload"`` or
            ``"path/to/file.py:workload"``), or None for the built-in job that ``model=``/``dataset=`` name.
        strategy: ``single``, ``ddp``, ``horovod``, ``zero``, ``fsdp`` or your own Strategy subclass as
            ``MODULE:CLASS`` or ``path/to/file.py:CLASS``; every process of the job passes the same.
        epochs: as ``dpcompare train --epochs``.
        batch_size: per process, as ``--batch-size``.
        lr: as ``--lr`` (used as given under every strategy).
        seed: initial weights and data order, as ``--seed``.
        max_steps: stop after this many optimizer steps (0: every epoch), as ``--max-steps``.
        out: the run folder (summary.json, metrics.jsonl, checkpoints); default ``runs/<strategy>-np<N>``.
        settings: any other ``dpcompare train`` setting by its field name, e.g. ``optimizer="adam"``,
            ``accumulate=2``, ``checkpoint_every=1``, ``overwrite=True`` (``dpcompare train --help`` lists them).

    Returns the run summary (summary.json's content) on every rank. A setting or a workload that cannot work
    raises :class:`dpcompare.errors.ConfigError` (one line saying what to do) before any process group forms.
    """
    from dpcompare.training import loop  # here, not at the top: it loads torch and numpy and rich

    names = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(settings) - names)
    if unknown:
        raise ConfigError(f"dpcompare.train got unknown setting(s) {', '.join(unknown)}; see dpcompare train --help")
    spec = workload if isinstance(workload, str) else None
    cfg = TrainConfig(strategy=strategy, epochs=epochs, batch_size=batch_size, lr=lr, out=out, seed=seed,
                      max_steps=max_steps, **({"workload": spec} if spec else {}), **settings)
    job = resolve_workload(cfg, given=None if spec else workload)
    return loop.train(job.cfg, workload=job.workload)


def compare_runs(runs: list[str | Path]) -> list[dict[str, Any]]:
    """One row per finished run folder: strategy, world size, final loss and metric, throughput and step time.

    For a statistical verdict (paired repeats, intervals) run the comparison itself: ``dpcompare compare``.
    """
    rows = []
    for run in map(Path, runs):
        try:
            s = json.loads((run / SUMMARY).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(
                f"{run} holds no readable summary.json ({type(e).__name__}); is it a finished run?"
            ) from None
        metric = s.get("metric") or {"name": "accuracy", "higher_is_better": True}
        rows.append({"run": str(run), "strategy": s["strategy"], "world_size": s["world_size"],
                     "final_train_loss": s.get("final_train_loss"), "metric": metric["name"],
                     "final_metric": s.get("final_metric", s.get("final_test_accuracy")),
                     "samples_per_sec": s.get("samples_per_sec"),
                     "step_ms_median": s.get("timing", {}).get("step_ms_median")})
    return rows


WORKLOADS_TEXT = """\
Plug-ins: your own job under every strategy, with no change to dpcompare.

  1. A whole workload (model, data, loss, metrics) — in my_bench.py:

       import torch, torch.nn.functional as F
       from dpcompare.data.workload import Metric, Workload

       def workload(cfg):                  # or a Workload object, or a function of no argument
           def data():
               x = torch.randn(512, 16); y = x.sum(1, keepdim=True)
               ds = torch.utils.data.TensorDataset(x, y)
               return ds, ds
           mse = Metric("mse", higher_is_better=False,
                        batch=lambda out, y: (float(F.mse_loss(out, y, reduction="sum")), y.numel()))
           return Workload("regression", build_model=lambda: torch.nn.Linear(16, 1), build_data=data,
                           loss=F.mse_loss, metrics=(mse,))

     mpirun -np 2 dpcompare train --strategy ddp --workload my_bench.py:workload
     dpcompare compare --strategies ddp,horovod --workload my_pkg.bench:workload
     dpcompare parity --np 2 --workload my_bench.py:workload

  2. Only the model, on a built-in dataset:  --model my_pkg.models:build  (build(), build(cfg) or
     build(input_shape, num_classes); on pydoc/tokens input_shape is (seq_len,) and num_classes 256)
  3. Only the data, for a built-in model:   --dataset my_pkg.data:load   (returns (train, test) for a language
     model, (train, test, num_classes) for a classifier)
  4. A LightningModule, without the Trainer: --workload lightning:my_pkg.models:LitModel  (training_step's
     loss, configure_optimizers, the dataloaders' datasets, validation_step's self.log as metrics)

Every process imports the same plug-in; one that does not import, returns the wrong thing or whose output does not
fit its loss stops the job with one line (exit 2) before any process group forms, after one batch forward and
backward on the CPU, which also finds parameters without a gradient (DDP then runs with find_unused_parameters).
From Python: dpcompare.train(workload, strategy="horovod", epochs=3) inside a script run under mpirun
(see docs/workloads.md and examples/train_my_model.py)."""


def _cmd_workloads(a: argparse.Namespace) -> int:
    lms = [*(n for n in MODELS if is_language_model(n)), f"{HF_PREFIX}NAME"]
    kinds = (("image classification", [n for n in MODELS if not is_language_model(n)], list(DATASETS),
              "cross-entropy", "accuracy ↑"),
             ("language modelling (bytes)", lms, list(TEXT_DATASETS), "next-token cross-entropy",
              "perplexity ↓, token accuracy ↑"))
    lines = ["Built-in workloads: a model and a dataset of the same kind (--model M --dataset D)"]
    for kind, names, datasets, loss, metrics in kinds:
        lines += [f"  {kind}", f"    models:   {', '.join(names)}", f"    datasets: {', '.join(datasets)}",
                  f"    loss: {loss}; metrics: {metrics}"]
    for title, rows in (("Models", {n: h for n, (_, h) in MODELS.items()}),
                        ("Hugging Face architectures (--model hf:NAME; pip install -e '.[hf]'; random weights, "
                         "never downloaded)", {f"{HF_PREFIX}{n}": v[3] for n, v in HF_ARCHITECTURES.items()}),
                        ("Datasets", {n: h for n, (_, h) in {**DATASETS, **TEXT_DATASETS}.items()})):
        lines += ["", title, *(f"  {name:<22}{text}" for name, text in rows.items())]
    print("\n".join([*lines, "", WORKLOADS_TEXT]))
    return 0


def register(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("workloads", help="list the built-in models, datasets and workloads, and explain plug-ins",
                       description="List the built-in workloads, models and datasets, and show how to bring your own "
                                   "(--workload, --model and --dataset plug-ins, or dpcompare.train from Python).",
                       epilog="examples:\n  dpcompare workloads\n"
                              "  mpirun -np 2 dpcompare train --strategy ddp --workload path/to/bench.py:workload   # "
                              "your own",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=_cmd_workloads)
