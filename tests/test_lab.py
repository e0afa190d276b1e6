"""``dpcompare lab``: rates and specs, the bench's arithmetic, and a real 2-host lab (namespaces, tbf, mpirun).

The lab cases need root, iproute2 and tbf: they skip with the reason locally and fail under CI (conftest.missing).
One lab, shaped to 200 Mbit/s (large messages saturate it quickly), serves the module; its name is unique per run.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpcompare.argtypes import format_rate_bits, parse_rate_bits
from dpcompare.errors import ConfigError, LaunchError
from dpcompare.lab import Lab, LabSpec, hosts, netns, parse_lab_spec
from dpcompare.lab import bench as labbench
from dpcompare.lab.spec import link_bps
from dpcompare.launch.jobs import log_tail
from dpcompare.launch.mpirun import dpcompare_argv
from dpcompare.trace import collective_name

from conftest import FAST, dpcompare, lab_of, missing, needs_mpi, summary


# -- no root needed -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "bps"), [("1gbit", 10**9), ("200mbit", 2 * 10**8), ("10Gbit", 10**10),
                                           ("1.5gbit", 15 * 10**8), ("unlimited", None)])
def test_rates_read_and_written_back(text: str, bps: int | None) -> None:
    assert link_bps(text) == bps
    assert link_bps(format_rate_bits(bps)) == bps


@pytest.mark.parametrize("text", ["3furlongs", "1gbps", "", "gbit", "1bit"])
def test_unknown_rates_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="link rate"):
        link_bps(text)


def test_unlimited_is_a_lab_link_only() -> None:
    """The one rate parser: bits/s for the lab and for predict; only a lab's link may be unshaped."""
    assert parse_rate_bits("unlimited", unlimited=True) is None
    with pytest.raises(ConfigError, match="unit"):
        parse_rate_bits("unlimited")


def test_lab_spec() -> None:
    s = parse_lab_spec("hosts=4,link=1gbit,slots=2")
    assert (s.hosts, s.link, s.slots, s.name, s.link_bps) == (4, "1gbit", 2, "default", 10**9)
    assert parse_lab_spec("link=200mbit").hosts == 2
    assert parse_lab_spec(s.text()) == s and s.to_json() == {"hosts": 4, "link": "1gbit", "slots": 2}
    for bad in ("hosts=two", "link=fast", "nodes=2", "hosts=0", "name=Bad-Name", "hosts", "link=1bit"):
        with pytest.raises(ConfigError):
            parse_lab_spec(bad)
    with pytest.raises(ConfigError, match="1 to 64 hosts"):
        LabSpec(hosts=65)


def test_np_beyond_the_slots_is_refused_in_the_same_words() -> None:
    spec = parse_lab_spec("hosts=2,slots=2")
    spec.check_np(4)
    with pytest.raises(ConfigError) as e:
        spec.check_np(5)
    assert str(e.value) == ("--np 5 but --lab hosts=2,link=unlimited,slots=2 has 4 slot(s) (2 host(s) × slots=2); "
                            "raise hosts= or slots= in --lab, or lower --np")


def test_sizes_and_bus_factors() -> None:
    assert labbench.parse_sizes("4K:64M")[:3] == [4096, 8192, 16384]
    assert labbench.parse_sizes("4K:64M")[-1] == 64 * 2**20 and len(labbench.parse_sizes("4K:64M")) == 15
    assert labbench.parse_sizes("16M,1M") == [2**20, 16 * 2**20]
    with pytest.raises(ConfigError):
        labbench.parse_sizes("64M:4K")
    assert labbench.bus_factor("all_reduce", 4) == 1.5 and labbench.bus_factor("all_gather", 4) == 0.75
    assert collective_name("allreduce") == "all_reduce" and collective_name("allgather") == "all_gather"
    # idle before each timed operation: twice tbf's refill of its 256 KiB bucket; nothing on an unshaped link
    assert labbench.idle_gap_ms(10**9) == 4.2 and labbench.idle_gap_ms(2 * 10**8) == 21.0
    assert labbench.idle_gap_ms(None) == 0.0


