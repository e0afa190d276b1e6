"""``dpcompare lab up | down | status | bench | set-link``: an emulated cluster on this machine."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from dpcompare.argtypes import format_rate_bits, nonneg_float, nonneg_int, positive_int
from dpcompare.errors import ConfigError, LaunchError
from dpcompare.lab import bench, hosts, netns
from dpcompare.lab.spec import LabSpec, lab_spec_arg, link_arg
from dpcompare.launch.commands import command_words, run_printed
from dpcompare.options import deprecate
from dpcompare.trace import collective_name
from dpcompare.versions import docs_page

DESCRIPTION = """\
An emulated cluster on one machine: N hosts (Linux network namespaces) on one switch (a bridge in its own
namespace), each host's link shaped in both directions with the kernel's tbf qdisc. mpirun reaches the hosts
through a remote agent instead of ssh; horovodrun through an sshd inside each host (none in the root namespace). Needs
root and iproute2 (ip, tc); shaping needs tbf. Bandwidth only: without netem no latency or loss can be added, and an
unshaped veth is CPU-bound (13-25 Gbit/s here).
"""

EPILOG = """\
examples:
  dpcompare lab up --host-count 2 --link 1gbit     # hosts dplab-default-h0, -h1 on 10.250.200.0/24
  dpcompare lab bench --out-file bench.json        # all-reduce/all-gather sweep: gloo, MPI, MPI recursive doubling
  dpcompare lab set-link 200mbit                   # reshape every link (or --host I); down/up: a host's link
  dpcompare lab kill --host 2                      # host 2 dies: link down, its processes killed; `revive` it
  dpcompare lab status
  dpcompare lab down                               # also after a crash; `lab down --all` sweeps every lab
