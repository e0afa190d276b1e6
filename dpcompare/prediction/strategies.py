"""Strategy name → its schedule class: the plug-in table (a new strategy is one module and one line here)."""

from __future__ import annotations

from pathlib import Path

from dpcompare.errors import ConfigError
from dpcompare.prediction.ddp import DDPSchedule
from dpcompare.prediction.fsdp import FSDPSchedule
from dpcompare.prediction.horovod import HorovodSchedule
from dpcompare.prediction.profile import Profile, find_runs, load_profile
from dpcompare.prediction.schedule import Schedule
from dpcompare.prediction.zero import ZeroSchedule

SCHEDULES: dict[str, type[Schedule]] = {s.name: s for s in (DDPSchedule, HorovodSchedule, ZeroSchedule,
                                                               FSDPSchedule)}
#: what a run of a strategy without a schedule (``single``) is predicted as, unless --strategies says
DEFAULT_FOR_UNKNOWN = ("ddp", "horovod")


def schedule(name: str) -> type[Schedule]:
    if name not in SCHEDULES:
        raise ConfigError(f"no model of strategy {name!r}; choose from {', '.join(SCHEDULES)}")
    return SCHEDULES[name]


def profile(folder: str | Path) -> Profile:
    """A run's compute profile, told whether its own strategy sharded the optimizer."""
    return load_profile(folder, lambda s: s in SCHEDULES and SCHEDULES[s].shards_optimizer)


def modelled_as(p: Profile, asked: list[str] | None) -> list[str]:
    """The strategies to predict from profile ``p``: those asked, else its own (or ddp and horovod for single)."""
    if asked:
        return asked
    return [p.strategy] if p.strategy in SCHEDULES else list(DEFAULT_FOR_UNKNOWN)


def trace_floors(p: Profile) -> dict[str, tuple[float, float, int]]:
    """{backend: floor} from the all-reduces traced in ``p`` (under its own strategy's backend), for
    :attr:`.network.Network.floors`; empty when its strategy has no schedule or it traced none."""
    from dpcompare.prediction.network import floor_from
    from dpcompare.prediction.schedule import Knobs

    if p.strategy not in SCHEDULES:
        return {}
    f = floor_from(p.measured.get("allreduces") or [], p.world_size)
    return {SCHEDULES[p.strategy](p, Knobs()).backend(): f} if f else {}


def profile_runs(paths: list[str]) -> list[Path]:
    """The traced run folders among ``paths`` (run folders, or compare folders with runs/*/trace.json)."""
    return find_runs(paths)
