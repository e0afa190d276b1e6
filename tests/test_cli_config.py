"""``--config FILE.toml`` and the config.toml every run writes: a comparison reruns from its own file with the same
arms and settings, flags given beside the file win, a bad file is one line, and every command's file reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]
from rich.console import Console

from dpcompare import cli
from dpcompare.compare import runner
from dpcompare.compare.command import comparison_of
from dpcompare.options import CONFIG_FILE, config_from_args, given_settings, write_config, write_train_config


def _launch(calls: list[list[str]]):
    """Stands in for mpirun: records the train command (less its run folder) and writes a run's files."""
    def launch(cmd: list[str], run_dir: Path, env: dict[str, str], timeout: float | None) -> tuple[int, float]:
        calls.append([x for x in cmd if str(run_dir) not in x])
        (run_dir / "summary.json").write_text(json.dumps({
            "final_test_accuracy": 0.9, "samples_per_sec": 1000.0,
            "timing": {"samples_per_sec": 1000.0, "measured_steps": 9, "step_ms_median": 5.0, "step_ms_p95": 6.0,
                       "phases_ms": {"data": 0.1, "forward": 1.0, "backward": 1.0, "optimizer": 1.0}}}))
        (run_dir / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "test_accuracy": 0.9}) + "\n")
        return 0, 1.0
    return launch


def _compare(argv: list[str]) -> tuple[dict, list[list[str]]]:
    a = cli.parse(["compare", *argv, "--progress", "none"])
    calls: list[list[str]] = []
    assert runner.run_compare(comparison_of(a), launch=_launch(calls), console=Console(quiet=True)) == 0
    return json.loads((Path(a.out) / "results.json").read_text())["config"], calls


def test_compare_reruns_from_its_config_toml(tmp_path: Path) -> None:
    first, calls = _compare(["--variants", "base=ddp", "fp16=ddp:grad_compression=fp16", "--np", "1,2",
                             "--sweep", "batch_size=16,32", "--repeats", "1", "--lr", "0.01", "--epochs", "1",
                             "--equivalence", "3", "--project-link", "10gbit", "--out", str(tmp_path / "a")])
    written = (tmp_path / "a" / CONFIG_FILE).read_text()
    assert "\nlr = 0.01\n" in written and "\nequivalence = 3\n" in written and "\nout =" not in written
    assert "\nseed = 42\n" in written and "\nwarmup-steps = 5\n" in written  # the defaults too
    assert 'project-link = "10gbit"' in written  # a run option that changes the report: rerun it too
    again, calls_again = _compare(["--config", str(tmp_path / "a" / CONFIG_FILE), "--out", str(tmp_path / "b")])
    assert "--project-link" in again["cli"]
    for key in ("arms", "np", "repeats", "equivalence", "train", "train_flags", "cli"):
        assert again[key] == first[key] if key != "train" else \
            {**again[key], "out": None} == {**first[key], "out": None}, key
    assert len(calls) == 8 and calls_again == calls  # the same runs, each with the same train command
    assert (tmp_path / "b" / CONFIG_FILE).read_text() == written.replace(str(tmp_path / "a"), str(tmp_path / "b"))
    # a flag given beside the file wins; the rest is the file's
    a = cli.parse(["compare", "--config", str(tmp_path / "a" / CONFIG_FILE), "--lr", "0.02", "--np", "4"])
    assert (a.lr, a.np, a.epochs, [v.label for v in a.variants]) == (0.02, [4], 1, ["base", "fp16"])