"""


def _up(a: argparse.Namespace) -> int:
    lab = hosts.Lab.up(LabSpec(hosts=a.hosts, link_bps=a.link, slots=a.slots, name=a.name))
    print(f"lab {lab.name}: {len(lab.hosts)} hosts × {lab.slots} slot{'s' if lab.slots > 1 else ''} on "
          f"{lab.subnet}, links {lab.link} both ways; state in {lab.directory}")
    try:
        print(f"run across it:  {shlex.join(lab.command(['PROGRAM']))} ...")
    except LaunchError as e:  # no Open MPI here: the lab is up all the same
        print(f"to run across it: {e}")
    return 0


def _down(a: argparse.Namespace) -> int:
    netns.preflight()
    if a.all and a.name != "default":
        raise ConfigError("--all removes every lab; give it without --name")
    removed = hosts.sweep(None if a.all else a.name)
    print("\n".join(f"removed {r}" for r in removed) if removed else
          f"nothing to remove ({'no lab' if a.all else f'no lab {a.name!r}'} exists)")
    return 0


def _status(a: argparse.Namespace) -> int:
    # lazy: rich loads only when this prints
    from rich.console import Console

    # lazy: rich loads only when this prints
    from rich.table import Table

    names = hosts.lab_names()
    console = Console()
    if not names:
        console.print("no lab exists (dpcompare lab up --host-count 2 --link 1gbit)")
        return 0
    for name in names:
        try:
            lab = hosts.Lab.load(name)
        except ConfigError:
            console.print(f"lab {name}: leftovers without a state file; `dpcompare lab down --name {name}` removes "
                          "them")
            continue
        t = Table(title=f"lab {name}: {lab.status}, {lab.subnet}, link {lab.link}, {lab.slots} slot(s) per host, "
                        f"since {lab.created}")
        for col in ("host", "namespace", "present", "address", "switch port", "shaped", "tx bytes", "rx bytes"):
            t.add_column(col)
        for r in lab.host_rows():
            t.add_row(*(str(r[k]) for k in ("host", "namespace", "present", "address", "port", "shaped",
                                             "tx_bytes", "rx_bytes")))
        console.print(t)
    return 0


def _bench(a: argparse.Namespace) -> int:
    # lazy: rich loads only when this prints
    from rich.console import Console

    netns.preflight()
    lab = hosts.Lab.load(a.name)
    backends = [b.strip() for b in a.backends.split(",")]
    collectives = [collective_name(c) for c in a.collectives.split(",")]
    for x, allowed, flag in ((backends, bench.BACKENDS, "--backends"), (collectives, bench.COLLECTIVES,
                                                                         "--collectives")):
        bad = [v for v in x if v not in allowed]
        if bad or not x:
            raise ConfigError(f"{flag} {','.join(x)}: choose from {', '.join(allowed)}")
    doc = bench.measure(lab, bench.parse_sizes(a.sizes), backends, collectives, a.warmup, a.iters, a.timeout,
                        a.gap_ms, a.repeats, back_to_back=not a.no_back_to_back)
    for table in bench.tables(doc):
        Console().print(table)
    if a.out:
        bench.write(doc, Path(a.out))
        print(f"wrote {a.out}")
    return 0


def _set_link(a: argparse.Namespace) -> int:
    netns.preflight()
    lab = hosts.Lab.load(a.name)
    if a.rate in ("down", "up"):
        if a.host is None:
            raise ConfigError(f"set-link {a.rate} takes a link down or up one host at a time: add --host I")
        lab.set_link_state(a.host, a.rate == "up")
        print(f"lab {lab.name}: host {a.host}'s link is {a.rate}")
    else:
        lab.set_link(a.rate, a.host)
        which = "every host's link" if a.host is None else f"host {a.host}'s link"
        print(f"lab {lab.name}: {which} shaped to {format_rate_bits(lab._chosen(a.host)[0].link_bps)} both ways")
    return 0


def _kill(a: argparse.Namespace) -> int:
    netns.preflight()
    lab = hosts.Lab.load(a.name)
    lab.fail_host(a.host)
    print(f"lab {lab.name}: host {a.host} is dead (link down, every process in it killed); `dpcompare lab revive "
          f"--host {a.host}` brings it back")
    return 0


def _revive(a: argparse.Namespace) -> int:
    netns.preflight()
    lab = hosts.Lab.load(a.name)
    lab.revive_host(a.host)
    print(f"lab {lab.name}: host {a.host} is back (link up{', sshd started' if lab.ssh else ''})")
    return 0


def _link_or_state(text: str) -> int | str | None:
    """``set-link``'s argument: ``down`` or ``up``, else a link rate (bits/s; None: unshaped)."""
    return text if text in ("down", "up") else link_arg(text)


