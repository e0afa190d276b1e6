"""Recognise a collective that failed because another process died, and say so in one line.

When a rank is killed its TCP connections are reset, so gloo (DDP on CPU) raises at once in the
survivors ("Connection reset by peer", "Connection closed by peer"); a peer that stops answering
without closing its sockets is reported when TrainConfig.timeout expires. Horovod over MPI does not
notice by itself (MPI is not fault tolerant; on one host its shared-memory transport just waits), and
with its gloo controller raises HorovodInternalError. What bounds the time is the launcher: mpirun
ends every rank as soon as one dies by a signal, as does srun with --kill-on-bad-exit=1 (which
dpcompare's srun lines and sbatch scripts carry), and both name the rank that died.
"""

from __future__ import annotations

import re

from dpcompare.errors import LaunchError
from dpcompare.launch.env import LaunchEnv, detect_launch_env

#: what gloo, c10d, NCCL and Horovod say when a peer is gone
_PEER_GONE = re.compile(
    r"connection (reset|closed|refused)|broken pipe|socket closed|end of file|no route to host"
    r"|timed out|timeout|peer .*(died|closed|exited)|horovod has been shut down|horovod.*(shut ?down|abort)",
    re.IGNORECASE)
#: text only collectives' errors carry (so unrelated RuntimeErrors are left alone)
_COLLECTIVE = re.compile(r"gloo|c10d|nccl|processgroup|horovod|\bpair\.cc|mpi_", re.IGNORECASE)
_DIST_ERRORS = {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError",
                "HorovodInternalError", "HostsUpdatedInterrupt"}

LOST_PEER_EXIT = 1


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in seen:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


def _short(text: str) -> str:
    """First line, without gloo's ``[path/pair.cc:537] `` prefix and its advice after the first sentence."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = re.sub(r"^\[[^\]]*\.(cc|cpp|h|hpp):\d+\]\s*", "", line)
    line = re.sub(r"\. This is typically caused by.*$", "", line)
    return line[:240]


def is_lost_peer(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is a collective failing because a peer is gone."""
    for e in _chain(exc):
        text = str(e)
        names = {c.__name__ for c in type(e).__mro__}
        if names & _DIST_ERRORS and (_PEER_GONE.search(text) or "Horovod" in type(e).__name__):
            return True
        if isinstance(e, RuntimeError) and _COLLECTIVE.search(text) and _PEER_GONE.search(text):
            return True
    return False


def lost_peer_message(exc: BaseException, env: LaunchEnv | None = None) -> str | None:
    """One line for a collective that failed because another process is gone, else None.

    ``env`` (default: read from the launcher's variables) names this rank and, at two processes, the lost one.
    """
    if not is_lost_peer(exc):
        return None
    if env is None:
        try:
            env = detect_launch_env()
        except LaunchError:
            env = None
    who = f" (rank {1 - env.rank})" if env is not None and env.world_size == 2 else ""
    where = f"rank {env.rank} of {env.world_size}" if env is not None and env.world_size > 1 else "this process"
    cause = next((_short(str(e)) for e in _chain(exc) if _PEER_GONE.search(str(e))), _short(str(exc)))
    return (f"lost contact with another process{who} in a collective on {where}: {cause}; it probably "
            "died or was killed, see the launcher's messages (mpirun/srun name the rank and the signal)")
