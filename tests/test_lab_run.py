"""``compare --lab``: a comparison across emulated hosts, the link as an axis (``--sweep link=``), and refusals.

The end-to-end case needs root, iproute2, tbf and Open MPI with Horovod: it skips with the reason locally and
fails under CI (conftest.missing). Its lab carries a unique name, and the test checks nothing of it is left.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path

import pytest

from dpcompare import cli
from dpcompare.compare.cmdline import plan_flags
from dpcompare.compare.command import comparison_of
from dpcompare.compare.plan import build_arms, parse_sweep
from dpcompare.errors import ConfigError
from dpcompare.lab import netns

from conftest import dpcompare, missing, needs_horovod, needs_mpi

TINY = ("--model", "convnet", "--dataset", "digits", "--threads", "1", "--warmup-steps", "2", "--min-steps", "4",
        "--epochs", "1", "--max-steps", "6")


def _args(*argv: str):
    return cli.build_parser().parse_args(["compare", *argv])


# -- no root needed -----------------------------------------------------------------------------------
def test_link_sweep_is_link_major_and_recorded() -> None:
    name, values = parse_sweep("link=unlimited,1Gbit,200mbit")
    assert (name, values) == ("link", ["unlimited", "1gbit", "200mbit"])
    arms = build_arms(["ddp", "horovod"], (), [(name, values)])
    assert [a.label for a in arms][:2] == ["ddp/link=unlimited", "horovod/link=unlimited"]
    c = comparison_of(_args("--lab", "hosts=2,link=1gbit", "--sweep", "link=unlimited,200mbit"))
    assert c.lab.hosts == 2 and "--lab" in plan_flags(c)


@pytest.mark.parametrize(("argv", "words"), [
    (("--sweep", "link=1gbit,200mbit"), "add --lab"),
    (("--lab", "hosts=2", "--workers", "persistent"), "--workers persistent"),
    (("--lab", "hosts=2", "--np", "4"), "--np 4"),
])
def test_what_a_lab_cannot_run_is_refused(argv: tuple[str, ...], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        comparison_of(_args(*argv))


@pytest.mark.parametrize("spec", ["hosts=two", "link=fast", "nodes=2"])
def test_a_bad_lab_spec_is_one_line_exit_2(spec: str) -> None:
    p = dpcompare("compare", "--lab", spec, "--out", "/nonexistent/x", check=False)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "--lab" in p.stderr


def test_without_root_the_lab_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a user other than root (the effective uid faked: the compare runs in this process), one line, exit 2,
    before any run starts."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    out = tmp_path / "c"
    p = dpcompare("compare", "--lab", "hosts=2", *TINY, "--repeats", "1", "--out", str(out), check=False)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "root" in p.stderr, p.stderr
    assert not (out / "runs").exists() or not any((out / "runs").iterdir())


def test_link_verdict_words() -> None:
    from dpcompare.report.groups import arm_pairs, without_link

    results = {"config": {"np": [2], "arms": [
        {"label": f"{s}/link={k}", "strategy": s, "knobs": {"link": k}}
        for k in ("unlimited", "1gbit") for s in ("ddp", "horovod")]}, "runs": []}
    assert list(arm_pairs(results)) == [(2, "ddp/link=unlimited", "horovod/link=unlimited"),
                                        (2, "ddp/link=1gbit", "horovod/link=1gbit")]
    assert without_link("ddp/batch_size=8,link=1gbit") == "ddp/batch_size=8"
    assert without_link("ddp/link=1gbit,batch_size=8") == "ddp/batch_size=8"


# -- the real thing -----------------------------------------------------------------------------------
@pytest.mark.netns
@pytest.mark.mpi
@needs_mpi
@needs_horovod
def test_compare_across_a_lab_gives_a_verdict_per_link(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        missing("a lab needs root and iproute2")
    name = f"t{secrets.token_hex(3)}"
    out = tmp_path / "c"
    p = dpcompare("compare", "--np", "2", "--strategies", "ddp,horovod", "--lab", f"hosts=2,name={name}",
                  "--sweep", "link=unlimited,200mbit", "--repeats", "1", *TINY, "--progress", "none",
                  "--out", str(out))
    assert not [ns for ns in netns.namespaces() if ns.startswith(f"dplab-{name}-")], "the lab was left behind"
    res = json.loads((out / "results.json").read_text())
    assert p.returncode == 0, [r.get("error") for r in res["runs"]]
    assert res["config"]["lab"]["hosts"] == 2 and res["config"]["lab"]["links"] == ["unlimited", "200mbit"]
    texts = [v["text"] for v in res["verdicts"] if v.get("metric", "throughput") == "throughput"]
    assert len(texts) == 2, texts
    assert any("horovod vs ddp at np=2 on 200mbit" in t or "than ddp at np=2 on 200mbit" in t for t in texts), texts
    # every run's ranks sat on two hosts: the job line ran mpirun inside the lab's host 0
    assert all(r["command"][:3] == ["ip", "netns", "exec"] for r in res["runs"]), res["runs"][0]["command"]
    assert (out / "report.html").is_file()


@pytest.mark.netns
def test_launch_with_a_lab_prints_the_line_inside_host_0_and_leaves_nothing() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        missing("a lab needs root and iproute2")
    name = f"t{secrets.token_hex(3)}"
    p = dpcompare("launch", "--np", "2", "--lab", f"hosts=2,link=1gbit,name={name}", "--dry-run", "--",
                  "train", "--strategy", "ddp")
    line = p.stdout.strip().splitlines()[-1]
    assert line.startswith(f"ip netns exec dplab-{name}-h0 mpirun") and "plm_rsh_agent" in line, line
    assert not [ns for ns in netns.namespaces() if ns.startswith(f"dplab-{name}-")]
    bad = dpcompare("launch", "--np", "3", "--lab", f"hosts=2,name={name}", "--", "train", check=False)
    assert bad.returncode == 2 and "--np 3" in bad.stderr, bad.stderr


def test_the_lost_host_is_named_in_one_line_and_kept_with_the_run(tmp_path: Path) -> None:
    """mpirun's message about a lost daemon becomes one line naming the lab's host, appended to the run's
    stderr.log (what compare records as the failed run's error). No namespace is needed: none of this lab exists."""
    from dpcompare.compare.runner import _name_lost_hosts
    from dpcompare.lab import Host, Lab

    lab = Lab("nolab", "dplab-nolab-sw", "10.250.250.0/24", 1, None,
              [Host(i, f"dplab-nolab-h{i}", f"10.250.250.{i + 1}", f"dplab-h{i}") for i in range(2)])
    mpirun_says = "ORTE has lost communication with a remote daemon.\n  Remote daemon: [[26165,0],1] on node 10.250.250.2\n"
    line = lab.lost_line(mpirun_says)
    assert line is not None and "lost host 1 (10.250.250.2" in line and "\n" not in line
    assert lab.lost_line("some other failure") is None
    (tmp_path / "stderr.log").write_text(mpirun_says)
    _name_lost_hosts(lab, tmp_path)
    assert (tmp_path / "stderr.log").read_text().splitlines()[-1] == line
