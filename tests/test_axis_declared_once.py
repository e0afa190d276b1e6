"""A comparison axis that is no train setting is ONE declaration: an :class:`~dpcompare.compare.axes.Axis` in
``AXES``. Two axes declared only here, as tests/test_fifth_strategy.py declares a strategy, go end to end with
no other file of dpcompare touched: compare's command line (``--sweep wind=...``, ``--gust N``) and its
``--help``, the plan that crosses the arms with them, the runs' train settings (``configure``) and what happens
before each run (``before_run``), the flags written back for ``--continue``, results.json's record
(``config.axes``, ``arms[].axes``), and the report's pairing: verdicts between arms at the same wind, in the
axis's own words, the gust's arms paired with their twins without it, and step time drawn against the wind.

The runs are stand-ins (tests/test_compare.py's ``fake_launch``): what is tested is the plumbing of the axis.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from test_compare import _parse_train, fake_launch

from dpcompare import cli
from dpcompare.compare import axes, runner
from dpcompare.compare.axes import TWIN, WITHIN, Axis
from dpcompare.config import TrainConfig
from dpcompare.report import groups as groups_m
from dpcompare.report import stats


def parse_wind(text: str) -> float:
    """A wind: a positive multiplier of the learning rate."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"wind={text!r}: give a positive number")
    return value


def _blow(cfg: TrainConfig, wind: float) -> TrainConfig:
    return dataclasses.replace(cfg, lr=cfg.lr * wind)


def _refuse_calm(c: Any, values: Any) -> None:
    from dpcompare.errors import ConfigError

    if len(c.nps) > 1:
        raise ConfigError("--sweep wind=... blows at one process count: give one --np")


BEFORE: list[tuple[object, float]] = []
WIND = Axis("wind", parse_wind, WITHIN, "a test axis: every arm runs in every wind (its learning rate times it)",
            metavar="W1,W2", words="in a {value} wind", title="wind (lr multiplier)", order=float,
            check=_refuse_calm, configure=_blow, before_run=lambda lab, w: BEFORE.append((lab, w)))
GUST = Axis("gust", int, TWIN, "a test axis: every arm runs once as it is and once for this many steps",
            metavar="STEPS", tag=lambda n: f"{n}steps",
            configure=lambda cfg, n: dataclasses.replace(cfg, max_steps=n))


@pytest.fixture
def declared(monkeypatch: pytest.MonkeyPatch) -> None:
    """The two axes, declared: one line each in ``AXES``, nothing else."""
    monkeypatch.setitem(axes.AXES, WIND.name, WIND)
    monkeypatch.setitem(axes.AXES, GUST.name, GUST)


def _parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["compare", *argv])