def test_analysis_recovers_alpha_and_beta() -> None:
    """Times made from α = 50 µs and a 1 Gbit/s bus: the fit gives them back, busbw is 100 % of the link."""
    alpha, link = 50e-6, 10**9
    sizes = [2**k for k in range(12, 27)]
    raw = [{"backend": "gloo", "collective": "allreduce", "bytes": b, "times_s": [alpha + b * 8 / link] * 3}
           for b in sizes]
    doc = labbench.analyse(raw, 2, link)
    big = max(doc["rows"], key=lambda r: r["bytes"])
    assert big["busbw_pct_of_link"] == pytest.approx(100, abs=0.1)
    (fit,) = doc["fits"]  # an older worker's "allreduce", in dpcompare's own spelling
    assert (
        fit["collective"] == "all_reduce"
        and fit["alpha_s"] == pytest.approx(alpha, rel=1e-3)
        and fit["busbw_pct_of_link"] == pytest.approx(100)
    )


def test_without_root_or_iproute2_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.shutil, "which", lambda t: None if t == "tc" else "/usr/sbin/ip")
    with pytest.raises(LaunchError, match="iproute2 \\(tc not found\\)"):
        netns.preflight()
    monkeypatch.setattr(netns.shutil, "which", lambda t: f"/usr/sbin/{t}")
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    with pytest.raises(LaunchError, match="needs root"):
        netns.preflight()


def test_a_kernel_without_tbf_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = subprocess.CompletedProcess(["tc"], 2, "", "Error: Specified qdisc kind is unknown.\n")
    monkeypatch.setattr(netns, "_run", lambda cmd, check: answer)
    with pytest.raises(LaunchError, match="no tbf qdisc"):
        netns.shape("dplab-x-h0", "dplab0", 10**9)


# -- a real lab --------------------------------------------------------------------------------------
def _ours(name: str) -> tuple[list[str], list[str]]:
    """Namespaces and root-namespace interfaces lab ``name`` could have left behind."""
    spaces = sorted(ns for ns in netns.namespaces() if ns.startswith(f"{hosts.PREFIX}{name}-"))
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return spaces, [line for line in links.splitlines() if "dplab" in line]


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    yield from lab_of("t", "200mbit")


@pytest.mark.netns
def test_lab_is_two_hosts_shaped_both_ways(lab: Lab) -> None:
    rows = lab.host_rows()
    assert [r["present"] for r in rows] == [True, True] and {r["shaped"] for r in rows} == {"200mbit"}
    sw = netns.json_of(["tc", "-j", "-n", lab.switch, "qdisc", "show"])
    assert sorted(q["dev"] for q in sw if q["kind"] == "tbf") == ["dplab-h0", "dplab-h1"]  # switch → host too
    assert lab.hostfile.read_text().split() == [lab.hosts[0].address, "slots=1", lab.hosts[1].address, "slots=1"]
    assert lab.subnet.startswith("10.250.") and lab.hosts[0].address.endswith(".1")
    assert _ours(lab.name) == ([f"{hosts.PREFIX}{lab.name}-h0", f"{hosts.PREFIX}{lab.name}-h1",
                                f"{hosts.PREFIX}{lab.name}-sw"], [])  # nothing in the root namespace


@pytest.mark.netns
def test_refusals_are_one_line_exit_2(lab: Lab) -> None:
    p = dpcompare("lab", "up", "--host-count", "2", "--link", "1gbit", "--name", lab.name, check=False)
    assert p.returncode == 2 and "already exists" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = dpcompare("lab", "up", "--link", "3furlongs", "--name", "neverup", check=False)
    assert p.returncode == 2 and "3furlongs" in p.stderr and not _ours("neverup")[0]
    p = dpcompare("lab", "bench", "--name", "neverup", check=False)
    assert p.returncode == 2 and "no lab named 'neverup'" in p.stderr


