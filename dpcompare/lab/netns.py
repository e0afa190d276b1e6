"""Thin wrappers over iproute2 (``ip``, ``tc``) for the lab: every call names a namespace the lab made.

Nothing here touches the root namespace's interfaces, addresses or routes: veth pairs are created with both
ends already inside lab namespaces (``ip link add ... netns A type veth peer ... netns B``), and the root
namespace is only read (its addresses and routes, to pick a /24 nobody uses).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys

from dpcompare.errors import LaunchError

NO_TBF = "Specified qdisc kind is unknown"


def preflight() -> None:
    """Refuse, in one line, when this machine cannot host a lab (not Linux, not root, no iproute2)."""
    if not sys.platform.startswith("linux"):
        raise LaunchError("dpcompare lab needs Linux network namespaces; run it on a Linux machine")
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        raise LaunchError(f"dpcompare lab needs iproute2 ({' and '.join(missing)} not found); "
                          "install it: apt-get install iproute2")
    if os.geteuid() != 0:
        raise LaunchError("dpcompare lab needs root to create network namespaces; run it as root or with sudo, "
                          "which resets PATH: sudo -E env PATH=$PATH dpcompare ...")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``ip ARGS``; a failure raises LaunchError with iproute2's own message."""
    return _run(["ip", *args], check)


def tc(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = _run(["tc", *args], check=False)
    if check and p.returncode != 0:
        if NO_TBF in p.stderr:
            raise LaunchError("this kernel has no tbf qdisc (try `modprobe sch_tbf`), which shapes the lab's links; "
                              "--link unlimited works without it")
        raise LaunchError(f"tc {' '.join(args)}: {p.stderr.strip() or 'failed'}")
    return p


def _run(cmd: list[str], check: bool) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise LaunchError(f"{' '.join(cmd)}: {p.stderr.strip() or 'failed'}")
    return p


def namespaces() -> list[str]:
    """Names of the network namespaces ``ip netns`` knows."""
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def kill_processes(ns: str) -> int:
    """SIGKILL every process inside ``ns`` (as a host losing power ends them); how many there were."""
    pids = ip("netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
            os.kill(int(pid), signal.SIGKILL)
    return len(pids)


def remove_namespace(ns: str) -> bool:
    """End what still runs inside ``ns`` (a crashed job, the lab's sshd), then delete it; its veth ends go with
    it, and so does the other end of each pair. True when something was removed."""
    kill_processes(ns)
    return ip("netns", "delete", ns, check=False).returncode == 0


def json_of(cmd: list[str]) -> list[dict]:
    """The ``-j`` output of an iproute2 command, [] when it fails (a namespace already gone)."""
    p = _run(cmd, check=False)
    if p.returncode != 0 or not p.stdout.strip():
        return []
    try:
        return json.loads(p.stdout)
    except json.JSONDecodeError:
        return []


def root_networks() -> list[ipaddress.IPv4Network]:
    """IPv4 networks the root namespace uses (its addresses and routes), to keep the lab's /24 clear of them."""
    nets = []
    for a in json_of(["ip", "-j", "-4", "addr", "show"]):
        for info in a.get("addr_info", []):
            with contextlib.suppress(ValueError, KeyError):
                nets.append(ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False))
    for r in json_of(["ip", "-j", "-4", "route", "show", "table", "all"]):
        dst = r.get("dst", "")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                nets.append(ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False))
    return nets


def tbf_args(bps: int) -> list[str]:
    """tbf options for ``bps``: a burst of 2 ms of traffic but at least 256 KiB from 50 Mbit/s on (64 KiB, one GSO
    packet, halved the rate at 1 Gbit/s; 128 KiB did not), 16 KiB below so that a crawl is a crawl; 20 ms of queue."""
    return ["tbf", "rate", f"{bps}bit", "burst", str(burst_bytes(bps)), "latency", "20ms"]


def burst_bytes(bps: int) -> int:
    """The bytes tbf lets through at once after an idle link (its bucket): see :func:`tbf_args`."""
    floor = 256 * 1024 if bps >= 50_000_000 else 16 * 1024
    return max(floor, int(bps / 8 * 0.002))


def shape(ns: str, dev: str, bps: int | None) -> None:
    """Shape ``dev``'s egress in ``ns`` to ``bps`` (None: remove the shaping)."""
    if bps is None:
        tc("-n", ns, "qdisc", "del", "dev", dev, "root", check=False)  # none there is fine
    else:
        tc("-n", ns, "qdisc", "replace", "dev", dev, "root", *tbf_args(bps))
