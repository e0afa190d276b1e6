"""``parity --script`` and ``compare --script``: a user's Horovod script, unchanged, as the arms of dpcompare's
checks — real Horovod, the native layer, the DDP port — each run a real ``mpirun -np 2`` job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ROOT, horovod_problem, in_process, missing, needs_mpi

EXAMPLES = ROOT / "examples" / "horovod"


@needs_mpi
def test_parity_script_finds_the_layer_exactly_equal_to_horovod(tmp_path: Path) -> None:
    if (problem := horovod_problem()) is not None:
        missing(problem)
    out = tmp_path / "parity"
    p = in_process(["parity", "--script", str(EXAMPLES / "objects.py"), "--np", "2", "--out", str(out), "--",
                    "--steps", "4"], env=None, timeout=900)
    result = json.loads((out / "parity.json").read_text())
    assert result["passed"] and result["reference"] == "horovod" and result["weights_max"] == {"native": 0.0}
    assert set(result["diffs"]["native"]) == {"body.0.weight", "body.0.bias", "main.weight", "main.bias",
                                              "aux.weight", "aux.bias"}
    assert "PASS: native matches horovod" in p.stdout
    assert (out / "native" / "stdout.log").read_text().count("settings {") == 1  # the script's own output, kept


@needs_mpi
def test_compare_script_gives_a_verdict_and_a_report(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    in_process(["compare", "--script", str(EXAMPLES / "mnist.py"), "--strategies", "native,ddp", "--np", "2",
                "--repeats", "1", "--warmup-steps", "2", "--metric", "avg_accuracy", "--progress", "none",
                "--out", str(out), "--", "--epochs", "1", "--weight-decay", "0"], timeout=900)
    results = json.loads((out / "results.json").read_text())
    runs = {r["arm"]: r for r in results["runs"]}
    assert set(runs) == {"native", "ddp"} and all(r["status"] == "ok" for r in runs.values())
    assert all(r["step_ms"]["median"] > 0 and r["measured_steps"] == 23 - 2 for r in runs.values())
    assert runs["native"]["final_metric"] is not None and runs["native"]["metric"]["name"] == "avg_accuracy"
    # the port's all-reduce helper names its metric in an audit event: the ddp arm records it too
    assert runs["ddp"]["final_metric"] == pytest.approx(runs["native"]["final_metric"], abs=0.05)
    [verdict] = results["verdicts"]
    assert verdict["baseline"] == "native" and verdict["other"] == "ddp" and verdict["metric"] == "throughput"
    assert results["config"]["script"]["args"] == ["--epochs", "1", "--weight-decay", "0"]
    assert (out / "mnist_ddp.py").is_file()  # the port migrate writes, for the ddp arm
    assert "Test set:" in (out / "runs" / "native-np2-r0" / "stdout.log").read_text()
    page = (out / "report.html").read_text()
    assert "script mnist.py --epochs 1" in page
    # the why cards of the arms that ran (the native layer, DDP), none for Horovod, which did not
    assert "The native layer: Horovod&#x27;s API" in page and "PyTorch DDP: hooks on the model" in page
    assert "Horovod: hooks in the optimizer" not in page
    for r in runs.values():  # what took the cores, per rank, after the warm-up steps
        assert [x["rank"] for x in r["cpu_ms"]["per_rank"]] == [0, 1] and r["cpu_ms"]["main"] > 0


def test_compare_script_flags_are_read_back_for_resume(tmp_path: Path) -> None:
    from dpcompare.cli import build_parser
    from dpcompare.compare.cmdline import plan_flags, stored_args
    from dpcompare.compare.command import comparison_of
    from dpcompare.compare.script import script_plan

    script = EXAMPLES / "objects.py"
    a = build_parser().parse_args(["compare", "--script", str(script), "--strategies", "horovod,native",
                                   "--metric", "loss:lower", "--global-batch", "64", "--out", str(tmp_path), "--",
                                   "--steps", "3", "-x=1"])
    c = comparison_of(a)
    assert c.script.args == ("--steps", "3", "-x=1") and c.script.global_batch == 64
    back = stored_args(plan_flags(c))[0]
    assert script_plan(back, ["horovod", "native"], tmp_path) == c.script


@pytest.mark.parametrize("args, says", [
    (["--strategies", "native,ddp"], "add --script FILE"),
    (["--script", "nope.py"], "--script nope.py: no such file"),
    (["--script", str(EXAMPLES / "objects.py"), "--strategies", "horovod,zero"], "not zero"),
    (["--script", str(EXAMPLES / "objects.py"), "--variants", "a=horovod", "b=native"], "--variants"),
    (["--script", "UNPORTABLE", "--strategies", "horovod,ddp"],
     "which dpcompare migrate did not write (`hvd.alltoall(x)`: no automatic translation"),
])
def test_compare_script_refusals_are_one_line(args: list[str], says: str, tmp_path: Path) -> None:
    unportable = tmp_path / "unportable.py"  # a call migrate has no translation for
    unportable.write_text("import torch\nimport horovod.torch as hvd\n\nhvd.init()\nx = torch.zeros(2)\n"
                          "hvd.alltoall(x)\n")
    args = [str(unportable) if a == "UNPORTABLE" else a for a in args]
    p = in_process(["compare", *args, "--out", str(tmp_path / "o")], check=False)
    assert p.returncode == 2 and says in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "No DDP port written" not in p.stderr  # one sentence, not two joined
