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
from dpcompare.compare import command as compare_cmd
from dpcompare.compare import runner as runner_m
from dpcompare.compare.axes import LabLink
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
    assert (name, values) == ("link", [LabLink(None), LabLink(10**9), LabLink(2 * 10**8)])
    arms = build_arms(["ddp", "horovod"], (), axes=[(name, values)])
    assert [a.label for a in arms][:2] == ["ddp/link=unlimited", "horovod/link=unlimited"]
    assert arms[2].axis("link") == LabLink(10**9) and arms[2].knobs == ()
    assert arms[2].to_json() == {"label": "ddp/link=1gbit", "strategy": "ddp", "knobs": {}, "axes": {"link": "1gbit"},
                                 "base": "ddp"}
    c = comparison_of(_args("--lab", "hosts=2,link=1gbit", "--sweep", "link=unlimited,200mbit"))
    assert c.lab is not None and c.lab.hosts == 2 and c.lab.link_bps == 10**9
    assert plan_flags(c)[-4:] == ["--lab", "hosts=2,link=1gbit,slots=1", "--sweep", "link=unlimited,200mbit"]
    # a swept link and a swept train setting: the link is no train setting of the run
    c = comparison_of(_args("--lab", "hosts=2", "--sweep", "link=200mbit", "--sweep", "batch_size=16"))
    arm = c.all_arms[0]
    assert (arm.label, arm.knobs, arm.axes) == ("ddp/batch_size=16,link=200mbit", (("batch_size", 16),),
                                                (("link", LabLink(2 * 10**8)),))
    assert arm.to_json()["knobs"] == {"batch_size": 16} and arm.to_json()["axes"] == {"link": "200mbit"}


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


@pytest.mark.parametrize("argv", [
    ["compare", "--lab", "hosts=2,link=fast"], ["compare", "--lab", "hosts=2", "--sweep", "link=1gbit,fast"],
    ["parity", "--lab", "link=fast"], ["launch", "--np", "2", "--lab", "link=fast", "--", "train"],
    ["lab", "up", "--link", "fast"], ["lab", "set-link", "fast"], ["predict", "x", "--link", "fast"],
    ["predict", "x", "--intra-link", "fast"], ["compare", "--project-link", "fast"],
])
def test_a_bad_rate_is_refused_at_its_flag_in_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "'fast'" in err, err