def test_the_command_line_and_the_plan(declared: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dpcompare.compare.cmdline import plan_flags
    from dpcompare.compare.command import comparison_of

    with pytest.raises(SystemExit):
        _parse("--help")
    said = " ".join(capsys.readouterr().out.split())
    assert "wind=W1,W2: a test axis: every arm runs in every wind" in said and "--gust STEPS" in said
    c = comparison_of(_parse("--np", "1", "--strategies", "ddp,horovod", "--sweep", "wind=1,0.5", "--gust", "7",
                             "--out", str(tmp_path)))
    assert c.sweeps == () and dict(c.axes) == {"wind": (1.0, 0.5), "gust": (7,)}
    labels = [f"{s}/wind={w}" for s in ("ddp", "horovod") for w in ("1.0", "0.5")]
    assert [a.label for a in c.all_arms] == labels + [f"{a},gust=7steps" for a in labels]
    again = comparison_of(_parse(*plan_flags(c), "--out", str(tmp_path)))  # --continue reads its flags back
    assert again.all_arms == c.all_arms and again.axes == c.axes
    for bad, words in ((["--sweep", "wind=1,-2"], "wind='-2': give a positive number"),
                       (["--np", "1,2", "--sweep", "wind=1,2"], "blows at one process count")):
        try:
            code = cli.main(["compare", "--strategies", "ddp,horovod", *bad, "--out", str(tmp_path / "x")])
        except SystemExit as e:  # argparse's own refusal, from the axis's parse
            code = e.code
        err = capsys.readouterr().err
        assert code == 2 and words in err and err.count("\n") == 1, err


def test_runs_results_and_report_pairing(declared: None, tmp_path: Path) -> None:
    from dpcompare.compare.command import comparison_of

    out = tmp_path / "cmp"
    c = comparison_of(_parse("--np", "1", "--strategies", "ddp,horovod", "--sweep", "wind=1,0.5", "--gust", "7",
                             "--repeats", "3", "--lr", "0.1", "--progress", "none", "--out", str(out)))
    seen: dict[str, tuple[float, int]] = {}
    # horovod 20 % slower in the calm (wind 1), 20 % faster in the 0.5 wind: a pairing across winds would mix them
    fake_launch.sps = lambda child, n, d: 1000.0 * (1.2 if child.strategy == "ddp" else 1.0) ** (  # type: ignore[attr-defined]
        1 if child.lr == pytest.approx(0.1) else -1) * (1 + 0.001 * int(d.name.split("-r")[1]))
    fake_launch.calls = []  # type: ignore[attr-defined]

    def launch(cmd: list[str], run_dir: Path, env: dict[str, str], timeout: float | None) -> tuple[int, float]:
        child = _parse_train(cmd[cmd.index("train") + 1:])
        seen[run_dir.name.split("-np")[0]] = (round(child.lr, 6), child.max_steps)
        return fake_launch(cmd, run_dir, env, timeout)

    BEFORE.clear()
    try:
        assert runner.run_compare(c, launch=launch) == 0
    finally:
        del fake_launch.sps  # type: ignore[attr-defined]
    assert seen["ddp-wind-1.0"] == (0.1, 0) and seen["horovod-wind-0.5"] == (0.05, 0)  # configure
    assert seen["ddp-wind-0.5-gust-7steps"] == (0.05, 7) and len(seen) == 8
    assert {w for _, w in BEFORE} == {1.0, 0.5} and {lab for lab, _ in BEFORE} == {None}  # before_run, no lab

    res = json.loads((out / "results.json").read_text())
    arms = {a["label"]: a for a in res["config"]["arms"]}
    assert arms["ddp/wind=0.5,gust=7steps"]["axes"] == {"wind": "0.5", "gust": "7"}
    assert arms["ddp/wind=0.5,gust=7steps"]["knobs"] == {}  # an axis, not a train setting
    assert res["config"]["axes"]["wind"] == {"pairs": "within", "words": "in a {value} wind",
                                             "title": "wind (lr multiplier)", "note": "", "values": ["0.5", "1.0"]}
    assert res["config"]["axes"]["gust"]["pairs"] == "twin"

    words = {(v["baseline"], v["other"]): (v["outcome"], v["text"]) for v in res["verdicts"]}
    assert set(words) == {("ddp/wind=1.0", "horovod/wind=1.0"), ("ddp/wind=0.5", "horovod/wind=0.5")}
    assert words[("ddp/wind=1.0", "horovod/wind=1.0")][0] == "slower"
    assert words[("ddp/wind=0.5", "horovod/wind=0.5")][0] == "faster"
    assert "than ddp at np=1 in a 0.5 wind" in words[("ddp/wind=0.5", "horovod/wind=0.5")][1]
    assert groups_m.twins(res, "gust") == {f"{s}/wind={w},gust=7steps": f"{s}/wind={w}"
                                           for s in ("ddp", "horovod") for w in ("1.0", "0.5")}
    assert [v.other for v in stats.report_verdicts(res)] == [o for _, o in words]  # read back, same pairing
    assert (out / "plots" / "axis-wind.png").stat().st_size > 10_000
