"""Command lines of elastic jobs: torchrun's elastic agents and ``horovodrun`` in elastic mode (pure builders).

An elastic job survives a lost host. torchrun (torchelastic) runs one agent per host; the agents meet in a c10d
rendezvous, and when a worker fails every agent stops its workers and starts them again with the survivors
(``--nnodes MIN:MAX``, at most ``--max-restarts`` times): the script resumes from its own checkpoint. Horovod
Elastic (``horovodrun`` with a host discovery script, gloo controller) keeps the surviving processes, which roll
back to their last in-memory commit and carry on with fewer workers; it starts workers on hosts the discovery
script names again. Where the agents or the driver run (the lab's hosts) is the placement's business
(:meth:`dpcompare.lab.Lab.command`); these functions only build the lines.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dpcompare.errors import ConfigError

LAUNCHERS = ("torchrun", "horovodrun")
#: the c10d rendezvous's port on the first host
RDZV_PORT = 29400
#: seconds torchrun's rendezvous waits for more nodes once MIN have joined (its default, 30 s, would add ~28 s to
#: every recovery); long enough for every host's agent to join the first round on a busy machine
LAST_CALL_S = 3
#: a lost host's agent leaves the rendezvous once it has missed KEEP_ALIVE_ATTEMPTS heartbeats KEEP_ALIVE_S apart;
#: until then the survivors' next round cannot start. torchrun's defaults (5 s × 3) held every recovery ~10 s past
#: the collective timeout that noticed the loss; 1 s × 5 sweeps it by then, with 5 s of slack for a busy machine
KEEP_ALIVE_S, KEEP_ALIVE_ATTEMPTS = 1, 5
#: torchrun shares the agent's TCP store with the workers of every restart, and a restarted world then reads the
#: previous world's process-group keys (a survivor connects to the dead rank 0's old port: "Connection refused",
#: restart after restart until the budget is spent; torch 2.15). A store per rendezvous round avoids it.
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


#: seconds horovodrun keeps a failed host out (``--blacklist-cooldown-range``): without a range it never takes a
#: host back, even when the discovery script names it again; with one, it retries the host after the cooldown
COOLDOWN_S = (1, 5)


@dataclass(frozen=True)
class ElasticLaunch:
    """An elastic job: which launcher, how few processes it may shrink to, how many restarts torchrun may make,
    and a run id (torchrun's rendezvous id)."""

    launcher: str
    min_np: int
    max_restarts: int = 3
    run_id: str = "dpcompare"

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ConfigError(f"unknown elastic launcher {self.launcher!r}; choose from {', '.join(LAUNCHERS)}")
        if self.min_np < 1:
            raise ConfigError(f"an elastic job needs at least one process, not {self.min_np}")


def executable(name: str) -> str:
    """``name`` beside the running Python (its venv's torchrun, horovodrun), else the bare name (PATH decides)."""
    path = Path(sys.executable).parent / name
    return str(path) if path.is_file() else name


def torchrun_command(argv: Sequence[str], *, nnodes: tuple[int, int], nproc_per_node: int, endpoint: str,
                     run_id: str, max_restarts: int, local_addr: str | None = None,
                     last_call_s: float = LAST_CALL_S, torchrun: str = "torchrun") -> list[str]:
    """One torchrun agent running ``argv`` (an executable: ``--no-python``) as ``nproc_per_node`` workers, in a c10d
    rendezvous at ``endpoint`` (HOST:PORT) with ``nnodes`` (MIN, MAX) agents; a failed worker restarts the
    whole group with the survivors, at most ``max_restarts`` times. ``local_addr``: the address this agent is
    known by (the lab's address of its host)."""
    lo, hi = nnodes
    if not 1 <= lo <= hi:
        raise ConfigError(f"--nnodes {lo}:{hi}: need 1 <= MIN <= MAX")
    cmd = [torchrun, f"--nnodes={lo}:{hi}", f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d",
           f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}",
           f"--rdzv-conf=last_call_timeout={last_call_s:g},keep_alive_interval={KEEP_ALIVE_S},"
           f"keep_alive_max_attempt={KEEP_ALIVE_ATTEMPTS}",
           f"--max-restarts={max_restarts}", "--monitor-interval=1"]
    if local_addr:
        cmd.append(f"--local-addr={local_addr}")
    return [*cmd, "--no-python", *argv]


def horovodrun_command(argv: Sequence[str], *, np: int, min_np: int, max_np: int, discovery_script: str,
                       iface: str, slots: int, horovodrun: str = "horovodrun") -> list[str]:
    """``horovodrun`` in elastic mode (gloo controller): ``np`` workers to start with, between ``min_np`` and
    ``max_np`` as hosts come and go, the hosts (``ADDRESS:SLOTS`` lines) from ``discovery_script``, every worker's
    gloo on ``iface`` (which also skips horovodrun's interface probe over ssh); a failed host is retried after
    :data:`COOLDOWN_S`, so that a host that comes back is taken in again."""
    if not 1 <= min_np <= np <= max_np:
        raise ConfigError(f"horovodrun elastic: need 1 <= --min-np {min_np} <= -np {np} <= --max-np {max_np}")
    lo, hi = COOLDOWN_S
    return [horovodrun, "-np", str(np), "--min-np", str(min_np), "--max-np", str(max_np),
            "--host-discovery-script", discovery_script, "--slots-per-host", str(slots),
            "--network-interface", iface, "--blacklist-cooldown-range", str(lo), str(hi), *argv]


def with_env(cmd: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """``cmd`` with ``env`` set on its own line (``env K=V ... cmd``), so that the recorded line reruns it alone."""
    return ["env", *(f"{k}={v}" for k, v in env.items()), *cmd] if env else list(cmd)


def together(first: Sequence[str], others: Sequence[Sequence[str]]) -> list[str]:
    """One command running ``others`` in the background and ``first`` in the foreground (``sh -c``): the job's
    exit code is ``first``'s, and the others are ended when it ends. torchrun's agents are one job this way; the
    first is the rendezvous host's, whose agent reports the group's result, and a lost host's agent is no part
    of it."""
    started = "".join(f"{shlex.join(c)} & p{i}=$!; " for i, c in enumerate(others))
    pids = " ".join(f"$p{i}" for i in range(len(others)))
    script = f"{started}{shlex.join(first)}; rc=$?; kill {pids} 2>/dev/null; wait; exit $rc"
    return ["sh", "-c", script]