def test_np_beyond_the_lab_is_refused_alike_by_compare_parity_and_launch(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """One check (LabSpec.check_np), one sentence, before any lab is made (no root needed)."""
    said = {}
    for argv in (["compare", "--np", "3", "--lab", "hosts=2", "--out", str(tmp_path / "c")],
                 ["parity", "--np", "3", "--lab", "hosts=2", "--out", str(tmp_path / "p")],
                 ["launch", "--np", "3", "--lab", "hosts=2", "--", "train", "--strategy", "ddp"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        said[argv[0]] = err.split(": error: ", 1)[1]
    assert len(set(said.values())) == 1, said
    assert said["launch"].startswith("--np 3 but --lab hosts=2,link=unlimited,slots=1 has 2 slot(s)")
    assert not (tmp_path / "c" / "runs").exists() and not (tmp_path / "p").exists()


def test_without_root_the_lab_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a user other than root (the effective uid faked: the compare runs in this process), one line, exit 2,
    before any run starts."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    out = tmp_path / "c"
    p = dpcompare("compare", "--lab", "hosts=2", *TINY, "--repeats", "1", "--out", str(out), check=False)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "root" in p.stderr, p.stderr
    assert not (out / "runs").exists() or not any((out / "runs").iterdir())


def test_link_verdict_words_in_old_results() -> None:
    """results.json from before arms recorded their axes apart (the link under ``knobs``) still pairs per link."""
    from dpcompare.report.groups import arm_base, arm_pairs

    results = {"config": {"np": [2], "arms": [
        {"label": f"{s}/link={k}", "strategy": s, "knobs": {"link": k}}
        for k in ("unlimited", "1gbit") for s in ("ddp", "horovod")]}, "runs": []}
    assert list(arm_pairs(results)) == [(2, "ddp/link=unlimited", "horovod/link=unlimited"),
                                        (2, "ddp/link=1gbit", "horovod/link=1gbit")]
    assert arm_base(results, "ddp/batch_size=8,link=1gbit") == "ddp/batch_size=8"
    assert arm_base(results, "ddp/link=1gbit,batch_size=8") == "ddp/batch_size=8"


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
    mpirun_says = (
        "ORTE has lost communication with a remote daemon.\n  Remote daemon: [[26165,0],1] on node 10.250.250.2\n"
    )
    line = lab.lost_line(mpirun_says)
    assert line is not None and "lost host 1 (10.250.250.2" in line and "\n" not in line
    assert lab.lost_line("some other failure") is None
    (tmp_path / "stderr.log").write_text(mpirun_says)
    _name_lost_hosts(lab, tmp_path)
    assert (tmp_path / "stderr.log").read_text().splitlines()[-1] == line


@pytest.mark.netns
def test_the_link_axis_round_trips_through_results_and_resume(tmp_path: Path) -> None:
    """``--sweep link=unlimited,1Gbit`` across a real lab, the runs faked: each run finds its link shaped in tc
    (1Gbit as 1000000000 bit/s), results.json keeps the link as the arm's ``axes.link``, and an interrupted
    comparison resumes from results.json with the same arms."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        missing("a lab needs root and iproute2")
    from test_compare import fake_launch

    seen: list[tuple[str, int | None]] = []

    def launch(cmd: list[str], run_dir: Path, env: dict[str, str], timeout: float | None) -> tuple[int, float]:
        if len(seen) == 3:
            raise KeyboardInterrupt
        tbf = [q for q in netns.json_of(["tc", "-j", "-n", cmd[3], "qdisc", "show", "dev", "dplab0"])
               if q["kind"] == "tbf"]  # cmd: ip netns exec <host 0> mpirun ...
        seen.append((run_dir.name, tbf[0]["options"]["rate"] * 8 if tbf else None))
        return fake_launch(cmd, run_dir, env, timeout)

    fake_launch.calls = []  # type: ignore[attr-defined]
    name, out = f"r{secrets.token_hex(3)}", tmp_path / "c"
    argv = ["--np", "1", "--strategies", "ddp,single", "--lab", f"hosts=2,name={name}", "--sweep",
            "link=unlimited,1Gbit", "--repeats", "1", "--progress", "none", "--out", str(out)]
    with pytest.raises(KeyboardInterrupt):
        runner_m.run_compare(comparison_of(_args(*argv)), launch=launch)
    assert not [ns for ns in netns.namespaces() if ns.startswith(f"dplab-{name}-")], "the lab was left behind"
    assert seen == [("ddp-link-unlimited-np1-r0", None), ("single-link-unlimited-np1-r0", None),
                    ("ddp-link-1gbit-np1-r0", 10**9)]
    stored = json.loads((out / "results.json").read_text())
    assert [a["axes"] for a in stored["config"]["arms"]] == [{"link": "unlimited"}] * 2 + [{"link": "1gbit"}] * 2
    assert stored["config"]["lab"] == {"hosts": 2, "link": "unlimited, 1gbit", "slots": 1,
                                       "links": ["unlimited", "1gbit"]}
    assert [r["axes"] for r in stored["runs"]] == [{"link": "unlimited"}] * 2 + [{"link": "1gbit"}]

    seen.clear()
    merged = compare_cmd.resumed_args(_args("--continue", str(out), "--progress", "none"))
    c = comparison_of(merged)
    assert [a.axis("link") for a in c.all_arms] == [LabLink(None), LabLink(None), LabLink(10**9), LabLink(10**9)]
    assert runner_m.run_compare(c, launch=launch) == 0
    assert seen == [("single-link-1gbit-np1-r0", 10**9)]  # the three recorded ok were kept
    res = json.loads((out / "results.json").read_text())
    assert res["complete"] and res["config"]["arms"] == stored["config"]["arms"]
    assert res["config"]["lab"] == stored["config"]["lab"] and len(res["runs"]) == 4
    assert {v["text"].split(" on ")[1].split()[0] for v in res["verdicts"] if " on " in v["text"]} >= {"1gbit"}