@pytest.mark.netns
def test_link_down_and_reshape(lab: Lab) -> None:
    lab.set_link_state(1, up=False)
    assert lab.host_rows()[1]["port"] == "DOWN" and Lab.load(lab.name).hosts[1].up is False
    lab.set_link_state(1, up=True)
    lab.set_link(10**9, host=0)
    assert [r["shaped"] for r in lab.host_rows()] == ["1gbit", "200mbit"]
    p = dpcompare("lab", "set-link", "1Gbit", "--name", lab.name)  # parsed at the flag, to tc in bits/s
    assert "shaped to 1gbit" in p.stdout and [r["shaped"] for r in lab.host_rows()] == ["1gbit", "1gbit"]
    lab.set_link(2 * 10**8)
    assert [r["shaped"] for r in lab.host_rows()] == ["200mbit", "200mbit"]
    p = dpcompare("lab", "status", env={**os.environ, "COLUMNS": "200"})
    assert f"lab {lab.name}: up" in p.stdout and lab.hosts[1].address in p.stdout


SHARED_MEMORY_JOB = """
import sys
import numpy as np
from mpi4py import MPI

c = MPI.COMM_WORLD
got = np.empty(1 << 18)
c.Allreduce(np.full(1 << 18, float(c.rank)), got)  # two ranks per host: through shared memory, then the link
sys.exit(0 if (got == sum(range(c.size))).all() else f"rank {c.rank}: wrong sum {got[:3]}")
"""


@pytest.mark.netns
@needs_mpi
def test_two_ranks_per_host_keep_each_hosts_shared_memory_and_session_folder_apart(lab: Lab, tmp_path: Path) -> None:
    """The hosts share the machine's name, which Open MPI names its session folder and shared-memory segments
    after: without a folder per host, rank 0 of host 0 and rank 0 of host 1 mapped one segment ("unlink(2)
    /dev/shm/vader_segment...: No such file"), and one job's daemons removed each other's files (PMIx's
    NO-PERMISSIONS, a 4-host bench's segfault)."""
    script = tmp_path / "allreduce.py"
    script.write_text(SHARED_MEMORY_JOB)
    import sys

    rc, _ = lab.run([sys.executable, str(script)], tmp_path / "logs", 4, per_host=2, mpi_options=("--oversubscribe",),
                    timeout=120)
    assert rc == 0, log_tail(tmp_path / "logs", 30)
    assert "system call failed" not in log_tail(tmp_path / "logs", 200).lower()
    assert (lab.directory / "ompi" / lab.hosts[1].namespace).is_dir()


@pytest.mark.netns
def test_a_link_given_as_1Gbit_reaches_tc_as_1000000000_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--lab hosts=2,link=1Gbit``: parsed once into the spec, then the same integer to every tbf (both ways)."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        missing("a lab needs root and iproute2")
    spec = parse_lab_spec(f"hosts=2,link=1Gbit,name=g{secrets.token_hex(3)}")
    assert spec.link_bps == 10**9
    shaped: list[int | None] = []
    real = netns.shape
    monkeypatch.setattr(netns, "shape", lambda ns, dev, bps: (shaped.append(bps), real(ns, dev, bps)))
    with hosts.session(spec) as lab:
        assert lab is not None
        rates = [q["options"]["rate"] * 8 for ns, dev in ((lab.hosts[0].namespace, hosts.IFACE), (lab.switch, None))
                 for q in netns.json_of(["tc", "-j", "-n", ns, "qdisc", "show", *(["dev", dev] if dev else [])])
                 if q["kind"] == "tbf"]
    assert shaped == [10**9] * 4 and rates == [10**9] * 3, (shaped, rates)  # host 0's side; both switch ports
    assert not [ns for ns in netns.namespaces() if ns.startswith(f"{hosts.PREFIX}{spec.name}-")]