def test_a_bad_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    for text, says in (("bogus = 1\n", "bogus is no option of dpcompare compare"),
                       ("np = 'x'\n", "np = 'x'"), ("np = [\n", "not a TOML file"), ("replay = 3\n", "true or false")):
        bad.write_text(text)
        assert cli.main(["compare", "--config", str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err and str(bad) in err, err
    assert cli.main(["train", "--config", str(tmp_path / "none.toml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_train_parity_predict_configs_read_back(tmp_path: Path) -> None:
    a = cli.parse(["train", "--strategy", "ddp", "--batch-size", "64", "--no-tensorboard", "--input-shape", "1,8,8",
                   "--min-steps", "7", "--out", "x"])
    cfg = config_from_args(a)
    write_train_config(tmp_path / "t.toml", cfg)
    back = config_from_args(cli.parse(["train", "--config", str(tmp_path / "t.toml"), "--out", "x"]))
    assert back == cfg
    for argv, check in (
            (["parity", "--np", "3", "--no-single", "--strategies", "ddp,zero", "--lr", "0.1"],
             lambda b: (b.np, b.single, b.strategies, b.lr) == (3, False, ["ddp", "zero"], 0.1)),
            (["predict", "r1", "r2", "--link", "1gbit", "--grad-compression", "fp16", "--host-counts", "2,4"],
             lambda b: (b.run_dirs, b.link, b.compression, b.hosts) == (["r1", "r2"], 10**9, "fp16", "2,4"))):
        given = cli.parse(argv)
        write_config(tmp_path / f"{argv[0]}.toml", given.commands[argv[0]], given_settings(given))
        b = cli.parse([argv[0], "--config", str(tmp_path / f"{argv[0]}.toml")])
        assert check(b), (argv, vars(b))


def test_old_spellings_warn_once_and_mean_the_new_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from dpcompare.options import Renamed

    old_new = [(["train", "--log", "csv"], ["train", "--trackers", "csv"]),
               (["compare", "--resume", "runs/x"], ["compare", "--continue", "runs/x"]),
               (["predict", "r", "--cycle-ms", "2", "--hosts", "2,4"],
                ["predict", "r", "--horovod-cycle-ms", "2", "--host-counts", "2,4"]),
               (["lab", "bench", "--warmup", "3", "--timeout", "9", "--out", "b.json"],
                ["lab", "bench", "--warmup-steps", "3", "--run-timeout", "9", "--out-file", "b.json"]),
               (["lab", "up", "--hosts", "3"], ["lab", "up", "--host-count", "3"])]
    for old, new in old_new:
        a, b = cli.parse(old), cli.parse(new)
        skip = ("argv", "commands", "func")
        assert {k: v for k, v in vars(a).items() if k not in skip} == {
            k: v for k, v in vars(b).items() if k not in skip
        }
        err = capsys.readouterr().err.splitlines()
        assert len(err) == sum(x.startswith("--") and x not in new for x in old) and all("use --" in e for e in err)
    cli.parse(["predict", "r", "--fp16"])
    assert "use --grad-compression fp16" in capsys.readouterr().err
    for sp in cli.subcommands(cli.build_parser()):  # every old spelling is hidden, and its new one is shown
        for act in sp.options:
            if isinstance(act, Renamed):
                assert act.help == "==SUPPRESS==" and sp.flags[act.new.split()[0]].help != "==SUPPRESS=="


def test_a_flag_name_has_one_meaning() -> None:
    seen: dict[str, set[str]] = {}
    for sp in cli.subcommands(cli.build_parser()):
        for act in sp.options:
            if act.help != "==SUPPRESS==" and act.option_strings:
                seen.setdefault(act.option_strings[0], set()).add(str(act.metavar))
    assert seen["--out"] <= {"None", "DIR"}  # a folder everywhere: a file is --out-file
    assert seen["--hosts"] == {"H1:N,H2:N"} and "--log" not in seen and "--force" not in seen
    assert seen["--resume"] == {"PATH|auto"} and seen["--timeout"] == {"None"}


@pytest.mark.parametrize("argv", [
    ["train", "--strategy", "ddp", "--trackers", "none", "--max-steps", "3"],
    ["compare", "--np", "1,2", "--sweep", "batch-size=8,16", "--variants", "a=ddp", "b=horovod:trackers=csv"],
    ["parity", "--no-single", "--steps", "7"],
    ["predict", "r1", "--link", "1gbit", "--fp16"],
])
def test_print_config_is_the_whole_configuration_and_reads_back(argv: list[str], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """--print-config runs nothing: it prints every option (defaults included) as TOML; read back with --config,
    it is the same command, also when a default changes later (the file names every value)."""
    assert cli.main([*argv, "--print-config"]) == 0
    text = capsys.readouterr().out
    table = tomllib.loads(text)
    assert "print-config" not in table and "out" not in table
    assert {"batch-size", "lr", "seed", "epochs"} <= set(table) or argv[0] == "predict"
    if argv[0] == "predict":
        assert table["grad-compression"] == "fp16" and table["bootstrap"] == 200 and table["link"] == "1gbit"
    if argv[0] == "train":
        assert table["trackers"] == "none" and table["max-steps"] == 3 and table["warmup-steps"] == 5
    (tmp_path / "c.toml").write_text(text)
    a, b = cli.parse(argv), cli.parse([argv[0], "--config", str(tmp_path / "c.toml")])
    skip = {"argv", "config_raw", "config", "commands", "func"}
    assert {k: v for k, v in vars(a).items() if k not in skip} == {k: v for k, v in vars(b).items() if k not in skip}


def test_a_written_config_keeps_the_defaults_too(tmp_path: Path) -> None:
    cfg = config_from_args(cli.parse(["train", "--batch-size", "64"]))
    write_train_config(tmp_path / "t.toml", cfg)
    table = tomllib.loads((tmp_path / "t.toml").read_text())
    assert table["batch-size"] == 64 and table["lr"] == cfg.lr and table["epochs"] == cfg.epochs
    assert "defaults included" in (tmp_path / "t.toml").read_text()
