"""The :class:`Lab`: N hosts (network namespaces) on a bridge in a switch namespace, links shaped with tbf.

Layout of lab ``NAME`` (every name starts with :data:`PREFIX`)::

    namespace dplab-NAME-sw      bridge dplab-br, ports dplab-h0 .. dplab-h{N-1} (egress shaped: switch → host)
    namespace dplab-NAME-hI      interface dplab0 = 10.250.X.(I+1)/24 (egress shaped: host → switch), lo;
                                 an sshd on that address only (when installed: horovodrun's way in)
    /run/dpcompare-lab/NAME/     state.json, hostfile, agent.sh (Open MPI's remote agent in place of ssh),
                                 ompi/NAMESPACE/ (each host's Open MPI session folder and shared memory),
                                 ssh/ (keys, configurations), bin/ssh, live-hosts and discover.sh (:mod:`.remote`)
    /etc/netns/dplab-NAME-hI/    hosts: the machine's name is the host's address inside the host

The bridge lives in its own namespace, not the root one: the root namespace gets no interface, address or route,
so nothing the machine already uses can clash with the lab or be touched by it. The price: the root namespace
cannot reach the hosts, so mpirun runs inside host 0 (:meth:`Lab.command` does that: the lab is a
:class:`~dpcompare.launch.jobs.Placement`, and its jobs run through :mod:`dpcompare.launch.jobs`).
Every host's interface has the same name, so one ``GLOO_SOCKET_IFNAME`` serves every rank.
:func:`session` is the one way to run inside a lab made for the purpose: up now, down at the end.
A host can die (:meth:`Lab.fail_host`: its link down, then every process in it killed) and come back
(:meth:`Lab.revive_host`); elastic jobs (torchrun's agents, ``horovodrun`` elastic) are placed here too.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import ipaddress
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dpcompare.argtypes import format_rate_bits
from dpcompare.errors import ConfigError, LaunchError
from dpcompare.files import atomic_write_json, atomic_write_text
from dpcompare.lab import netns, remote
from dpcompare.lab.spec import LabSpec, check_link, check_name
from dpcompare.launch import elastic, jobs, mpirun
from dpcompare.launch.elastic import ElasticLaunch
from dpcompare.launch.env import CPU_SHARERS
from dpcompare.trace import LINK_ENV

PREFIX = "dplab-"
IFACE = "dplab0"
BRIDGE = "dplab-br"
#: Open MPI's daemons probe their idle connections every second after 2 s: a host whose link goes down is noticed
#: by mpirun within ~5 s ("ORTE has lost communication with a remote daemon"), which then ends the whole job.
#: Without it MPI never notices (Horovod waits forever) and mpirun waits on the lost host after a rank fails.
KEEPALIVE = ("--mca", "oob_tcp_keepalive_time", "2", "--mca", "oob_tcp_keepalive_intvl", "1",
             "--mca", "oob_tcp_keepalive_probes", "3")
_LOST_DAEMON = re.compile(r"Remote daemon:\s*\S+ on node (\S+)")
#: a host's link slower than this, or slower than the fastest other's by this ratio, crawls (:meth:`Lab.crawling`)
CRAWL_BPS, CRAWL_RATIO = 1_000_000, 100
#: the lab's /24s: 10.250.200.0/24 and up (10.250.0.0/24 is tests/test_multihost.py's)
FIRST_NET, LAST_NET = 200, 254


def state_root() -> Path:
    return Path(os.environ.get("DPCOMPARE_LAB_DIR", "/run/dpcompare-lab"))


@dataclass
class Host:
    index: int
    namespace: str
    address: str
    port: str  #: the switch-side end of its veth
    link_bps: int | None = None
    up: bool = True  #: its link (switch port) is up
    alive: bool = True  #: its processes run (False after :meth:`Lab.fail_host`, until :meth:`Lab.revive_host`)


@dataclass
class Lab:
    name: str
    switch: str
    subnet: str
    slots: int
    link_bps: int | None
    hosts: list[Host] = field(default_factory=list)
    created: str = ""
    status: str = "creating"
    ssh: bool = False  #: every host runs the lab's sshd (:mod:`.remote`; horovodrun needs it)

    # -- files ---------------------------------------------------------------------------------------
    @property
    def directory(self) -> Path:
        return state_root() / self.name

    @property
    def hostfile(self) -> Path:
        return self.directory / "hostfile"

    @property
    def agent(self) -> Path:
        return self.directory / "agent.sh"

    @property
    def link(self) -> str:
        return format_rate_bits(self.link_bps)

    @property
    def iface(self) -> str:
        """The interface every host reaches the others by (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME)."""
        return IFACE

    def _save(self) -> None:
        atomic_write_json(self.directory / "state.json", asdict(self))
        if self.hosts:
            remote.write_discovery(self.directory, self.hosts[0].address, [h.address for h in self.live_hosts],
                                   self.slots)

    @property
    def live_hosts(self) -> list[Host]:
        """The hosts whose link is up and whose processes run (what ``discover.sh`` prints)."""
        return [h for h in self.hosts if h.up and h.alive]

    @classmethod
    def load(cls, name: str = "default") -> Lab:
        path = state_root() / check_name(name) / "state.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"no lab named {name!r} is up (no {path}); start one with "
                              f"`dpcompare lab up --host-count 2 --link 1gbit{_named(name)}`") from None
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"{path} is unreadable ({e}); `dpcompare lab down{_named(name)}` clears it") from None
        data["hosts"] = [Host(**h) for h in data.get("hosts", [])]
        return cls(**data)

    # -- up and down ---------------------------------------------------------------------------------
    @classmethod
    def up(cls, spec: LabSpec) -> Lab:
        """Create the lab ``spec`` asks for (refusing when one of that name exists) and return it; on any failure,
        or Ctrl-C, what was made so far is removed before the error goes on. :func:`session` also takes it down."""
        name, hosts, slots, bps = spec.name, spec.hosts, spec.slots, spec.link_bps
        netns.preflight()
        leftovers = [ns for ns in netns.namespaces() if ns.startswith(f"{PREFIX}{name}-")]
        state_root().mkdir(parents=True, exist_ok=True)
        try:
            if leftovers:
                raise FileExistsError
            (state_root() / name).mkdir()  # the lock: one `lab up` of a name at a time
        except FileExistsError:
            raise ConfigError(f"lab {name!r} already exists; `dpcompare lab down{_named(name)}` first, "
                              "or pick another --name") from None
        try:
            with _subnets_locked():  # two labs coming up at once never pick one subnet
                net = _free_subnet()
                lab = cls(name=name, switch=f"{PREFIX}{name}-sw", subnet=str(net), slots=slots, link_bps=bps,
                          created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
                lab.hosts = [Host(i, f"{PREFIX}{name}-h{i}", str(net.network_address + i + 1), f"dplab-h{i}", bps)
                             for i in range(hosts)]
                lab._save()  # first: a crash from here on leaves a state file `lab down` reads
            lab._create()
            lab._write_launch_files()
            lab._open_remote_access()
            lab.status = "up"
            lab._save()
        except BaseException:
            sweep(name)
            raise
        return lab

    def _create(self) -> None:
        sw = self.switch
        netns.ip("netns", "add", sw)
        netns.ip("-n", sw, "link", "set", "lo", "up")
        netns.ip("-n", sw, "link", "add", BRIDGE, "type", "bridge")
        netns.ip("-n", sw, "link", "set", BRIDGE, "up")
        prefix = ipaddress.IPv4Network(self.subnet).prefixlen
        for h in self.hosts:
            netns.ip("netns", "add", h.namespace)
            netns.ip("link", "add", IFACE, "netns", h.namespace, "type", "veth", "peer", "name", h.port, "netns", sw)
            netns.ip("-n", sw, "link", "set", h.port, "master", BRIDGE)
            netns.ip("-n", sw, "link", "set", h.port, "up")
            netns.ip("-n", h.namespace, "addr", "add", f"{h.address}/{prefix}", "dev", IFACE)
            netns.ip("-n", h.namespace, "link", "set", IFACE, "up")
            netns.ip("-n", h.namespace, "link", "set", "lo", "up")
        self.set_link(self.link_bps)

    def _open_remote_access(self) -> None:
        """Host names inside the hosts, and an sshd in each when this machine has one (:mod:`.remote`)."""
        remote.write_hosts_files([(h.namespace, h.address) for h in self.hosts])
        if remote.sshd_problem() is None:
            remote.prepare(self.directory, [h.address for h in self.hosts])
            for h in self.hosts:
                remote.start_sshd(self.directory, h.namespace, h.address)
            self.ssh = True

    def down(self) -> list[str]:
        """Remove the lab's namespaces (ending what runs in them) and its state folder; what was removed."""
        return sweep(self.name)

    # -- shaping and faults --------------------------------------------------------------------------
    def set_link(self, bps: int | None, host: int | None = None) -> None:
        """Shape every host's link (or only ``host``'s) to ``bps`` bits/s in both directions; None unshapes."""
        check_link(bps)
        for h in self._chosen(host):
            netns.shape(h.namespace, IFACE, bps)  # host → switch
            netns.shape(self.switch, h.port, bps)  # switch → host
            h.link_bps = bps
        if host is None:
            self.link_bps = bps
        self._save()

    def set_link_state(self, host: int, up: bool) -> None:
        """Take ``host``'s link down (its switch port: the host sees no carrier) or bring it back."""
        for h in self._chosen(host):
            netns.ip("-n", self.switch, "link", "set", h.port, "up" if up else "down")
            h.up = up
        self._save()

    def fail_host(self, host: int) -> None:
        """``host`` dies as a machine losing power does: its link goes down first (so nothing it sends after, not
        even its sockets' FIN, reaches anyone), then every process in it is killed (its sshd too)."""
        self.set_link_state(host, up=False)
        h = self._chosen(host)[0]
        netns.kill_processes(h.namespace)
        h.alive = False
        self._save()

    def revive_host(self, host: int) -> None:
        """``host`` is back: its link up and, when the lab has ssh, its sshd started again (a rebooted node)."""
        h = self._chosen(host)[0]
        if self.ssh and not h.alive:
            remote.start_sshd(self.directory, h.namespace, h.address)
        h.alive = True
        self.set_link_state(host, up=True)

    def _chosen(self, host: int | None) -> list[Host]:
        if host is None:
            return self.hosts
        if not 0 <= host < len(self.hosts):
            raise ConfigError(f"--host {host}: lab {self.name!r} has hosts 0 to {len(self.hosts) - 1}")
        return [self.hosts[host]]

    # -- launching -----------------------------------------------------------------------------------
    def _write_launch_files(self) -> None:
        atomic_write_text(self.hostfile, "".join(f"{h.address} slots={self.slots}\n" for h in self.hosts))
        cases = "".join(f"  {h.address}|{h.namespace}) ns={h.namespace} ;;\n" for h in self.hosts)
        ompi = remote.ompi_host_folder(self.directory, "$ns")
        exports = "".join(f'export {var}="{ompi}"\n' for var in remote.OMPI_HOST_FOLDER_VARS)
        atomic_write_text(self.agent, AGENT.format(name=self.name, cases=cases, exports=exports, ompi=ompi))
        self.agent.chmod(0o755)

    @property
    def np(self) -> int:
        return len(self.hosts) * self.slots

    def environment(self, np: int | None = None) -> dict[str, str]:
        """What every rank of ``np`` (default: every slot) needs here besides the forwarded variables: the link's
        rate (busbw as a share of it, :mod:`dpcompare.trace`) and how many ranks share this machine's cores."""
        return {LINK_ENV: str(self.link_bps or ""), CPU_SHARERS: str(np or self.np)}

    def command(self, argv: Sequence[str], np: int | None = None, *, mpi_options: Sequence[str] = (),
                per_host: int | None = None, elastic: ElasticLaunch | None = None) -> list[str]:
        """The whole command running ``argv`` as ``np`` ranks (default: every slot) across the lab, from host 0
        (:class:`~dpcompare.launch.jobs.Placement`'s command; build it with :func:`~dpcompare.launch.jobs.job_line`).
        ``elastic``: an elastic job instead (:meth:`elastic_command`).

        Open MPI's mpirun with the lab's hostfile, its remote agent and keepalives, MPI's TCP kept on the lab's
        subnet, gloo/NCCL on its interface; PATH, VIRTUAL_ENV, the HOROVOD_/GLOO_/... variables set here and
        :meth:`environment` are forwarded with ``-x``. Ranks fill host 0's slots first, then host 1's...;
        ``per_host`` places that many on each host instead. ``mpi_options``: more Open MPI options (e.g.
        ``--mca coll_tuned_use_dynamic_rules 1``).
        """
        if elastic is not None:
            return self.elastic_command(argv, np or self.np, elastic)
        if mpirun.mpi_flavor() != "openmpi":
            raise LaunchError("the lab's remote agent is Open MPI's (plm_rsh_agent); put Open MPI's mpirun on PATH")
        env = {**mpirun.forwarded_env(os.environ, IFACE, mpirun.current_venv()), **self.environment(np)}
        hostfile = self._hostfile_for(np or self.np, per_host)
        cmd = mpirun.openmpi_command(np or self.np, argv, hostfile=str(hostfile), env=env, mpi_net=self.subnet)
        if per_host:
            cmd[cmd.index("--map-by") + 1] = f"ppr:{per_host}:node"
        return self.in_host([cmd[0], "--mca", "plm_rsh_agent", str(self.agent), *KEEPALIVE, *mpi_options, *cmd[1:]])

    def _hostfile_for(self, np: int, per_host: int | None) -> Path:
        """The hostfile of the hosts ``np`` ranks fill (``hostfile``, or ``hostfile-N`` naming the first N): Open MPI
        starts a daemon on every host its hostfile names, so one it does not use must not be there (a dead spare
        host would fail the job)."""
        used = min(len(self.hosts), -(-np // (per_host or self.slots)))
        if used == len(self.hosts):
            return self.hostfile
        path = self.directory / f"hostfile-{used}"
        atomic_write_text(path, "".join(f"{h.address} slots={self.slots}\n" for h in self.hosts[:used]))
        return path

    def elastic_command(self, argv: Sequence[str], np: int, how: ElasticLaunch) -> list[str]:
        """``argv`` as an elastic job of ``np`` ranks that may shrink to ``how.min_np``: torchrun's agents, one per
        host, each inside its host (one job: :func:`~dpcompare.launch.elastic.together`, host 0's agent in front),
        or ``horovodrun`` elastic started in host 0, reaching the others by the lab's ssh."""
        per_node = min(np, self.slots)
        used = -(-np // per_node)
        if np % per_node or used > len(self.hosts):
            raise ConfigError(f"an elastic job of {np} ranks needs whole hosts of {per_node} slot(s) (lab "
                              f"{self.name!r}: {len(self.hosts)} × {self.slots}); choose --np as a multiple of it")
        env = {**mpirun.forwarded_env(os.environ, IFACE, mpirun.current_venv()), **self.environment(np)}
        if how.launcher == "torchrun":
            agents = [self._agent(argv, how, per_node, used, h, env) for h in self.hosts[:used]]
            return elastic.together(agents[0], agents[1:])
        if not self.ssh:
            raise LaunchError(remote.sshd_problem() or f"lab {self.name!r} was made without ssh; make it again")
        env["PATH"] = f"{self.directory / 'bin'}:{env.get('PATH', os.environ.get('PATH', ''))}"
        env[remote.FIRST_CALL] = str(self.directory / f"first-{how.run_id}-{secrets.token_hex(3)}")
        return self.in_host(elastic.with_env(elastic.horovodrun_command(
            argv, np=np, min_np=how.min_np, max_np=np, discovery_script=str(self.directory / "discover.sh"),
            iface=IFACE, slots=per_node, horovodrun=elastic.executable("horovodrun")), env))

    def _agent(self, argv: Sequence[str], how: ElasticLaunch, per_node: int, hosts: int, h: Host,
               env: dict[str, str]) -> list[str]:
        """Host ``h``'s torchrun agent, started inside it, meeting the others at host 0."""
        agent = elastic.torchrun_command(
            argv, nnodes=(-(-how.min_np // per_node), hosts), nproc_per_node=per_node,
            endpoint=f"{self.hosts[0].address}:{elastic.RDZV_PORT}", run_id=how.run_id, max_restarts=how.max_restarts,
            local_addr=h.address, torchrun=elastic.executable("torchrun"))
        return self.in_host(elastic.with_env(agent, {**env, **elastic.TORCHRUN_ENV}), h.index)

    def rejoin_command(self, argv: Sequence[str], np: int, how: ElasticLaunch, host: int) -> list[str] | None:
        """What brings a revived ``host`` back into the elastic job :meth:`elastic_command` started: a torchrun agent
        on it (the others restart their workers to take it in); None for horovodrun, whose discovery script sees
        the host again and whose driver starts a worker there over ssh by itself."""
        if how.launcher != "torchrun":
            return None
        per_node = min(np, self.slots)
        env = {**mpirun.forwarded_env(os.environ, IFACE, mpirun.current_venv()), **self.environment(np)}
        return self._agent(argv, how, per_node, -(-np // per_node), self._chosen(host)[0], env)

    def in_host(self, cmd: Sequence[str], host: int = 0) -> list[str]:
        """``cmd`` run inside ``host``'s namespace."""
        return ["ip", "netns", "exec", self._chosen(host)[0].namespace, *cmd]

    def run(self, argv: Sequence[str], logs: Path, np: int | None = None, *, timeout: float | None = None,
            **options: object) -> tuple[int | None, float]:
        """Run ``argv`` (e.g. ``[*dpcompare_argv(), "train", ...]``) across the lab and wait for it, its output in
        ``logs``/stdout.log and stderr.log (:func:`~dpcompare.launch.jobs.run_job`: a timeout or Ctrl-C ends its
        ranks on every host); ``options``: :meth:`command`'s. (exit code or None when stopped, seconds)."""
        cmd = jobs.job_line(argv, np or self.np, self, **options)
        return jobs.run_job(cmd, logs, mpirun.job_env(), timeout)

    def lost_line(self, output: str = "") -> str | None:
        """One line naming the hosts a failed job lost: those mpirun says it lost contact with (in ``output``),
        those whose switch port is down now, and those whose link crawls (:meth:`crawling`): a collective that
        waits on one does not finish within ``--timeout`` either; None when there is none."""
        named = set(_LOST_DAEMON.findall(output))
        try:
            down = {r["address"] for r in self.host_rows() if r["port"] == "DOWN"}
        except LaunchError:
            down = set()
        crawl = {h.address for h in self.crawling()}
        lost = [h for h in self.hosts if h.address in named | down | crawl]
        if not lost:
            return None
        what = ", ".join(f"host {h.index} ({h.address}, namespace {h.namespace})" for h in lost)
        if all(h.address in down for h in lost):
            why = "its link is down"
        elif all(h.address in crawl for h in lost):
            # at a crawl either end comes first: a rank's step watchdog, or mpirun's keepalive probes stuck behind
            # the trickle of gradients (it then says it lost the daemon)
            then = ("and mpirun lost contact with its daemon" if named & crawl else
                    "so its collectives did not finish within --timeout")
            why = (f"its link crawls at {format_rate_bits(lost[0].link_bps)} (the others': "
                   f"{format_rate_bits(self._fastest_other(lost[0]))}), {then}")
        else:
            why = "mpirun lost contact with its daemon"
        return f"dpcompare lab {self.name}: lost {what}: {why}; the job was ended"

    def crawling(self) -> list[Host]:
        """Hosts whose link is shaped to a crawl next to the others': a hundredth of the fastest other host's link
        or less (unshaped counts as fastest), or a tenth or less and below :data:`CRAWL_BPS`."""
        out = []
        for h in self.hosts if len(self.hosts) > 1 else []:
            other = self._fastest_other(h)
            ratio = float("inf") if other is None else other / h.link_bps if h.link_bps else 0.0
            if h.link_bps is not None and (ratio >= CRAWL_RATIO or (h.link_bps < CRAWL_BPS and ratio >= 10)):
                out.append(h)
        return out

    def _fastest_other(self, h: Host) -> int | None:
        others = [o.link_bps for o in self.hosts if o is not h]
        return None if None in others else max(others, default=None)  # type: ignore[type-var]

    # -- what exists ---------------------------------------------------------------------------------
    def host_rows(self) -> list[dict[str, object]]:
        """Per host: namespace present, link state, shaping read back from tc, bytes sent and received."""
        present = set(netns.namespaces())
        rows = []
        for h in self.hosts:
            link = netns.json_of(["ip", "-j", "-s", "-n", h.namespace, "link", "show", "dev", IFACE])
            port = netns.json_of(["ip", "-j", "-n", self.switch, "link", "show", "dev", h.port])
            qdisc = netns.json_of(["tc", "-j", "-n", h.namespace, "qdisc", "show", "dev", IFACE])
            stats = (link[0].get("stats64") or link[0].get("stats") or {}) if link else {}
            q = qdisc[0] if qdisc else {}
            rate = q.get("options", {}).get("rate") if q.get("kind") == "tbf" else None
            rows.append({"host": h.index, "namespace": h.namespace, "present": h.namespace in present,
                         "address": h.address, "port": port[0].get("operstate", "?") if port else "missing",
                         "shaped": format_rate_bits(rate * 8) if rate else "unlimited",
                         "tx_bytes": stats.get("tx", {}).get("bytes"), "rx_bytes": stats.get("rx", {}).get("bytes")})
        return rows


AGENT = """#!/bin/sh
# dpcompare lab {name}: Open MPI's remote agent in place of ssh.
# Called as AGENT [OPTIONS] HOST COMMAND...; runs COMMAND inside HOST's network namespace.
while [ "${{1#-}}" != "$1" ]; do shift; done
host=$1; shift
case "$host" in
{cases}  *) echo "dpcompare lab {name}: unknown host $host" >&2; exit 1 ;;
esac
# each host its own Open MPI folder (remote.OMPI_HOST_FOLDER_VARS says why)
{exports}mkdir -p "{ompi}"
exec ip netns exec "$ns" /bin/sh -c "$*"
"""


@contextlib.contextmanager
def session(spec: LabSpec | None, say: Callable[[str], object] | None = None) -> Iterator[Lab | None]:
    """``with session(spec) as lab:`` the lab ``spec`` asks for, up now and down at the end, also on failure and
    Ctrl-C (None: no lab, and ``lab`` is None); ``say`` is told in one line what was made. compare, parity and
    ``launch --lab`` run inside a lab through this."""
    if spec is None:
        yield None
        return
    lab = Lab.up(spec)
    try:
        if say is not None:
            say(f"lab {lab.name!r} up: {len(lab.hosts)} hosts × {lab.slots} slot(s) on {lab.subnet}, link {lab.link} "
                "(removed when this command ends)")
        yield lab
    finally:
        lab.down()


def _named(name: str) -> str:
    return "" if name == "default" else f" --name {name}"


def lab_names() -> list[str]:
    """Labs that exist in any part: a state folder, or a namespace carrying the prefix."""
    names = {p.name for p in state_root().glob("*") if p.is_dir()} if state_root().is_dir() else set()
    names |= {ns[len(PREFIX):].rsplit("-", 1)[0] for ns in netns.namespaces() if ns.startswith(PREFIX)}
    return sorted(names)


def sweep(name: str | None = None) -> list[str]:
    """Remove lab ``name`` (every lab when None): its namespaces, found by prefix whether or not a state file
    names them, and its state folder. Returns what was removed."""
    prefix = PREFIX if name is None else f"{PREFIX}{check_name(name)}-"
    removed = []
    # hosts before switches: a deleted host namespace takes its veth pair (and the bridge port) with it
    for ns in sorted((n for n in netns.namespaces() if n.startswith(prefix)), key=lambda n: n.endswith("-sw")):
        if netns.remove_namespace(ns):
            removed.append(f"namespace {ns}")
    removed += remote.remove_hosts_files(prefix)
    root = state_root()
    for d in ([root / name] if name is not None else list(root.glob("*")) if root.is_dir() else []):
        if d.is_dir():
            shutil.rmtree(d, ignore_errors=True)
            removed.append(f"state {d}")
    with contextlib.suppress(OSError):
        root.rmdir()  # only when empty
    return removed


@contextlib.contextmanager
def _subnets_locked() -> Iterator[None]:
    """Hold the labs' subnet lock (an flock on a file in the state folder) while a subnet is picked and saved."""
    with open(state_root() / ".subnet.lock", "a") as f:  # not atomic: an empty lock file, never read
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _free_subnet() -> ipaddress.IPv4Network:
    """The first 10.250.X.0/24 (X from 200) no other lab holds and the root namespace does not use."""
    taken = netns.root_networks()
    for name in lab_names():
        with contextlib.suppress(ConfigError):
            taken.append(ipaddress.IPv4Network(Lab.load(name).subnet))
    for x in range(FIRST_NET, LAST_NET + 1):
        net = ipaddress.IPv4Network(f"10.250.{x}.0/24")
        if not any(net.overlaps(t) for t in taken):
            return net
    raise ConfigError("no free 10.250.X.0/24 for a new lab (X 200-254 all in use); take a lab down first")
