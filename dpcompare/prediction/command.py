"""``dpcompare predict RUN_DIR...``: step time and scaling efficiency per strategy at many hosts, from traced runs."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any

from dpcompare.argtypes import format_rate_bits, fraction, nonneg_int, positive_float, positive_int, rate_bits
from dpcompare.config import OUTPUT
from dpcompare.errors import ConfigError
from dpcompare.options import START, Parser, Warned, add_config_file_option, deprecate, given_settings, write_config
from dpcompare.prediction.network import (
    Bench,
    Link,
    Network,
    load_bucket,
    load_calibration,
    load_profiles,
    parse_duration,
)
from dpcompare.report.projection import FOLDER
from dpcompare.versions import docs_page

DEFAULT_HOSTS = "2,4,8,...,1024"
#: the configuration a prediction writes beside prediction.json (``--config`` reads it back)
CONFIG_FILE = "prediction.toml"


def parse_host_counts(text: str) -> list[int]:
    """``2,4,8,...,1024`` → 2, 4, …, 1024 (``...`` continues the ratio of the two numbers before it)."""
    parts = [p.strip() for p in text.replace("…", "...").split(",") if p.strip()]
    try:
        out: list[int] = []
        for i, p in enumerate(parts):
            if p != "...":
                out.append(int(p))
                continue
            if len(out) < 2 or i + 1 >= len(parts) or out[-1] <= out[-2]:
                raise ValueError
            ratio, end = out[-1] / out[-2], int(parts[i + 1])
            while round(out[-1] * ratio) < end:
                out.append(round(out[-1] * ratio))
    except ValueError:
        raise ConfigError(f"--host-counts {text!r}: give host counts like 2,4,8,16 or 2,4,8,...,1024") from None
    if not out or min(out) < 1:
        raise ConfigError(f"--host-counts {text!r}: host counts are whole numbers of 1 or more")
    return sorted(set(out))


def source(folder: Path, world_size: int) -> str:
    """A run's name for labels: its folder, less compare's ``-r<repeat>[-s<seed>]`` (repeats of an arm are one
    curve), with the process count when the name does not say it."""
    name = re.sub(r"-r\d+(-s\d+)?$", "", folder.resolve().name)
    return name if re.search(rf"-np{world_size}\b", name) else f"{name}, np={world_size}"


def _network(a: argparse.Namespace) -> Any:
    alpha = parse_duration(a.latency)
    intra = None
    if a.ranks_per_host > 1:
        if not a.intra_link:
            raise ConfigError("--ranks-per-host above 1 needs --intra-link (e.g. 300gbyte for NVLink, 20gbyte "
                              "for a CPU socket's memory)")
        intra = Link.of(parse_duration(a.intra_latency), a.intra_link)
    calibrated = load_calibration(a.calibration) if a.calibration else {}
    profiles = load_profiles(a.calibration) if a.calibration else {}
    burst, gap = load_bucket(a.calibration) if a.calibration else (0.0, None)
    return Network(1, Link.of(alpha, a.link), a.ranks_per_host, intra, calibrated, profiles=profiles, burst=burst,
                   gap_s=gap)


def _overlap(a: argparse.Namespace, profiles: list[Any], over: dict[str, Any]) -> Any:
    """The overlap to correct every curve by: measured from ``--overlap-from`` against the predicted run of its
    strategy (else the first), or the stated assumption."""
    from dpcompare.prediction import overlap, strategies, sweep  # here, not at the top: it loads numpy

    if not a.overlap_from:
        return overlap.Overlap()
    (folder, *more) = strategies.profile_runs([a.overlap_from])
    if more:
        raise ConfigError(f"--overlap-from {a.overlap_from}: give one traced run folder, not {1 + len(more)}")
    shaped = strategies.profile(folder, a.untraced_compute)
    ref = {p.strategy: p for p in reversed(profiles)}.get(shaped.strategy, profiles[0])  # its strategy's run, if any
    cls = strategies.schedule(shaped.strategy if shaped.strategy in strategies.schedules() else ref.strategy)
    return overlap.measure(shaped, ref, cls, sweep.knobs_of(ref, over))


def _arms(folders: list[Path], untraced: str = "auto") -> tuple[list[Path], list[Any]]:
    """One profile per arm: the traced repeats of an arm in one comparison (``runs/ARM-npN-r0``, ``-r1``, ...)
    pooled (:func:`.profile.pooled`), each carrying the launches' spread estimated from all arms together
    (:func:`.profile.with_spread`), so that the band holds what moves between launches."""
    from dpcompare.prediction import strategies  # here, not at the top: it loads numpy

    # lazy: it loads numpy
    from dpcompare.prediction.profile import pooled, with_spread

    groups: dict[tuple[Path, str, str], list[Any]] = {}
    first: dict[tuple[Path, str, str], Path] = {}
    for f in folders:
        p = strategies.profile(f, untraced)
        key = (f.resolve().parent, source(f, p.world_size), p.strategy)
        groups.setdefault(key, []).append(p)
        first.setdefault(key, f)
    return list(first.values()), with_spread([pooled(ps) for ps in groups.values()])


def _curves(a: argparse.Namespace, hosts: list[int], net: Any) -> list[Any]:
    from dpcompare.prediction import interval, strategies, sweep  # here, not at the top: it loads numpy

    if a.straggler_from_trace and not a.floor_from_trace:
        raise ConfigError("--straggler-from-trace takes its wait out of the trace's floor: add --floor-from-trace")
    if not a.run_dirs:
        raise ConfigError("name a traced run folder or a compare --out folder (RUN_DIR), or give run_dirs in --config")
    asked = [s.strip() for s in a.strategies.split(",") if s.strip()] if a.strategies else None
    for s in asked or []:
        strategies.schedule(s)
    over = {"bucket_mb": a.bucket_mb, "horovod_fusion_mb": a.horovod_fusion_mb or a.bucket_mb,
            "horovod_cycle_ms": a.horovod_cycle_ms, "grad_compression": a.compression}
    noise = sweep.Noise(Bench.load(a.calibration) if a.calibration else None, a.floor_from_trace, a.bootstrap)
    model_error = interval.load(a.model_error)
    folders, profiles = _arms(strategies.profile_runs(a.run_dirs), a.untraced_compute)
    ov = _overlap(a, profiles, over)
    curves, seen = [], set()
    for folder, p in zip(folders, profiles, strict=True):
        net_p = dataclasses.replace(net, floors=strategies.trace_floors(p), waits=strategies.trace_waits(p)
                                    if a.straggler_from_trace else {}) if a.floor_from_trace else net
        for name in strategies.modelled_as(p, asked):
            label = f"{name} ({source(folder, p.world_size)})" if name == p.strategy else \
                f"{name} (on {source(folder, p.world_size)})"
            if label in seen:
                continue  # the same name from another folder: shown once
            seen.add(label)
            c = sweep.curve(p, name, sweep.knobs_of(p, over), net_p, hosts, label, noise, ov, model_error)
            c.advice = sweep.advise(c, p, net_p, a.threshold)
            curves.append(c)
    if not curves:
        raise ConfigError("no traced run to predict from")
    return curves


def _cmd_predict(a: argparse.Namespace) -> int:
    from dpcompare.prediction import output, sweep  # here, not at the top: it loads numpy and scipy and rich

    hosts = parse_host_counts(a.hosts)
    curves = _curves(a, hosts, _network(a))
    inter_link, intra_link = format_rate_bits(a.link), a.intra_link and format_rate_bits(a.intra_link)
    link = inter_link + (f" + {a.ranks_per_host}/host on {intra_link}" if a.ranks_per_host > 1 else "")
    lines = {"who_wins": sweep.verdict(curves, hosts),
             "below_threshold": output.answers(curves, a.threshold, inter_link),
             "knob_advice": [c.advice for c in curves],
             "band_advice": [c.band_advice for c in curves if c.band_advice],
             "overlap": [curves[0].overlap.source],
             "interval": [curves[0].model_error.describe()] if curves[0].model_error else []}
    out = Path(a.out or a.run_dirs[0])
    title = f"predicted on {link}, {a.latency} latency" + (" (calibrated)" if a.calibration else "")
    png = output.plot(curves, out / output.PNG_FILE, a.threshold, title)
    inputs = {"runs": a.run_dirs, "hosts": hosts, "link": inter_link, "latency": a.latency,
              "ranks_per_host": a.ranks_per_host, "intra_link": intra_link, "calibration": a.calibration,
              "threshold": a.threshold, "strategies": a.strategies and a.strategies.split(","),
              "floor_from_trace": a.floor_from_trace,
              "straggler_from_trace": a.straggler_from_trace, "untraced_compute": a.untraced_compute,
              "bootstrap": a.bootstrap, "overlap_from": a.overlap_from, "model_error": a.model_error}
    js = output.write_json(out / output.JSON_FILE, inputs, curves, lines, a.threshold)
    _write_config(a, out)
    console = output.make_console()
    if not a.quiet:
        console.print(f"[bold]dpcompare predict[/bold] · {title} · a model, not a measurement ({docs_page('predict')})")
        output.show(console, curves, lines, a.threshold)
    console.print(f"wrote {png} and {js}")
    return 0


def _write_config(a: argparse.Namespace, out: Path) -> None:
    """OUT/prediction.toml (not config.toml: OUT is often the run's own folder): the settings this prediction was
    given, which rerun it with ``dpcompare predict --config``."""
    settings = given_settings(a)
    if settings is not None:
        write_config(out / CONFIG_FILE, a.commands[a.command], settings)


def project(folder: Path, link_bps: int) -> Path | None:
    """``dpcompare predict FOLDER --link LINK --out FOLDER/projected --quiet`` (LINK: ``link_bps`` bits/s), for a
    comparison whose runs were traced: the report's "Projected to a cluster" section. None when no run was traced."""
    if not any((folder / "runs").glob("*/trace.json")):
        return None
    (folder / FOLDER).mkdir(exist_ok=True)
    p = Parser()
    register(p.add_subparsers(dest="command"), Parser)
    a = p.parse_args(["predict", str(folder), "--out", str(folder / FOLDER), "--quiet"])
    a.link = link_bps  # parsed once, at compare's --project-link
    _cmd_predict(a)
    return folder / FOLDER


def _trace_flags(p: argparse.ArgumentParser) -> None:
    """What ``predict`` takes from the traced run beyond its compute, and how it reads the compute."""
    p.add_argument("--floor-from-trace", action="store_true",
                   help="for a slower link on the same machine (e.g. the lab): no all-reduce faster than the traced "
                        "run's own of that size, no step of its strategy shorter than its traced step")
    p.add_argument("--straggler-from-trace", action="store_true", help="with --floor-from-trace: DDP's buckets wait "
                   "for the last rank as traced, before the wire instead of hidden under it")
    p.add_argument("--untraced-compute", choices=("auto", "always", "never"), default="auto",
                   help="scale the traced compute to the steps the run took after its traced window (8 or more), "
                        "taking the tracing's own cost out: auto where their forward ran under 0.9× the traced "
                        "one's, always, or never (default: auto)")


#: the section of predict's --help for the knobs it can change
WHAT_IF = "communication knobs, what if (each replaces the traced run's own)"
#: predict's --help by concern: what a first user needs first
SECTIONS = {START: ("--config", "--link", "--host-counts", "--strategies", "--latency", "--threshold", "--out"),
            WHAT_IF: ("--bucket-mb", "--horovod-cycle-ms", "--grad-compression"),
            "the network model": ("--ranks-per-host", "--intra-link", "--intra-latency", "--calibration",
                                  "--floor-from-trace", "--straggler-from-trace", "--untraced-compute",
                                  "--overlap-from", "--bootstrap", "--model-error"),
            OUTPUT: ("--quiet",)}


def _what_if_flags(p: Parser) -> None:
    """The knobs a prediction may change from the traced run's, and their old spellings."""
    p.add_argument("--bucket-mb", type=positive_float, default=None, metavar="MB", help="gradient bucket size in MB, "
                                                                                        "as train's: "
                   "DDP/ZeRO's bucket cap and Horovod's fusion threshold (default: the run's)")
    p.add_argument("--fusion-mb", dest="horovod_fusion_mb", type=positive_float, action=Warned, new="--bucket-mb",
                   default=None)
    p.add_argument("--horovod-cycle-ms", dest="horovod_cycle_ms", type=positive_float, default=None, metavar="MS",
                   help="Horovod cycle time, ms (default: the run's)")
    p.add_argument("--grad-compression", dest="compression", choices=("none", "fp16", "bf16"), default=None,
                   help="gradients on the wire (default: what the run used): fp16 and bf16 both halve the bytes")
    for old, new, const in (("--hosts", "--host-counts", None), ("--cycle-ms", "--horovod-cycle-ms", None),
                            ("--fp16", "--grad-compression", "fp16")):
        deprecate(p, old, new, const)


def register(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "predict", help="predict step time and scaling efficiency at many hosts from traced runs",
        description="Model one training step per strategy from traced runs (`dpcompare train --trace N`, or a "
                    "`dpcompare compare ... --trace N` folder) at many host counts on a given network: the traced "
                    "compute plus each strategy's collectives placed where the library runs them, priced by the "
                    "alpha-beta model. Prints a table per strategy, who wins where, when each falls below the "
                    "efficiency threshold and which knob would help; writes prediction.png and prediction.json. "
                    f"A model, not a measurement: {docs_page('predict')} states its assumptions.",
        epilog="examples:\n"
               "  dpcompare train --strategy ddp --trace 20 --out runs/traced   # under mpirun -np 2\n"
               "  dpcompare predict runs/traced --link 25gbit --host-counts 2,4,8,...,64\n"
               "  dpcompare predict runs/traced --strategies ddp,horovod --grad-compression fp16 --link 10gbit",
        formatter_class=argparse.RawDescriptionHelpFormatter, sections=SECTIONS)

    add_config_file_option(p)
    p.add_argument("run_dirs", nargs="*", metavar="RUN_DIR", help="a traced run folder or a compare --out folder")
    p.add_argument("--host-counts", dest="hosts", default=DEFAULT_HOSTS, metavar="N,N2,...",
                   help=f"host counts (default {DEFAULT_HOSTS}; '...' continues the ratio)")
    p.add_argument("--link", type=rate_bits, default="25gbit", metavar="RATE",
                   help="inter-host link rate, e.g. 25gbit, 200gbit, 1gbit (default 25gbit)")
    p.add_argument("--latency", default="5us", metavar="TIME",
                   help="inter-host latency per message step (alpha), e.g. 5us")
    p.add_argument("--ranks-per-host", type=positive_int, default=1, metavar="G",
                   help="ranks per host (hierarchical collectives on --intra-link inside a host; default 1)")
    p.add_argument("--intra-link", type=rate_bits, default=None, metavar="RATE",
                   help="intra-host link rate, e.g. 300gbyte (NVLink-class)")
    p.add_argument("--intra-latency", default="1us", metavar="TIME", help="intra-host latency (default 1us)")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="a `dpcompare lab bench --out-file FILE` JSON: measured alpha and bandwidth share per backend "
                        "and collective")
    _trace_flags(p)
    p.add_argument("--strategies", default=None, metavar="A,B[,...]",
                   help="model these strategies on every run's compute (default: each run's own; ddp,horovod for "
                        "single)")
    _what_if_flags(p)
    p.add_argument("--bootstrap", type=nonneg_int, default=200, metavar="N",
                   help="bootstrap replicates for each figure's 95 %% band, drawn from the traced steps and the "
                        "bench's repeats (default 200; 0: no band)")
    p.add_argument("--overlap-from", default=None, metavar="RUN_DIR",
                   help="a traced run of the same workload on a slow link (e.g. a short run on a shaped lab): how much "
                        "communication hides behind compute and how much compute it slows are measured from it "
                        "(default: assumed fully hidden where the schedule allows, slowing nothing)")
    p.add_argument("--model-error", default=None, metavar="FILE|none",
                   help="widen each band by the model's own error as a validation measured it, into a 90 %% "
                        "interval: a model-error file a validation wrote (default: the latest validation's, see "
                        f"{docs_page('predict')}; none: the band alone)")
    p.add_argument("--threshold", type=fraction, default=0.8, metavar="FRACTION",
                   help="efficiency to report falling below (default 0.8)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="folder for prediction.png and prediction.json (default: the first RUN_DIR)")
    p.add_argument("--quiet", action="store_true", help="write the files without printing the tables")
    p.set_defaults(func=_cmd_predict)
