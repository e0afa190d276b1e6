"""Every place a run is described names the workload it trained and its metric: a plug-in whose metric is a hit
rate is never called "convnet · digits" or "test acc" (the defaults of --model, --dataset and the built-in metric).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import dpcompare, needs_mpi

HITS = '''
import torch
import torch.nn.functional as F
from dpcompare.data.workload import Metric, Workload


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=g)
    ds = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
    return ds, ds


HIT = Metric("hit rate", higher_is_better=True, unit="%",
             batch=lambda out, y: (float((out.argmax(1) == y).sum()), len(y)))
workload = Workload("recommender", build_model=lambda: torch.nn.Linear(8, 2), build_data=_data,
                    loss=F.cross_entropy, metrics=(HIT,))
'''

#: what must not describe a run of the plug-in: the built-in model and dataset, the built-in metric's name
WRONG = re.compile(r"convnet|digits|\bacc\b|accuracy", re.IGNORECASE)


def _visible(html: str) -> str:
    """The report's text and attributes, without its style sheet, embedded images and the settings' names (one
    of them is the --target-accuracy setting, whatever the metric)."""
    html = re.sub(r"<style>.*?</style>|src=\"data:[^\"]*\"", "", html, flags=re.S)
    return html.replace("<dt>target_accuracy</dt>", "")


@needs_mpi
def test_a_compare_of_a_plugin_names_its_workload_and_metric_everywhere(tmp_path: Path) -> None:
    (tmp_path / "hits.py").write_text(HITS)
    out = tmp_path / "cmp"
    p = dpcompare("compare", "--np", "2", "--strategies", "ddp", "--workload", "hits.py:workload", "--epochs", "1",
                  "--max-steps", "4", "--warmup-steps", "1", "--repeats", "1", "--min-steps", "0", "--threads", "1",
                  "--trackers", "csv", "--out", str(out), cwd=tmp_path)
    banner = (out / "runs" / "ddp-np2-r0" / "stdout.log").read_text()  # dpcompare train's own lines
    for text in (p.stdout, p.stderr, banner, _visible((out / "report.html").read_text())):
        assert not WRONG.search(text), WRONG.search(text)
    assert "Comparison recommender · 1 epochs" in p.stdout
    assert re.search(r"\[1/1\] ddp-np2-r0 .* · test hit rate \d+\.\d\d % ", p.stdout)
    assert "recommender (18 parameters; 512 train / 512 test samples; metric: hit rate)" in banner
    html = (out / "report.html").read_text()
    assert '<p class="sub">cpu · recommender · 1 epochs' in html and "Loss and hit rate per epoch" in html
    s = json.loads((out / "runs" / "ddp-np2-r0" / "summary.json").read_text())
    assert (s["model"], s["dataset"], s["workload"]["label"], s["metric"]["name"]) == (None, None, "recommender",
                                                                                       "hit rate")
    # what the trackers log as the run's config (W&B, MLflow, TensorBoard's text) is the same run_info
    assert (s["config"]["model"], s["config"]["workload_label"], s["config"]["metric"]) == (None, "recommender",
                                                                                            "hit rate")
    results = json.loads((out / "results.json").read_text())
    assert results["runs"][0]["workload"]["label"] == "recommender"


@pytest.mark.parametrize(("info", "label"), [({"model": "convnet", "dataset": "digits"}, "convnet · digits"),
                                             ({}, "recommender"), ({"model": "my.py:build"}, "my.py:build")])
def test_a_workload_label_is_its_model_and_dataset_or_its_name(info: dict, label: str) -> None:
    from dpcompare.data.workload import Workload

    assert Workload("recommender", list, list, len, (), info=info).label == label


def test_older_results_fall_back_to_the_settings() -> None:
    from dpcompare.report.groups import workload_label

    train = {"model": "gpt-tiny", "dataset": "pydoc", "workload": None}
    assert workload_label({"config": {"train": train}, "runs": [{"workload": None}]}) == "gpt-tiny · pydoc"
    assert workload_label({"config": {"train": {**train, "workload": "b.py:w"}}, "runs": []}) == "b.py:w"
