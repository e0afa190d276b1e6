"""Find the address every rank meets at (MASTER_ADDR/MASTER_PORT) and the interface to reach it.

torch.distributed needs ``MASTER_ADDR``/``MASTER_PORT``; mpirun does not set them. Under an MPI
launch rank 0 picks an address of its host that every rank can reach plus a free port and shares
them through mpi4py; under srun the first node of the allocation is used. Each rank then names the
network interface that reaches that address in ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``
(unless the user set them or passed ``--iface``): gloo otherwise connects to whatever the host
name resolves to, often 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass

import psutil

from dpcompare.errors import LaunchError
from dpcompare.launch.env import LaunchEnv

IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


@dataclass(frozen=True)
class Iface:
    name: str
    address: str
    netmask: str

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{self.address}/{self.netmask}", strict=False)


def local_ifaces() -> list[Iface]:
    """IPv4 addresses of this host's interfaces that are up, loopback last."""
    stats = psutil.net_if_stats()
    out = []
    for name, addrs in psutil.net_if_addrs().items():
        if name in stats and not stats[name].isup:
            continue
        for a in addrs:
            if a.family == socket.AF_INET and a.netmask:
                out.append(Iface(name, a.address, a.netmask))
    return sorted(out, key=lambda i: ipaddress.ip_address(i.address).is_loopback)


def iface_for(address: str, ifaces: list[Iface] | None = None) -> str | None:
    """The local interface that reaches ``address`` (an IP or a host name): same subnet first, else the
    routing table's choice; None when the name does not resolve."""
    ifaces = local_ifaces() if ifaces is None else ifaces
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        try:
            ip = ipaddress.ip_address(socket.gethostbyname(address))
        except OSError:
            return None
        address = str(ip)
    if ip.is_loopback:
        return next((i.name for i in ifaces if ipaddress.ip_address(i.address).is_loopback), "lo")
    for i in ifaces:
        if ip in i.network:
            return i.name
    try:  # connect() on UDP sends nothing; it asks the kernel which source address it would use.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((address, 9))
            src = s.getsockname()[0]
    except OSError:
        return None
    return next((i.name for i in ifaces if i.address == src), None)


def free_port(address: str = "") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((address, 0))
        return s.getsockname()[1]


def choose_master_address(per_rank: list[list[Iface]]) -> str:
    """Rank 0's address that every rank shares a subnet with; 127.0.0.1 when all ranks share one host."""
    non_lo = [{i.address for i in r if not ipaddress.ip_address(i.address).is_loopback} for r in per_rank]
    if all(s == non_lo[0] for s in non_lo):
        return "127.0.0.1"
    candidates = [i for i in per_rank[0] if not ipaddress.ip_address(i.address).is_loopback]
    for cand in candidates:
        ip = ipaddress.ip_address(cand.address)
        if all(any(ip in i.network for i in r) for r in per_rank[1:]):
            return cand.address
    if candidates:  # routed networks: trust the first address and the routing tables
        return candidates[0].address
    raise LaunchError("rank 0 has no non-loopback IPv4 address that other hosts could reach; "
                      "set MASTER_ADDR and MASTER_PORT yourself")


def _slurm_master() -> tuple[str, int]:
    nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST", "")
    host = None
    if nodelist and shutil.which("scontrol"):
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
        host = out.stdout.split()[0] if out.returncode == 0 and out.stdout.split() else None
    host = host or os.environ.get("SLURM_LAUNCH_NODE_IPADDR")
    if not host:
        raise LaunchError("under srun but cannot tell the first node (no scontrol, no SLURM_LAUNCH_NODE_IPADDR); "
                          "set MASTER_ADDR and MASTER_PORT")
    job = int(os.environ.get("SLURM_JOB_ID", "0") or 0)
    step = int(os.environ.get("SLURM_STEP_ID", "0") or 0)
    return socket.gethostbyname(host), 15000 + (job * 7 + step) % 20000


def _mpi_master(env: LaunchEnv) -> tuple[str, int]:
    from mpi4py import MPI  # imported here: initialises MPI, which only an MPI launch should do

    comm = MPI.COMM_WORLD
    if comm.Get_size() != env.world_size:
        raise LaunchError(f"mpi4py sees {comm.Get_size()} processes but the launcher says {env.world_size}: "
                          "mpi4py was built against another MPI than the mpirun used; reinstall mpi4py")
    per_rank = comm.allgather(local_ifaces())
    chosen = None
    if comm.Get_rank() == 0:
        addr = os.environ.get("MASTER_ADDR") or choose_master_address(per_rank)
        chosen = (addr, int(os.environ.get("MASTER_PORT") or free_port("" if addr == "127.0.0.1" else addr)))
    return comm.bcast(chosen, root=0)


def ensure_rendezvous(env: LaunchEnv, iface: str | None = None) -> tuple[str, int]:
    """Set MASTER_ADDR, MASTER_PORT and the socket interface variables for this process; return the pair."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not (addr and port):
        if env.world_size == 1:
            addr, port = "127.0.0.1", str(free_port("127.0.0.1"))
        elif env.is_mpi:
            a, p = _mpi_master(env)
            addr, port = a, str(p)
        elif env.launcher == "slurm":
            a, p = _slurm_master()
            addr, port = addr or a, port or str(p)
        else:
            raise LaunchError(f"MASTER_ADDR/MASTER_PORT are not set under {env.launcher}; set both "
                              "(torchrun sets them itself) or launch with mpirun/srun")
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)
    name = iface or iface_for(addr)
    for var in IFNAME_VARS:
        if iface:
            os.environ[var] = iface
        elif name and not os.environ.get(var):
            os.environ[var] = name
    return addr, int(port)