def register(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:

    p = sub.add_parser("lab", help="an emulated cluster on this machine: hosts in namespaces, shaped links",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    lab = p.add_subparsers(dest="lab_command", metavar="ACTION", parser_class=parser_class)
    lab.required = True

    def action(name: str, func: object, help: str) -> argparse.ArgumentParser:
        q = lab.add_parser(name, help=help, description=help)
        q.add_argument("--name", default="default", help="which lab (default: default); names carry the prefix "
                                                          f"{hosts.PREFIX}")
        q.set_defaults(func=func)
        return q

    up = action("up", _up, "create N hosts on one switch, every link shaped to --link both ways")
    up.add_argument("--host-count", dest="hosts", type=positive_int, default=2, metavar="N",
                    help="number of hosts (default 2)")
    deprecate(up, "--hosts", "--host-count")
    up.add_argument("--link", type=link_arg, default="unlimited", metavar="RATE",
                    help="link rate: 1gbit, 200mbit, 10gbit, 500kbit... or unlimited (default)")
    up.add_argument("--slots", type=positive_int, default=1, help="MPI slots per host in the hostfile (default 1)")

    down = action("down", _down, "remove a lab: its namespaces (found by prefix too, after a crash) and state")
    down.add_argument("--all", action="store_true", help=f"remove every lab (every {hosts.PREFIX}* namespace)")
    action("status", _status, "show the labs that exist, host by host")

    b = action("bench", _bench, "all-reduce / all-gather sweep between the hosts (one rank each), nccl-tests style")
    b.add_argument("--sizes", default="4K:64M", help="MIN:MAX doubling, or a list 4K,1M,16M (default 4K:64M)")
    b.add_argument("--backends", default=",".join(bench.BACKENDS),
                   help="gloo, mpi (Open MPI's default all-reduce), mpi-rd (recursive doubling forced)")
    b.add_argument("--collectives", default=",".join(bench.COLLECTIVES), help=", ".join(bench.COLLECTIVES))
    b.add_argument("--warmup-steps", dest="warmup", type=nonneg_int, default=1, metavar="N",
                   help="untimed iterations per size (default 1)")
    b.add_argument("--iters", type=positive_int, default=5, help="timed iterations per size and repeat (slow sizes "
                   "run fewer, 3 at least)")
    b.add_argument("--repeats", type=positive_int, default=2, help="times the whole sweep runs, each a new mpirun "
                   "(default 2: 6 times per size at least, enough to see Open MPI's two speeds)")
    b.add_argument("--gap-ms", type=nonneg_float, default=None, metavar="MS",
                   help="idle time before each timed operation (default: twice the time the link's tbf bucket "
                        "takes to refill, so each starts like a step's first collective after compute; 0 on an "
                        "unshaped link)")
    b.add_argument("--no-back-to-back", action="store_true",
                   help="time each size only after the idle gap (by default, on a shaped link, the sweep runs again "
                        "back to back, as a step's collectives follow one another: predict prices those from it)")
    b.add_argument("--run-timeout", dest="timeout", type=positive_int, default=600, metavar="SECONDS",
                   help="seconds each mpirun job may take (default 600)")
    b.add_argument("--out-file", dest="out", metavar="FILE", help="write the results and α-β fits as JSON")
    for old, new in (("--warmup", "--warmup-steps"), ("--timeout", "--run-timeout"), ("--out", "--out-file")):
        deprecate(b, old, new)

    s = action("set-link", _set_link, "reshape a running lab's links, or take a host's link down/up")
    s.add_argument("rate", type=_link_or_state, metavar="RATE|down|up",
                   help="a rate (1gbit, 100kbit, unlimited), or down/up with --host")
    s.add_argument("--host", type=nonneg_int, help="only this host's link (0-based)")
    for name, func, what in (("kill", _kill, "a host dies: its link down, then every process in it killed"),
                             ("revive", _revive, "a dead host comes back: its link up, its sshd started")):
        k = action(name, func, what)
        k.add_argument("--host", type=nonneg_int, required=True, help="the host (0-based)")
    add_lab_to_launch(sub)


def add_lab_to_launch(sub: Any) -> None:
    """``dpcompare launch --lab hosts=N,link=RATE[,slots=K] --np N -- train ...``: the job across a lab made for
    it and removed after it (also on failure and Ctrl-C), as ``horovodrun -np 2 -H a:1,b:1`` places a job.

    The launch command is launch/'s; the lab is added here because launch/ may not import the lab.
    """
    launch = sub.choices.get("launch")
    if launch is None:
        return
    launch.add_argument("--lab", type=lab_spec_arg, metavar="hosts=N,link=RATE[,slots=K]",
                        help="run the job across an emulated cluster made for it and removed after it: N network "
                             "namespaces on links shaped to RATE, K ranks per host (default 1); needs root, iproute2 "
                             f"and tbf ({docs_page('lab')})")
    plain = launch.get_default("func")
    launch.set_defaults(func=lambda a: _launch_in_lab(a, sub) if a.lab is not None else plain(a))


def _launch_in_lab(a: argparse.Namespace, sub: Any) -> int:

    if a.hosts or a.hostfile or a.mpi_net or a.iface or a.launcher == "srun" or a.mpi == "mpich":
        raise ConfigError("--lab places the ranks itself (Open MPI's mpirun inside the lab's host 0): leave out "
                          "--hosts, --hostfile, --mpi-net, --iface, --launcher srun and --mpi mpich")
    words = command_words(a, sub)
    a.lab.check_np(a.np)
    with hosts.session(a.lab) as lab:
        rc = run_printed(a.np, words, a.dry_run, placement=lab)
        line = lab.lost_line() if rc != 0 and lab is not None else None
        if line:
            print(line, file=sys.stderr, flush=True)
    return rc
