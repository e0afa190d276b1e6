"""``dpcompare compare --resume DIR``: an interrupted comparison continues, keeping the runs that were ok."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_compare import fake_launch

from dpcompare import cli
from dpcompare.compare import command as compare
from dpcompare.config import TrainConfig
from dpcompare.errors import ConfigError


def _interrupting_launch(after: int):
    """fake_launch that is 'Ctrl-C'ed while starting run number ``after + 1``."""
    def launch(cmd: list[str], run_dir: Path, env: dict[str, str], timeout: float | None) -> tuple[int, float]:
        if len(fake_launch.calls) >= after:  # type: ignore[attr-defined]
            raise KeyboardInterrupt
        return fake_launch(cmd, run_dir, env, timeout)
    return launch


def _start(out: Path, after: int, capsys: pytest.CaptureFixture[str]) -> None:
    fake_launch.calls = []  # type: ignore[attr-defined]
    with pytest.raises(KeyboardInterrupt):
        compare.run_compare(TrainConfig(epochs=1, lr=0.02), ["ddp", "single"], [1], 2, out, progress="lines",
                            launch=_interrupting_launch(after))
    assert "--resume" in capsys.readouterr().out


def test_interrupted_compare_resumes_without_rerunning_finished_runs(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp"
    _start(out, 2, capsys)
    res = json.loads((out / "results.json").read_text())  # valid JSON after Ctrl-C
    assert not res["complete"] and [r["dir"] for r in res["runs"]] == ["runs/ddp-np1-r0", "runs/single-np1-r0"]
    # a failed run recorded before the interruption is run again, the ok one is kept
    res["runs"][1]["status"] = "failed"
    (out / "results.json").write_text(json.dumps(res))

    fake_launch.calls = []  # type: ignore[attr-defined]
    rc = compare.run_compare(TrainConfig(epochs=1, lr=0.02), ["ddp", "single"], [1], 2, out, progress="none",
                             launch=fake_launch, resume=True)
    assert rc == 0
    assert fake_launch.calls == ["single-np1", "single-np1", "ddp-np1"]  # type: ignore[attr-defined]
    res = json.loads((out / "results.json").read_text())
    assert res["complete"] and len(res["resumed"]) == 1
    assert [(Path(r["dir"]).name, r["status"]) for r in res["runs"]] == [
        ("ddp-np1-r0", "ok"), ("single-np1-r0", "ok"), ("single-np1-r1", "ok"), ("ddp-np1-r1", "ok")]


def test_resume_refuses_another_plan_or_configuration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp"
    _start(out, 1, capsys)
    with pytest.raises(ConfigError, match="repeats differs"):
        compare.run_compare(TrainConfig(epochs=1, lr=0.02), ["ddp", "single"], [1], 3, out, progress="none",
                            launch=fake_launch, resume=True)
    with pytest.raises(ConfigError, match="train flags differs"):
        compare.run_compare(TrainConfig(epochs=1, lr=0.5), ["ddp", "single"], [1], 2, out, progress="none",
                            launch=fake_launch, resume=True)
    # on the command line: one line naming the option, exit 2; options left out take the stored values
    assert cli.main(["compare", "--resume", str(out), "--lr", "0.1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--lr 0.1 differs from the stored comparison's 0.02" in err
    assert cli.main(["compare", "--resume", str(tmp_path / "nothing")]) == 2
    assert "no results.json" in capsys.readouterr().err
    p = cli.build_parser()
    a = p.parse_args(["compare", "--resume", str(out)])
    merged = compare.resumed_args(a)
    assert (merged.lr, merged.epochs, merged.strategies, merged.repeats, merged.out) == (
        0.02, 1, ["ddp", "single"], 2, str(out))
