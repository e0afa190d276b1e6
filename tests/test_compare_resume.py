"""``dpcompare compare --continue DIR``: an interrupted comparison continues, keeping the runs that were ok."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from test_compare import fake_launch, run_compare

from dpcompare import cli
from dpcompare.compare import cmdline
from dpcompare.compare import command as compare
from dpcompare.compare.plan import Arm, Comparison, RunOptions, parse_setting
from dpcompare.compare.stopping import StoppingRule
from dpcompare.config import TrainConfig
from dpcompare.errors import ConfigError
from dpcompare.options import FIELDS, config_from_args

from conftest import DPCOMPARE, mpi_env, needs_horovod, needs_mpi


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
        run_compare(TrainConfig(epochs=1, lr=0.02), ["ddp", "single"], [1], 2, out, progress="lines",
                    launch=_interrupting_launch(after))
    assert "--continue" in capsys.readouterr().out


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
    rc = run_compare(TrainConfig(epochs=1, lr=0.02), ["ddp", "single"], [1], 2, out, progress="none",
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
        run_compare(TrainConfig(epochs=1, lr=0.02), ["ddp", "single"], [1], 3, out, progress="none",
                    launch=fake_launch, resume=True)
    with pytest.raises(ConfigError, match="train flags differs"):
        run_compare(TrainConfig(epochs=1, lr=0.5), ["ddp", "single"], [1], 2, out, progress="none",
                    launch=fake_launch, resume=True)
    # on the command line: one line naming the option, exit 2; options left out take the stored values
    assert cli.main(["compare", "--continue", str(out), "--lr", "0.1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--lr 0.1 differs from the stored comparison's 0.02" in err
    assert cli.main(["compare", "--continue", str(tmp_path / "nothing")]) == 2
    assert "no results.json" in capsys.readouterr().err
    p = cli.build_parser()
    a = p.parse_args(["compare", "--continue", str(out)])
    merged = compare.resumed_args(a)
    assert (merged.lr, merged.epochs, merged.strategies, merged.repeats, merged.out) == (
        0.02, 1, ["ddp", "single"], 2, str(out))


# -- what compare writes, compare reads back -----------------------------------------------------------------
CANDIDATES = ("3", "2", "1", "0.25", "0", "7", "auto", "x", "1,2", "3,16,16", "true", "false",
              "mlp", "synthetic", "my_pkg.bench:workload")


def _other_value(name: str, default: Any) -> Any:
    """A value of field ``name`` other than ``default``, parsed with the field's own type and choices."""
    f = FIELDS[name]
    choices = f.metadata.get("choices")
    texts = [*((choices() if callable(choices) else choices) or []), *CANDIDATES]
    for text in texts:
        try:
            value = parse_setting(name, str(text))
        except Exception:  # noqa: BLE001  (not a value of this field: try the next)
            continue
        if value != default:
            return value
    raise AssertionError(f"no test value for {name}: add one to CANDIDATES")


def _compare_default(name: str) -> Any:
    return cmdline.TRAIN_DEFAULTS.get(name, FIELDS[name].default)


@pytest.mark.parametrize("name", [n for n in FIELDS if n not in cmdline.NOT_STORED])
def test_every_train_setting_compare_stores_reads_back_the_same(name: str) -> None:
    """Each train setting, moved off compare's default: written as results.json keeps it, read back by the
    parser --resume uses, the same configuration (the --no-tensorboard bug of issue 27 was one of these)."""
    base = TrainConfig(**{k: v for k, v in cmdline.TRAIN_DEFAULTS.items()})
    cfg = dataclasses.replace(base, **{name: _other_value(name, _compare_default(name))})
    merged, _ = cmdline.stored_args(cmdline.train_flags(cfg))
    assert config_from_args(merged, out=cfg.out) == cfg, cmdline.train_flags(cfg)
    # and compare's own parser (the one the user meets) reads them too
    a = cli.build_parser().parse_args(["compare", *cmdline.train_flags(cfg)])
    assert config_from_args(a, out=cfg.out) == cfg


def test_all_train_settings_at_once_and_old_no_tensorboard_read_back() -> None:
    base = TrainConfig(**cmdline.TRAIN_DEFAULTS)
    changed = {n: _other_value(n, _compare_default(n)) for n in FIELDS if n not in cmdline.NOT_STORED}
    cfg = dataclasses.replace(base, **changed)
    merged, _ = cmdline.stored_args(cmdline.train_flags(cfg))
    assert config_from_args(merged, out=cfg.out) == cfg
    assert cmdline.train_flags(base) == []  # compare's defaults are not written
    # where compare's default is not train's, train's own default is a setting like any other
    own = dataclasses.replace(base, **{n: FIELDS[n].default for n in cmdline.TRAIN_DEFAULTS
                                       if n not in cmdline.NOT_STORED})
    assert own != base and config_from_args(cmdline.stored_args(cmdline.train_flags(own))[0], out=own.out) == own
    # comparisons stored before the fix kept --no-tensorboard, and before 0.3 --tensorboard: still readable
    assert cmdline.stored_args(["--no-tensorboard"])[0].tensorboard is False
    assert cmdline.stored_args(["--tensorboard"])[0].log == "tensorboard"


