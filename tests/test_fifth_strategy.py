"""A fifth strategy, defined only here, runs under ``train``, ``compare`` and ``parity`` with no file of dpcompare
touched: the Strategy interface is enough. As a built-in it is its class and its catalog ``Entry``, nothing else:
the registry, results.json's facts, the report's card and threads wording and ``doctor``'s hint all read the entry
(:func:`test_a_built_in_is_its_class_and_its_catalog_entry`).

:class:`HandAllReduce` is DDP's arithmetic done by hand on the shared torch.distributed base: backward leaves
each rank's own gradients (summed over the micro-batches), and ``synchronize`` divides them by the number of
ranks and all-reduces them, one collective per parameter, before the update. At np=2 that is the same sum
DDP's buckets compute, so parity with ddp is exact (0.0).

This file is also the plug-in the child processes import (``--strategy tests/test_fifth_strategy.py:HandAllReduce``):
it imports only torch, pytest and dpcompare at module level.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dpcompare.backends.base import StrategyUnavailable
from dpcompare.backends.torchdist import TorchDistributedStrategy

SPEC = f"{Path(__file__).resolve()}:HandAllReduce"  # the plug-in form: path/to/file.py:Class
SHORT = ("--model", "mlp", "--dataset", "digits", "--threads", "1", "--trackers", "none")


class HandAllReduce(TorchDistributedStrategy):
    """Each parameter's gradient all-reduced by hand after the last backward (DDP's sum, without buckets)."""

    name = "hand-allreduce"
    summary = "gradients divided by the number of ranks and all-reduced by hand before the update (a test)"
    sync_mechanism = "synchronize(): one blocking all-reduce per parameter's gradient, after backward"
    communication = {"optimizer": "one blocking all-reduce per parameter's gradient before the update"}

    def synchronize(self, optimizer: torch.optim.Optimizer) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.div_(self.world_size)
                    dist.all_reduce(p.grad)
                    self.counters["grad_allreduces"] += 1
                    self.counters["grad_allreduce_elements"] += p.grad.numel()


class Fifth(HandAllReduce):
    """The same strategy as a built-in whose library is missing here (doctor then says how to install it)."""

    name = "fifth"

    @classmethod
    def check_available(cls) -> None:
        raise StrategyUnavailable("fifth-lib is not installed")


def test_a_built_in_is_its_class_and_its_catalog_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    from dpcompare import doctor
    from dpcompare.backends import catalog, registry
    from dpcompare.compare import records
    from dpcompare.report import attribution, mechanisms

    entry = catalog.Entry(f"{__name__}:Fifth", "a fifth built-in (a test)", HandAllReduce.communication,
                          elastic="torchrun", sync_mechanism=HandAllReduce.sync_mechanism,
                          card=("Fifth: reduced by hand", "one <em>blocking</em> all-reduce per gradient"),
                          elastic_card="restarted from checkpoints", threads="fifth-lib's pollers",
                          install="pip install fifth-lib 'torch=={torch}'")
    monkeypatch.setitem(catalog.STRATEGIES, "fifth", entry)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    cls = registry.get("fifth")
    assert cls.__name__ == "Fifth" and (cls.summary, cls.sync_mechanism) == (entry.summary, entry.sync_mechanism)
    assert records._strategy_facts("fifth")["sync_mechanism"] == entry.sync_mechanism
    assert catalog.check_arm_name("fifth-elastic") == "fifth-elastic" and not catalog.mpi_started("fifth")

    results = {"runs": [{"arm": a, "strategy": s, "elastic": e}
                        for a, s, e in (("ddp", "ddp", False), ("fifth", "fifth", False), ("fe", "fifth", True))]}
    cards = mechanisms.cards(results, ["ddp", "fifth", "fe"])
    assert "<h3>Fifth: reduced by hand</h3><p>one <em>blocking</em>" in cards
    assert "<h3>Fifth: reduced by hand · fifth-elastic</h3>" in cards and "restarted from checkpoints" in cards
    assert "PyTorch DDP: hooks on the model" in cards  # the built-ins' cards are entries too
    assert mechanisms.threads_of("fifth") == "fifth-lib's pollers" == mechanisms.threads_of("fifth-elastic")
    assert attribution.threads_of is mechanisms.threads_of

    info = {"mpi": {"mpirun": "mpirun"}, "mpi4py": {"installed": True}, "torchvision": "0.29", "trackers": {},
            "transformers": True, "strategies": {"fifth": cls.build_info()}}
    hint = {m["what"]: m["hint"] for m in doctor.missing(info)}["strategy fifth"]
    assert hint.startswith("pip install fifth-lib 'torch==") and "{torch}" not in hint
    info["strategies"] = {"fifth": {"installed": False, "error": "no fifth-lib"}}
    monkeypatch.setitem(catalog.STRATEGIES, "fifth", entry._replace(install=""))
    assert doctor.missing(info)[0] == {"what": "strategy fifth", "hint": "no fifth-lib"}  # no hint: its error


@pytest.mark.mpi
def test_trains_under_dpcompare_train_at_np2(tmp_path):
    from conftest import dpcompare, summary

    out = tmp_path / "run"
    p = dpcompare("train", "--strategy", SPEC, *SHORT, "--epochs", "1", "--max-steps", "6", "--accumulate", "2",
                  "--count-allreduces", "--out", str(out), np=2)
    s = summary(out)
    assert "dpcompare: hand-allreduce · 2 processes" in p.stdout
    assert s["strategy"] == "hand-allreduce" and s["world_size"] == 2 and s["steps"] == 6
    assert s["comm"]["library"] == "gloo"
    assert s["comm"]["grad_allreduces"] == 6 * 6  # the mlp's 6 tensors, once per step (not per micro-batch)
    assert s["final_train_loss"] < 2.3  # it learns (ln 10 = 2.30 is chance on digits)


def test_a_variant_carries_the_plug_in_and_reads_back() -> None:
    """``--variants NAME=FILE.py:CLASS[:knob=v,...]``: the plug-in's own ":" is no settings separator."""
    from dpcompare import cli
    from dpcompare.compare import cmdline, plan

    a = cli.build_parser().parse_args(["compare", "--variants", f"hand={SPEC}", f"small={SPEC}:batch_size=16",
                                       "mod=tests.test_fifth_strategy:HandAllReduce:accumulate=2,lr=0.1"])
    arms = plan.build_arms(a.strategies, a.variants)
    assert [(x.label, x.strategy, dict(x.knobs)) for x in arms] == [
        ("hand", SPEC, {}), ("small", SPEC, {"batch_size": 16}),
        ("mod", "tests.test_fifth_strategy:HandAllReduce", {"accumulate": 2, "lr": 0.1})]
    again = [plan.parse_variant(cmdline._variant(x)) for x in arms]  # --resume reads its own flags back
    assert again == arms


