"""The command line: one-line errors with exit code 2, --help, doctor."""

import json

import pytest

from dpcompare.cli import main

from conftest import DPCOMPARE, FAST, dpcompare, needs_mpi, run


@pytest.mark.parametrize("args, words", [
    (["train", "--strategy", "nope"], "unknown strategy nope; choose from ddp, fsdp, horovod, single, zero, or "
                                      "name your own Strategy subclass as MODULE:CLASS or path/to/file.py:CLASS"),
    (["train", "--strategy", "no_such_module:Strategy"], "cannot import 'no_such_module'"),
    (["train", "--strategy", "dpcompare.knobs:Knob"], "not a subclass of dpcompare.backends.base.Strategy"),
    (["train", "--strategy", "tests/nonexistent.py:S"], "no file tests/nonexistent.py"),
    (["train", "--model", "nope"], "unknown model 'nope'; choose from convnet, mlp"),
    (["train", "--dataset", "mnist"], "MNIST/raw/{train-images-idx3-ubyte, train-labels-idx1-ubyte, "
                                      "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte} under --data-dir DIR (none "
                                      "given)"),
    (["train", "--dataset", "mnist", "--data-dir", "/nonexistent"],
     "under --data-dir /nonexistent (no such folder); missing train-images-idx3-ubyte"),
    (["train", "--batch-size", "0"], "at least 1"),
    (["train", "--input-shape", "a,b"], "not a shape"),
    (["nope"], "invalid choice"),
    (["parity", "--strategies", "ddp,nope"], "unknown strategy nope"),
    (["parity", "--strategies", "single"], "needs a distributed strategy"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, words):
    """In-process (no subprocess needed): the same main() the console script calls."""
    monkeypatch.chdir(tmp_path)
    argv = [*args, "--out", str(tmp_path / "o")] if args[0] == "train" else args
    try:
        code = main(argv)
    except SystemExit as e:  # argparse refusals
        code = e.code
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert words in lines[0] and "Traceback" not in err
    assert not (tmp_path / "o" / "summary.json").exists()


def test_help_explains_strategies_and_batch():
    out = dpcompare("train", "--help").stdout
    for words in ("ddp", "horovod", "single", "PER PROCESS", "mpirun -np 2", "--resume"):
        assert words in out


def test_the_parser_imports_no_torch_and_no_strategy():
    """--help and flag errors answer at once: names and summaries come from catalogs, not the modules."""
    import subprocess
    import sys

    code = ("import sys; from dpcompare import cli; cli.build_parser(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'horovod', 'scipy') "
            "or m.startswith('dpcompare.backends.') and m.rsplit('.', 1)[1] not in ('catalog', 'registry')))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert p.stdout.strip() == "[]", p.stdout


@pytest.mark.parametrize(("code", "script"), [(0, False), (3, False), (0, True)])
def test_leave_skips_the_teardown_but_not_what_a_script_needs(code, script):
    """A command that loaded torch leaves without the interpreter's teardown, its output flushed; after a
    failure its atexit handlers run first; after a user's script, its non-daemon threads finish, then they."""
    import subprocess
    import sys

    late = "threading.Thread(target=lambda: (time.sleep(0.2), print('thread', end=''))).start(); " if script else ""
    prog = ("import atexit, threading, time, torch; from dpcompare.cli import leave; "
            "atexit.register(lambda: print('teardown ran')); print('written', end=''); "
            f"{late}leave({code}, script={script})")
    p = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120)
    assert p.returncode == code
    expected = {(0, False): "written", (3, False): "writtenteardown ran\n", (0, True): "writtenthreadteardown ran\n"}
    assert p.stdout == expected[code, script]


def test_doctor_reports_the_build(tmp_path):
    info = json.loads(dpcompare("doctor", "--json").stdout)
    assert info["torch_distributed"]["gloo"] is True
    assert set(info["strategies"]) >= {"ddp", "horovod", "single"} and "mpi" in info
    hvd = info["strategies"]["horovod"]
    assert hvd["controllers"]["MPI"] is True if hvd["installed"] else "make setup" in hvd["error"]
    assert "strategy horovod" in dpcompare("doctor").stdout
    assert 1 <= info["cpus"]["usable"] <= info["cpus"]["machine"]
    limited = run(["taskset", "-c", "0", DPCOMPARE, "doctor"], timeout=120)
    assert "this process may use 1" in limited.stdout or info["cpus"]["machine"] == 1, limited.stdout + limited.stderr


def test_single_trains_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "run"
    dpcompare("train", "--strategy", "single", *FAST, "--epochs", "1", "--out", str(out))
    before = (out / "metrics.jsonl").read_text()
    p = dpcompare("train", "--strategy", "single", *FAST, "--epochs", "1", "--out", str(out), check=False)
    assert p.returncode == 2 and "already holds a run" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert (out / "metrics.jsonl").read_text() == before
    rows = [json.loads(x) for x in before.splitlines()]
    assert set(rows[0]) >= {"epoch", "train_loss", "test_accuracy", "samples_per_sec", "epoch_seconds"}


def _error_lines(stderr: str) -> list[str]:
    """dpcompare's own error lines (mpirun adds a banner of its own after a non-zero exit)."""
    return [ln for ln in stderr.splitlines() if ln.startswith("dpcompare")]


@needs_mpi
@pytest.mark.parametrize("case, args, words", [
    ("missing checkpoint", ["--resume", "/nonexistent.pt"], "does not exist"),
    ("corrupt checkpoint", ["--resume", "{tmp}/corrupt.pt"], "corrupt.pt"),
    ("sync-bn on CPU", ["--sync-bn", "--device", "cpu"], "GPUs only"),
    ("single under mpirun", ["--strategy", "single"], "runs one process"),
])
def test_refusals_print_one_line_at_np2(tmp_path, case, args, words):
    (tmp_path / "corrupt.pt").write_bytes(b"not a checkpoint")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    strategy = [] if "--strategy" in args else ["--strategy", "ddp"]
    p = dpcompare("train", *strategy, *FAST, "--epochs", "1", *args, "--out", str(tmp_path / "o"), np=2,
                  check=False)
    assert p.returncode == 2, p.stderr
    lines = _error_lines(p.stderr)
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in p.stderr, p.stderr


def test_a_missing_dependency_is_one_line_and_exit_2(capsys):
    """A declared dependency absent from the environment (a GPU image without tomli-w, say) says what to do."""
    from dpcompare.launch.jobs import run_command

    def needs_tomli_w(_args):
        raise ModuleNotFoundError("No module named 'tomli_w'", name="tomli_w")

    assert run_command("parity", needs_tomli_w, None) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'tomli_w' is not installed" in err and "make setup" in err