@pytest.mark.parametrize("c", [
    Comparison(TrainConfig(), (Arm("ddp", "ddp"), Arm("horovod", "horovod")), (2,)),
    Comparison(TrainConfig(), (Arm("ddp", "ddp"), Arm("ddp", "ddp")), (1, 2), StoppingRule(repeats=None, target_ci=0.02,
               max_repeats=40, time_budget=600, equivalence=0.03), options=RunOptions(workers="persistent")),
    Comparison(TrainConfig(), (Arm("base", "ddp"), Arm("fp16", "horovod", (("grad_compression", "fp16"),
                                                                          ("batch_size", 16)))), (2,),
               StoppingRule(repeats=2, seeds=(4,), accuracy_equivalence=0.01),
               sweeps=(("optimizer", ("sgd", "adam")),), options=RunOptions(project_link=None)),
], ids=["strategies", "a-a-auto-persistent", "variants-sweep-seed"])
def test_plan_flags_read_back_as_the_same_plan(c: Comparison, tmp_path: Path) -> None:
    merged, _ = cmdline.stored_args(cmdline.plan_flags(c))
    merged.out, merged.resume_dir, merged.overwrite, merged.progress = str(tmp_path), None, False, "none"
    back = compare.comparison_of(merged)
    assert (back.arms, back.nps, back.stopping, back.sweeps, back.options.workers, back.options.project_link) == (
        c.arms, c.nps, c.stopping, c.sweeps, c.options.workers, c.options.project_link)
    assert [a.label for a in back.all_arms] == [a.label for a in c.all_arms]


# -- the real thing: Ctrl-C a CLI comparison, then the command it prints ------------------------------------
FAST = ("--model", "convnet", "--dataset", "digits", "--threads", "1", "--warmup-steps", "2", "--min-steps", "10",
        "--epochs", "1")


def _wait_for(what: str, ready: Any, proc: subprocess.Popen[str], timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"compare ended before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.1)  # polling a file, bounded: not synchronisation by sleeping


def _one_ok_run(out: Path) -> bool:
    try:
        runs = json.loads((out / "results.json").read_text())["runs"]
    except (OSError, ValueError, KeyError):
        return False
    return len(runs) == 1 and runs[0]["status"] == "ok"


@needs_mpi
@needs_horovod
@pytest.mark.mpi
@pytest.mark.horovod
def test_ctrl_c_then_the_printed_resume_command_finishes_the_comparison(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    env = mpi_env()
    # Ctrl-C as a terminal delivers it, even when this suite runs with SIGINT ignored (a background `make test`
    # inherits SIG_IGN, and Python then never raises KeyboardInterrupt)
    proc = subprocess.Popen([DPCOMPARE, "compare", "--np", "1", "--strategies", "ddp,horovod", "--repeats", "1",
                             *FAST, "--progress", "lines", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # the second run started (its log exists; compare saves each run before the next starts): interrupt it
        # at once, without reading anything else first (the window is that run's few seconds)
        _wait_for("the second run", lambda: (out / "runs/horovod-np1-r0/stdout.log").exists(), proc)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stdout + stderr
    assert _one_ok_run(out)  # the first run recorded, the interrupted one not
    first = json.loads((out / "results.json").read_text())["runs"][0]
    printed = next(line for line in stdout.splitlines() if "continue with: " in line).split("continue with: ")[1]
    assert printed.split() == ["dpcompare", "compare", "--continue", str(out)]
    p = subprocess.run([DPCOMPARE, *printed.split()[1:]], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"resuming {out}: 1 finished runs are kept" in p.stdout
    res = json.loads((out / "results.json").read_text())
    assert res["complete"] and len(res["resumed"]) == 1
    runs = {Path(r["dir"]).name: r for r in res["runs"]}
    assert sorted(runs) == ["ddp-np1-r0", "horovod-np1-r0"] and all(r["status"] == "ok" for r in runs.values())
    assert runs["ddp-np1-r0"] == first  # kept as recorded, not rerun
    assert res["verdicts"] and "--tensorboard" not in res["config"]["train_flags"]


def test_a_comparison_stored_by_an_earlier_dpcompare_still_resumes(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Before issue 27 compare stored train flags relative to `dpcompare train`'s defaults (--no-tensorboard,
    --min-steps 200): its --resume reads them back, and the same settings written either way are the same plan."""
    from dpcompare.options import train_argv

    cfg = TrainConfig(epochs=1, lr=0.02, tensorboard=False, **cmdline.TRAIN_DEFAULTS)
    out = tmp_path / "cmp"
    fake_launch.calls = []  # type: ignore[attr-defined]
    with pytest.raises(KeyboardInterrupt):
        run_compare(cfg, ["ddp", "single"], [1], 2, out, progress="none", launch=_interrupting_launch(1))
    res = json.loads((out / "results.json").read_text())
    old = train_argv(cfg, skip=("strategy", "out", "overwrite", "progress"))
    assert "--no-tensorboard" in old and "--min-steps" in old
    assert res["config"]["train_flags"] == ["--epochs", "1", "--lr", "0.02", "--no-tensorboard"]
    res["config"]["train_flags"] = old
    (out / "results.json").write_text(json.dumps(res))
    merged = compare.resumed_args(cli.build_parser().parse_args(["compare", "--continue", str(out)]))
    assert (merged.tensorboard, merged.min_timed_steps, merged.lr) == (False, 200, 0.02)
    fake_launch.calls = []  # type: ignore[attr-defined]
    assert run_compare(cfg, ["ddp", "single"], [1], 2, out, progress="none", resume=True) == 0
    assert fake_launch.calls == ["single-np1", "single-np1", "ddp-np1"]  # type: ignore[attr-defined]