@pytest.mark.netns
def test_interrupted_up_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        missing("a lab needs root and iproute2")
    name = f"i{secrets.token_hex(3)}"

    def ctrl_c(*a: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(netns, "shape", ctrl_c)  # Ctrl-C once the namespaces exist, while shaping
    with pytest.raises(KeyboardInterrupt):
        Lab.up(LabSpec(hosts=2, link_bps=10**9, name=name))
    assert _ours(name) == ([], []) and not (hosts.state_root() / name).exists()


@pytest.mark.netns
def test_session_takes_the_lab_down_after_a_failure_or_ctrl_c() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        missing("a lab needs root and iproute2")
    for error in (RuntimeError, KeyboardInterrupt):
        name = f"s{secrets.token_hex(3)}"
        said: list[str] = []
        with pytest.raises(error), hosts.session(LabSpec(name=name), said.append) as lab:
            assert lab is not None and len(_ours(name)[0]) == 3
            raise error
        assert _ours(name) == ([], []) and not (hosts.state_root() / name).exists()
        assert said and said[0].startswith(f"lab {name!r} up: 2 hosts")
    with hosts.session(None) as nothing:
        assert nothing is None


@pytest.mark.netns
@pytest.mark.mpi
@needs_mpi
def test_bench_gloo_all_reduce_reaches_the_link(lab: Lab, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    before = lab.host_rows()[0]["tx_bytes"]
    dpcompare("lab", "bench", "--name", lab.name, "--sizes", "1M,4M", "--backends", "gloo,mpi",
              "--collectives", "allreduce", "--iters", "3", "--repeats", "1", "--out-file", str(out), timeout=240)
    doc = json.loads(out.read_text())
    assert doc["schema"] == labbench.SCHEMA and doc["ranks"] == 2 and doc["lab"]["link_bps"] == 2 * 10**8
    assert doc["gap_ms"] == labbench.idle_gap_ms(2 * 10**8)
    gloo = max((r for r in doc["rows"] if r["backend"] == "gloo"), key=lambda r: r["bytes"])
    assert gloo["bytes"] == 4 * 2**20 and 75 <= gloo["busbw_pct_of_link"] <= 125, gloo
    assert {(f["backend"], f["collective"]) for f in doc["fits"]} == {("gloo", "all_reduce"), ("mpi", "all_reduce")}
    # on the shaped link the sweep ran again back to back (predict prices a collective that follows another so)
    assert {(r["backend"], r["bytes"]) for r in doc["rows"] if r.get("back_to_back")} == {
        (b, s) for b in ("gloo", "mpi") for s in (2**20, 4 * 2**20)}
    # the traffic crossed host 0's link: at least the all-reduces' bytes (4 × (1+4) MiB, 2 warm-up/timed rounds)
    assert lab.host_rows()[0]["tx_bytes"] - before > 4 * 5 * 2**20


@pytest.mark.netns
@pytest.mark.mpi
@needs_mpi
def test_ddp_training_runs_across_the_lab(lab: Lab, tmp_path: Path) -> None:
    """``Lab.run`` places one rank per host; DDP's gradients cross host 0's shaped link."""
    before = lab.host_rows()[0]["tx_bytes"]
    argv = [*dpcompare_argv(), "train", *FAST, "--strategy", "ddp", "--epochs", "1", "--max-steps", "6",
            "--progress", "none", "--out", str(tmp_path / "run")]
    rc, _ = lab.run(argv, tmp_path / "run", timeout=240)
    assert rc == 0, log_tail(tmp_path / "run", 40)
    s = summary(tmp_path / "run")
    assert (s["world_size"], s["launcher"], s["strategy"]) == (2, "openmpi", "ddp")
    # the convnet's gradients are ~85 KB a step (measured: 0.5 MB for 6 steps); an MPI start-up alone sent 4.3 KB
    assert lab.host_rows()[0]["tx_bytes"] - before > 256 * 1024


@pytest.mark.netns
def test_down_leaves_nothing_even_after_a_crash() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        missing("a lab needs root and iproute2")
    name = f"c{secrets.token_hex(3)}"
    lab = Lab.up(LabSpec(name=name))
    (lab.directory / "state.json").unlink()  # as if `lab up` had died before writing it
    assert len(_ours(name)[0]) == 3
    p = dpcompare("lab", "down", "--name", name)
    assert "removed namespace" in p.stdout
    assert _ours(name) == ([], []) and not lab.directory.exists()
    assert not [ns for ns in netns.namespaces() if ns.startswith(f"{hosts.PREFIX}{name}")]
