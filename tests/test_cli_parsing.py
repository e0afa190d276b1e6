"""The parser as a user meets it: a bare command, an unknown flag, every old spelling, and argparse's public API
only (its private state changes between Python releases without a word)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from dpcompare import cli
from dpcompare.options import Renamed

from conftest import ROOT

#: argparse's private names: reading or writing any of them in dpcompare/ is a bug waiting for a Python upgrade
PRIVATE = re.compile(r"\._(actions|option_string_actions|action_groups|group_actions|subparsers|get_formatter|"
                     r"format_args|expand_help|add_action|registries|registry_get|defaults|positionals|optionals|"
                     r"mutually_exclusive_groups|name_parser_map|choices_actions|get_values|check_value|"
                     r"parse_known_args|get_optional_actions|get_positional_actions)\b|argparse\._|__class__ *=")


def test_no_argparse_private_state_in_the_package() -> None:
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in sorted((ROOT / "dpcompare").rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if PRIVATE.search(line)]
    assert found == []
    assert PRIVATE.search("x = p._option_string_actions[flag]") and PRIVATE.search("alias.__class__ = type(x)")


def test_a_bare_dpcompare_shows_its_commands_and_exits_0() -> None:
    p = subprocess.run([sys.executable, "-m", "dpcompare"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0 and "COMMAND" in p.stdout and "compare" in p.stdout and p.stderr == ""


@pytest.mark.parametrize(("argv", "said"), [
    (["compare", "--bach-size=4"], "dpcompare compare: error: unrecognized arguments: --bach-size=4; did you mean "
                                      "--batch-size? (see dpcompare compare --help)"),
    (["lab", "up", "--host-cuont", "2"], "dpcompare lab up: error: unrecognized arguments: --host-cuont 2; did you "
                                         "mean --host-count?"),
    (["predict", "--zzz"], "dpcompare predict: error: unrecognized arguments: --zzz (see dpcompare predict --help)"),
])
def test_an_unknown_flag_is_named_by_its_command_with_the_nearest_one(argv: list[str], said: str,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.parse(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and said in err, err


def test_every_old_spelling_is_hidden_and_warns(capsys: pytest.CaptureFixture[str]) -> None:
    renamed = {(sp.prog, a.option_strings[0]): a for sp in cli.subcommands(cli.build_parser()) for a in sp.options
               if isinstance(a, Renamed)}
    assert {("dpcompare slurm", "--out"), ("dpcompare timeline", "--out"), ("dpcompare compare", "--no-tensorboard"),
            ("dpcompare predict", "--fusion-mb"), ("dpcompare train", "--log")} <= set(renamed)
    a = cli.parse(["compare", "--no-tensorboard"])
    assert a.tensorboard is False and "--no-tensorboard is deprecated" in capsys.readouterr().err
    a = cli.parse(["predict", "r", "--fusion-mb", "8"])
    assert a.horovod_fusion_mb == 8.0 and "use --bucket-mb" in capsys.readouterr().err
    a = cli.parse(["timeline", "r", "--out", "t.png"])
    assert a.out == "t.png" and "use --out-file" in capsys.readouterr().err


def test_slurm_out_still_writes_the_script(tmp_path) -> None:
    """A job script written against 0.1 (`slurm --out FILE`) keeps working, with its warning."""
    script = tmp_path / "job.sh"
    argv = [sys.executable, "-m", "dpcompare", "slurm", "--nodes", "1", "--time", "0:10:00"]
    p = subprocess.run([*argv, "--out", str(script), "--", "train", "--strategy", "ddp"], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "--out is deprecated and goes in the next release; use --out-file" in p.stderr
    assert "train --strategy ddp" in script.read_text()
    p = subprocess.run([*argv, "--", "train"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "needs --out-file FILE" in p.stderr


def test_sweep_and_variants_take_the_flag_names_users_type() -> None:
    a = cli.parse(["compare", "--sweep", "min-steps=10,20", "--sweep", "threads=0,2",
                   "--variants", "a=ddp:trackers=csv", "b=ddp:batch-size=8,log=none", "c=ddp:batch_size=16"])
    assert a.sweep == [("min_timed_steps", [10, 20]), ("threads", [0, 2])]
    assert [v.knobs for v in a.variants] == [(("log", "csv"),), (("batch_size", 8), ("log", "none")),
                                             (("batch_size", 16),)]
    for bad in (["--sweep", "no-tensorboard=true"], ["--sweep", "nope=1"], ["--variants", "a=ddp:min-step=3"]):
        with pytest.raises(SystemExit):
            cli.parse(["compare", *bad])


def test_compare_plan_lists_the_runs_and_their_time_then_exits(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    out = tmp_path / "cmp"
    argv = ["compare", "--np", "1,2", "--sweep", "batch-size=16,64", "--repeats", "3", "--out", str(out), "--plan"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "4 arms × 2 process counts (np 1,2) = 8 runs a block" in text and "blocks: 3 (3 repeats): 24 runs" in text
    assert "block 2: horovod-batch_size-64-np2-r1," in text and "... 1 more block alike" in text
    assert "not known before a run is timed" in text and "at most 12 h 00 min: 24 runs × --run-timeout 1800 s" in text
    assert not out.exists()  # nothing ran, nothing was written
    out.mkdir()
    runs = [{"status": "ok", "wall_seconds": s} for s in (9.0, 10.0, 11.0, 500.0)] + [{"status": "failed"}]
    (out / "results.json").write_text(json.dumps({"runs": runs}))
    assert cli.main([*argv, "--repeats", "auto", "--max-repeats", "10", "--time-budget", "900"]) == 0
    text = capsys.readouterr().out
    assert "from 6 to at most 10 blocks (48 to 80 runs)" in text
    assert (
        "time: about 13 min 08 s for the 75 runs left (the median of the 4 ok runs" in text and "10.5 s a run" in text
    )
    assert "--time-budget 900 s: no block starts that would end after 15 min 00 s" in text


#: a value for each old spelling that takes one, and what each command needs besides
OLD_VALUES = {"--log": "csv", "--resume": "runs/x", "--cycle-ms": "2", "--fusion-mb": "8", "--warmup": "2",
              "--timeout": "9", "--out": "f.out"}
NEEDS = {"dpcompare slurm": ["--nodes", "1", "--time", "0:10:00"], "dpcompare timeline": ["r"]}


def test_every_old_spelling_parses_with_one_warning(capsys: pytest.CaptureFixture[str]) -> None:
    """Each hidden old spelling of every command, read by the command line: it parses, warns once naming the new
    spelling, and sets what the new one sets (a new old spelling needs its value here, or this test fails)."""
    seen = 0
    for sp in cli.subcommands(cli.build_parser()):
        for act in (a for a in sp.options if isinstance(a, Renamed)):
            old = act.option_strings[0]
            hosts = {"dpcompare lab up": "3", "dpcompare predict": "2,4"}.get(sp.prog) if old == "--hosts" else None
            value = [] if act.nargs == 0 else [hosts or OLD_VALUES[old]]
            a = cli.parse([*sp.prog.split()[1:], *NEEDS.get(sp.prog, []), old, *value])
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and f"{old} is deprecated" in err and f"use {act.new}" in err, (sp.prog, err)
            assert getattr(a, act.dest) == (act.const if act.nargs == 0 else act.type(value[0]) if act.type
                                            else value[0]), (sp.prog, old)
            seen += 1
    assert seen >= 20
