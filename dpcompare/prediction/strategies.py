"""Strategy name → its schedule class, from the ``schedule`` of its line in :mod:`dpcompare.backends.catalog`
(a new strategy's schedule is its module here and that one entry; nothing to list in this file)."""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

from dpcompare.backends.catalog import STRATEGIES
from dpcompare.errors import ConfigError
from dpcompare.prediction.network import floor_from
from dpcompare.prediction.profile import Profile, find_runs, load_profile
from dpcompare.prediction.schedule import Knobs, Schedule


@functools.cache
def schedules() -> dict[str, type[Schedule]]:
    """Every strategy that has a schedule → its class (imported on first use)."""
    out: dict[str, type[Schedule]] = {}
    for name, entry in STRATEGIES.items():
        if entry.schedule:
            module, _, cls = entry.schedule.partition(":")
            out[name] = getattr(importlib.import_module(module), cls)
    return out


#: what a run of a strategy without a schedule (``single``) is predicted as, unless --strategies says
DEFAULT_FOR_UNKNOWN = ("ddp", "horovod")


def schedule(name: str) -> type[Schedule]:
    known = schedules()
    if name not in known:
        raise ConfigError(f"no model of strategy {name!r}; choose from {', '.join(known)}")
    return known[name]


def profile(folder: str | Path, untraced: str = "auto") -> Profile:
    """A run's compute profile, told whether its own strategy sharded the optimizer (``untraced``: when the
    tracing's own cost is taken out, :func:`.profile.load_profile`)."""
    return load_profile(folder, lambda s: s in schedules() and schedules()[s].shards_optimizer, untraced)


def modelled_as(p: Profile, asked: list[str] | None) -> list[str]:
    """The strategies to predict from profile ``p``: those asked, else its own (or ddp and horovod for single)."""
    if asked:
        return asked
    return [p.strategy] if p.strategy in schedules() else list(DEFAULT_FOR_UNKNOWN)


def _traced_backend(p: Profile) -> str | None:
    """The backend ``p``'s own strategy communicated on (None: its strategy has no schedule)."""
    return schedule(p.strategy)(p, Knobs()).backend() if p.strategy in schedules() else None


def trace_floors(p: Profile) -> dict[str, tuple[float, float, int]]:
    """{backend: floor} from the all-reduces traced in ``p`` (under its own strategy's backend), for
    :attr:`.network.Network.floors`; empty when its strategy has no schedule or it traced none."""
    backend = _traced_backend(p)
    f = floor_from(p.measured.get("allreduces") or [], p.world_size) if backend else None
    return {backend: f} if backend and f else {}


def trace_waits(p: Profile) -> dict[str, float]:
    """{backend: seconds} a traced all-reduce of ``p`` waited for its last rank (:attr:`.network.Network.waits`);
    empty when its strategy has no schedule or no all-reduce was matched across its ranks."""
    backend, w = _traced_backend(p), p.measured.get("allreduce_wait_s")
    return {backend: float(w)} if backend and w is not None else {}


def profile_runs(paths: list[str]) -> list[Path]:
    """The traced run folders among ``paths`` (run folders, or compare folders with runs/*/trace.json)."""
    return find_runs(paths)
