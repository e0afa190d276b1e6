"""Two hosts on one machine: two network namespaces joined by a veth pair, mpirun reaching the second
through a remote agent (``ip netns exec``) instead of ssh.

Host A is 10.250.0.1/24, host B 10.250.0.2/24; the host name resolves to 127.0.0.1 in both, the trap
gloo falls into unless GLOO_SOCKET_IFNAME names the veth. mpirun runs inside host A with one slot on
each, so rank 0 is on A and rank 1 on B. Needs root and iproute2; skips with the reason elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from dpcompare.launch.mpirun import job_command

from conftest import DPCOMPARE, ConvnetNp2, missing, mpi_env, needs_horovod, needs_mpi, run, summary

pytestmark = [needs_mpi, pytest.mark.mpi, pytest.mark.netns]

HOST_A, HOST_B, SUBNET = "10.250.0.1", "10.250.0.2", "10.250.0.0/24"
HOSTS = f"{HOST_A}:1,{HOST_B}:1"
TRAIN = (*ConvnetNp2.TRAIN, "--progress", "lines")  # the suite's trained convnet's command: its run is the one host

PROBE = """
import json, os
from dpcompare.launch.env import detect_launch_env
from dpcompare.launch.rendezvous import ensure_rendezvous
env = detect_launch_env()
addr, port = ensure_rendezvous(env)
row = {"rank": env.rank, "addr": addr, "port": port,
       "gloo": os.environ.get("GLOO_SOCKET_IFNAME"), "nccl": os.environ.get("NCCL_SOCKET_IFNAME")}
ensure_rendezvous(env, iface="lo")  # what --iface does
row["override"] = [os.environ.get("GLOO_SOCKET_IFNAME"), os.environ.get("NCCL_SOCKET_IFNAME")]
os.write(1, (json.dumps(row) + "\\n").encode())  # one write: the ranks' lines cannot interleave
"""

AGENT = """#!/bin/sh
# Open MPI's remote agent in place of ssh: AGENT [OPTIONS] HOST COMMAND...; runs COMMAND in HOST's namespace.
while [ "${{1#-}}" != "$1" ]; do shift; done
host=$1; shift
case "$host" in
  {a}) ns={ns_a} ;;
  {b}) ns={ns_b} ;;
  *) echo "netns agent: unknown host $host" >&2; exit 1 ;;
esac
exec ip netns exec "$ns" /bin/sh -c "$*"
"""


@dataclass(frozen=True)
class TwoHosts:
    ns_a: str
    ns_b: str
    veth_a: str
    veth_b: str
    agent: Path

    def env(self) -> dict[str, str]:
        return mpi_env({"OMPI_MCA_plm_rsh_agent": str(self.agent)})

    def on_a(self, *cmd: str) -> list[str]:
        """``cmd`` run inside host A's namespace."""
        return ["ip", "netns", "exec", self.ns_a, *cmd]