@pytest.mark.mpi
def test_runs_as_an_arm_of_dpcompare_compare(tmp_path):
    from conftest import dpcompare

    out = tmp_path / "cmp"
    # persistent workers: the plug-in is imported and trained inside compare's own long-lived job
    dpcompare("compare", "--np", "2", "--strategies", f"ddp,{SPEC}", *SHORT, "--epochs", "1", "--max-steps", "4",
              "--warmup-steps", "1", "--repeats", "2", "--workers", "persistent", "--out", str(out))
    results = json.loads((out / "results.json").read_text())
    runs = results["runs"]
    assert sorted({r["arm"] for r in runs}) == sorted(["ddp", SPEC])
    assert len(runs) == 4 and all(r["status"] == "ok" for r in runs), [r["error"] for r in runs]
    declared = results["environment"]["strategies"][SPEC]
    assert declared["summary"] == HandAllReduce.summary and declared["communication"] == HandAllReduce.communication


@pytest.mark.mpi
def test_passes_parity_with_ddp_exactly(tmp_path):
    from conftest import dpcompare

    out = tmp_path / "parity"
    p = dpcompare("parity", "--np", "2", "--strategies", f"ddp,{SPEC}", "--model", "mlp", "--steps", "12",
                  "--tolerance", "0", "--threads", "1", "--out", str(out))
    result = json.loads((out / "parity.json").read_text())
    assert result["passed"] and "PASS" in p.stdout
    assert result["diffs"][SPEC]["weights_max"] == 0.0 and result["diffs"][SPEC]["loss_max"] == 0.0
    assert "single" in result["diffs"]  # the one-process reference ran too: the plug-in is distributed


def test_a_spec_that_is_no_strategy_is_refused_in_one_line(tmp_path):
    from conftest import dpcompare

    for spec, words in [(f"{SPEC[:-len('HandAllReduce')]}SHORT", "has a tuple named 'SHORT', not a subclass"),
                        ("tests/test_fifth_strategy.py:Nope", "has nothing named 'Nope'")]:
        p = dpcompare("train", "--strategy", spec, *SHORT, "--out", str(tmp_path / "x"), check=False)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert words in p.stderr and "dpcompare.backends.base.Strategy" in p.stderr