def _ip(*args: str) -> None:
    p = subprocess.run(["ip", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {p.stderr.strip()}")


def _remove_namespace(ns: str) -> None:
    """Kill what still runs in ``ns`` (only a failed test leaves anything), then delete it and its veth."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    subprocess.run(["ip", "netns", "delete", ns], capture_output=True)


@pytest.fixture(scope="module")
def two_hosts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> TwoHosts:
    if sys.platform != "linux":
        missing("network namespaces are Linux only")
    if shutil.which("ip") is None:
        missing("iproute2's `ip` is not installed (apt-get install iproute2)")
    if os.geteuid() != 0:
        missing("creating network namespaces needs root")
    tag = secrets.token_hex(3)  # unique per run; interface names stay within 15 characters
    hosts = TwoHosts(f"dpc-{tag}-a", f"dpc-{tag}-b", f"dpc{tag}a", f"dpc{tag}b",
                     tmp_path_factory.mktemp("netns") / "agent.sh")
    for ns in (hosts.ns_a, hosts.ns_b):
        request.addfinalizer(lambda ns=ns: _remove_namespace(ns))
    # a veth left in this namespace by a failed set-up (deleting one end removes the pair)
    request.addfinalizer(lambda: subprocess.run(["ip", "link", "delete", hosts.veth_a], capture_output=True))
    try:
        _ip("netns", "add", hosts.ns_a)
    except RuntimeError as e:
        missing(f"cannot create a network namespace here ({e})")
    _ip("netns", "add", hosts.ns_b)
    _ip("link", "add", hosts.veth_a, "type", "veth", "peer", "name", hosts.veth_b)
    for ns, veth, addr in ((hosts.ns_a, hosts.veth_a, HOST_A), (hosts.ns_b, hosts.veth_b, HOST_B)):
        _ip("link", "set", veth, "netns", ns)
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", veth)
        _ip("-n", ns, "link", "set", veth, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
    hosts.agent.write_text(AGENT.format(a=HOST_A, b=HOST_B, ns_a=hosts.ns_a, ns_b=hosts.ns_b))
    hosts.agent.chmod(0o755)
    return hosts


def test_rendezvous_finds_host_a_and_each_ranks_veth(two_hosts: TwoHosts) -> None:
    """No MASTER_ADDR given: rank 0 offers host A's veth address, each rank names its own veth; --iface wins."""
    env = two_hosts.env()
    assert "MASTER_ADDR" not in env and "GLOO_SOCKET_IFNAME" not in env
    cmd = job_command(2, [sys.executable, "-c", PROBE], hosts=HOSTS, mpi_net=SUBNET, use_srun=False,
                      environ=env)
    p = run(two_hosts.on_a(*cmd), env=env, timeout=120)
    # one object per rank (mpirun merges the ranks' output; a row need not start its own line)
    rows = sorted((json.loads(m) for m in re.findall(r"\{[^{}]*\}", p.stdout)), key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == [0, 1], p.stdout + p.stderr
    assert {r["addr"] for r in rows} == {HOST_A} and len({r["port"] for r in rows}) == 1
    assert (rows[0]["gloo"], rows[1]["gloo"]) == (two_hosts.veth_a, two_hosts.veth_b)  # rank 0 on A, rank 1 on B
    assert (rows[0]["nccl"], rows[1]["nccl"]) == (two_hosts.veth_a, two_hosts.veth_b)
    assert all(r["override"] == ["lo", "lo"] for r in rows)  # --iface wins over the discovered interface


@pytest.mark.parametrize("strategy", ["ddp", pytest.param("horovod", marks=[needs_horovod, pytest.mark.horovod])])
def test_training_across_two_hosts_matches_one_host(two_hosts: TwoHosts, convnet_np2: ConvnetNp2, tmp_path: Path,
                                                   strategy: str) -> None:
    one, two = convnet_np2(strategy), tmp_path / "two-hosts"  # one host: the same command under mpirun -np 2

    launch = [DPCOMPARE, "launch", "--np", "2", "--hosts", HOSTS, "--mpi-net", SUBNET, "--",
              *TRAIN, "--strategy", strategy, "--out", str(two)]
    p = run(two_hosts.on_a(*launch), env=two_hosts.env(), timeout=300)
    line = p.stdout.splitlines()[0].split()
    assert line[:3] == ["mpirun", "-np", "2"] and f"{HOST_A}:1,{HOST_B}:1" in line
    assert not any(w.startswith("MASTER_") for w in line)  # DDP finds its rendezvous by itself

    s1, s2 = summary(one), summary(two)
    assert s2["world_size"] == 2 and s2["launcher"] == "openmpi" and s2["strategy"] == strategy
    assert s2["final_train_loss"] == pytest.approx(s1["final_train_loss"], abs=1e-6)
    assert s2["final_test_accuracy"] == pytest.approx(s1["final_test_accuracy"], abs=1e-6)
