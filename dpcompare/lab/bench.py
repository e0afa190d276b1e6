"""``dpcompare lab bench``: a nccl-tests-style message-size sweep between the lab's hosts, and an α-β fit.

Three columns: gloo (torch.distributed), MPI (mpi4py, Open MPI's own all-reduce choice) and ``mpi-rd`` (Open
MPI with recursive doubling forced for all-reduce). For each size: bytes, time (median over iterations of the
slowest rank), algbw = bytes/time, busbw = algbw × 2(n−1)/n (all-reduce) or (n−1)/n (all-gather), and busbw as a
share of the link. The fit, per backend and collective: time ≈ alpha_s + bytes × beta_s_per_byte, the fixed cost
from the small messages, the bandwidth from the large ones (:func:`dpcompare.trace.fit_line` on each end).

Each size is timed ``--repeats`` times over (separate mpirun jobs, each of ``--iters`` iterations) and every
time is kept: Open MPI's all-reduce in the lab runs at one of two speeds (63 % or 93 % of the link at 16–64 MiB),
so a size's times are checked for two modes (:func:`two_modes`: two k-means clusters, scipy.cluster.vq.kmeans2,
kept when Ashman's D between them exceeds 2) and the bench says when it sees two. ``predict`` reads the times,
the modes and their shares (a two-component mixture) and resamples them for its band.

On a shaped link the sweep runs a second time **back to back** (no idle gap; rows marked ``back_to_back``): a
training step's collectives follow one another, and Open MPI's all-reduce between two hosts is slower then than
after an idle moment. ``predict`` prices an operation that follows another from those rows.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dpcompare.argtypes import format_rate_bits
from dpcompare.errors import ConfigError, LaunchError
from dpcompare.files import atomic_write_text
from dpcompare.lab.hosts import Lab
from dpcompare.lab.netns import burst_bytes
from dpcompare.launch.jobs import log_tail
from dpcompare.launch.openmpi import mpi_allreduce_mca
from dpcompare.trace import ALL_GATHER, ALL_REDUCE, bus_factor, collective_name, fit_line, idle_gap_s

SCHEMA = "dpcompare.lab.bench/1"
BACKENDS = ("gloo", "mpi", "mpi-rd")
COLLECTIVES = (ALL_REDUCE, ALL_GATHER)
#: Open MPI's recursive doubling for all-reduce (coll/tuned algorithm 3)
RECURSIVE_DOUBLING = tuple(x for k, v in mpi_allreduce_mca("recursive-doubling").items() for x in ("--mca", k, v))
#: repeats of a size below which two modes cannot be told apart (2 jobs × the worker's 3 iterations at least)
MIN_FOR_MODES = 6
_SIZE = re.compile(r"^(\d+)([kmg]?)i?b?$")


def parse_size(text: str) -> int:
    """``4K`` → 4096, ``64M`` → 67108864, ``1000`` → 1000 (binary units, as nccl-tests' -b/-e)."""
    m = _SIZE.match(text.strip().lower())
    if not m:
        raise ConfigError(f"size {text!r}: write bytes with an optional K, M or G (e.g. 4K, 64M)")
    return int(m.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m.group(2)]


def parse_sizes(text: str) -> list[int]:
    """``4K:64M`` (doubling from 4 KiB to 64 MiB) or a list ``4K,1M,16M``."""
    if ":" in text:
        lo, _, hi = text.partition(":")
        a, b = parse_size(lo), parse_size(hi)
        if not 0 < a <= b:
            raise ConfigError(f"--sizes {text!r}: MIN:MAX with 0 < MIN <= MAX")
        out = [a]
        while out[-1] * 2 <= b:
            out.append(out[-1] * 2)
        return out
    sizes = sorted({parse_size(s) for s in text.split(",") if s.strip()})
    if not sizes or sizes[0] <= 0:
        raise ConfigError(f"--sizes {text!r}: give at least one positive size")
    return sizes


def _jobs(backends: Sequence[str], collectives: Sequence[str]) -> list[tuple[list[str], list[str], str, tuple]]:
    """(worker backends, collectives, MPI label, extra mca) for each mpirun the sweep needs."""
    jobs = []
    first = [b for b in backends if b in ("gloo", "mpi")]
    if first:
        jobs.append((first, list(collectives), "mpi", ()))
    if "mpi-rd" in backends and ALL_REDUCE in collectives:  # the forced algorithm changes all-reduce only
        jobs.append((["mpi"], [ALL_REDUCE], "mpi-rd", RECURSIVE_DOUBLING))
    return jobs


def idle_gap_ms(link_bps: int | None) -> float:
    """How long the link idles before each timed operation: twice the time tbf takes to refill its bucket
    (:func:`~dpcompare.lab.netns.burst_bytes`), so that every operation starts as a training step's first
    collective does after its compute, with the burst available (0 on an unshaped link)."""
    return 0.0 if not link_bps else round(1e3 * idle_gap_s(burst_bytes(link_bps), link_bps / 8), 1)


def found_full(link_bps: int | None, gap_ms: float) -> int:
    """The bytes of the link's burst each timed operation found in its bucket after ``gap_ms`` idle (what
    ``predict`` takes the bench's times to include: :class:`dpcompare.prediction.network.Bucket`)."""
    return 0 if not link_bps else min(burst_bytes(link_bps), int(gap_ms / 1e3 * link_bps / 8))


def measure(lab: Lab, sizes: Sequence[int], backends: Sequence[str] = BACKENDS,
            collectives: Sequence[str] = COLLECTIVES, warmup: int = 1, iters: int = 5,
            timeout: float = 600, gap_ms: float | None = None, repeats: int = 2, logs: Path | None = None,
            back_to_back: bool = True) -> dict:
    """Run the sweep across ``lab`` (one rank per host) ``repeats`` times and return the results document (see
    :func:`analyse`; every repeat's times per size together); ``gap_ms``: idle time before each timed operation
    (None: :func:`idle_gap_ms` of the lab's link); ``back_to_back``: where that gap is not 0, the sweep again
    without it (rows marked ``back_to_back``); ``logs``: the folder for each job's logs (default: the lab's own,
    which goes with the lab: give one that outlives it when the lab is a session's)."""
    gap = idle_gap_ms(lab.link_bps) if gap_ms is None else gap_ms
    collectives = [collective_name(c) for c in collectives]
    if len(lab.hosts) < 2:
        raise ConfigError(f"lab {lab.name!r} has one host; a bench needs two or more (lab up --host-count 2)")
    sweep = _Sweep(lab, sizes, _jobs(backends, collectives), warmup, iters, timeout, logs)
    raw_rows = sweep.run(gap, repeats)
    if back_to_back and gap > 0:
        raw_rows += [{**r, "back_to_back": True} for r in sweep.run(0.0, repeats)]
    return analyse(_merged(raw_rows), sweep.ranks, lab.link_bps, lab={"name": lab.name, "hosts": len(lab.hosts),
                                                                        "link": lab.link, "link_bps": lab.link_bps},
                   warmup=warmup, iters=iters, gap_ms=gap, repeats=repeats, burst_bytes=found_full(lab.link_bps, gap))


@dataclass
class _Sweep:
    """The bench's mpirun jobs across a lab, each timing every size with an idle gap before each operation."""

    lab: Lab
    sizes: Sequence[int]
    jobs: list[tuple[list[str], list[str], str, tuple]]
    warmup: int
    iters: int
    timeout: float
    logs: Path | None
    ranks: int = 0
    done: int = 0  #: jobs run so far (each job's logs go to its own folder)

    def run(self, gap: float, repeats: int) -> list[dict]:
        """Every job ``repeats`` times with ``gap`` ms idle before each timed operation: the raw rows."""
        rows: list[dict] = []
        for _ in range(repeats):
            for job in self.jobs:
                rows += self._one(*job, gap=gap)
        return rows

    def _one(self, bk: list[str], coll: list[str], label: str, mca: tuple, gap: float) -> list[dict]:
        lab, timeout, sizes, warmup, iters = self.lab, self.timeout, self.sizes, self.warmup, self.iters
        job_logs = (self.logs or lab.directory) / f"bench-{self.done}"  # the job's stdout.log, stderr.log
        self.done += 1
        raw = job_logs / "raw.json"
        raw.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "dpcompare.lab.worker", "--sizes", ",".join(map(str, sizes)),
                "--backends", ",".join(bk), "--collectives", ",".join(coll), "--mpi-label", label,
                "--warmup", str(warmup), "--iters", str(iters), "--gap-ms", str(gap), "--out", str(raw)]
        # one rank per host: the link, not shared memory, is measured
        rc, _ = lab.run(argv, job_logs, len(lab.hosts), mpi_options=mca, per_host=1, timeout=timeout)
        if rc != 0 or not raw.is_file():
            what = f"exited {rc}" if rc is not None else f"took longer than {timeout:g} s and was stopped"
            said = [x.strip() for x in log_tail(job_logs, 15).splitlines() if x.strip("-= \t")]  # not mpirun's rules
            tail = said[-1] if said else "no output"
            raise LaunchError(f"the bench job ({', '.join(bk)}) {what}: {tail} (logs in {job_logs})")
        data = json.loads(raw.read_text())
        self.ranks = data["ranks"]
        return list(data["rows"])


def _merged(raw_rows: list[dict]) -> list[dict]:
    """One row per backend, collective and size, with the times of every repeat in order."""
    out: dict[tuple, dict] = {}
    for r in raw_rows:
        key = (r["backend"], r["collective"], r["bytes"], bool(r.get("back_to_back")))
        out.setdefault(key, {**r, "times_s": []})["times_s"] += list(r["times_s"])
    return list(out.values())


def two_modes(times: Sequence[float]) -> dict | None:
    """The two speeds of a size's times, when it has two: each mode's median, the slow mode's share and every
    time's label (1: slow); None for one mode or fewer than :data:`MIN_FOR_MODES` times. Two k-means clusters of
    the log times (scipy.cluster.vq.kmeans2, seeded) count as two modes when each holds at least two times and 15 %
    of them, Ashman's D = √2·|μ₁−μ₂|/√(σ₁²+σ₂²) exceeds 2 and the slow median is 15 % or more above the fast one."""
    import numpy as np  # here, not at the top: dpcompare --help loads this module

    # lazy: scipy is slow to import; only the statistics need it
    from scipy.cluster.vq import kmeans2

    x = np.asarray(times, dtype=float)
    if len(x) < MIN_FOR_MODES or np.ptp(x) <= 0:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an empty cluster: one mode
        centroids, labels = kmeans2(np.log(x)[:, None], 2, minit="++", rng=0)
    if centroids[0, 0] > centroids[1, 0]:
        labels = 1 - labels
    fast, slow = x[labels == 0], x[labels == 1]
    if min(len(fast), len(slow)) < max(2, 0.15 * len(x)):
        return None
    spread = float(np.sqrt(fast.var(ddof=1) + slow.var(ddof=1)))
    d = float(np.sqrt(2) * (slow.mean() - fast.mean()) / spread) if spread > 0 else float("inf")
    if d <= 2 or np.median(slow) < 1.15 * np.median(fast):
        return None
    return {"fast_s": float(np.median(fast)), "slow_s": float(np.median(slow)), "slow_share": len(slow) / len(x),
            "ashman_d": round(min(d, 1e6), 2), "labels": [int(v) for v in labels]}


def analyse(raw_rows: list[dict], ranks: int, link_bps: int | None, **extra: object) -> dict:
    """Per size: time (median), algbw, busbw (bytes/s) and busbw % of the link; and the α-β fits."""
    rows = []
    for r in ({**r, "collective": collective_name(r["collective"])} for r in raw_rows):
        t = statistics.median(r["times_s"])
        algbw = r["bytes"] / t
        busbw = algbw * bus_factor(r["collective"], ranks)
        modes = two_modes(r["times_s"])
        expected = t if modes is None else (1 - modes["slow_share"]) * modes["fast_s"] + modes["slow_share"] * \
            modes["slow_s"]
        rows.append({"backend": r["backend"], "collective": r["collective"], "bytes": r["bytes"], "time_s": t,
                     "algbw_Bps": algbw, "busbw_Bps": busbw,
                     "busbw_pct_of_link": 100 * busbw * 8 / link_bps if link_bps else None,
                     "times_s": r["times_s"], "modes": modes, "expected_s": expected,
                     **({"back_to_back": True} if r.get("back_to_back") else {})})
    idle = [r for r in rows if not r.get("back_to_back")]
    return {"schema": SCHEMA, **extra, "ranks": ranks, "rows": rows, "fits": fits(idle, ranks, link_bps)}


def fits(rows: list[dict], ranks: int, link_bps: int | None) -> list[dict]:
    """α-β per backend and collective: α from a line through the smallest third of sizes, β from the largest
    third (:func:`dpcompare.trace.fit_line`, the one α-β fit: one stray iteration does not tilt them)."""
    from scipy.stats import pearsonr  # here, not at the top: dpcompare --help loads this module

    out = []
    for key in sorted({(r["backend"], r["collective"]) for r in rows}):
        pts = sorted((r["bytes"], r["time_s"]) for r in rows if (r["backend"], r["collective"]) == key)
        if len(pts) < 2:
            continue
        k = max(2, len(pts) // 3)
        small, large = pts[:k], pts[-k:]
        alpha, _ = fit_line([b for b, _ in small], [t for _, t in small])
        _, beta = fit_line([b for b, _ in large], [t for _, t in large])
        r2 = float(pearsonr([b for b, _ in large], [t for _, t in large]).statistic ** 2) if len(large) > 2 else 1.0
        busbw = bus_factor(key[1], ranks) / beta if beta > 0 else None
        out.append({"backend": key[0], "collective": key[1], "alpha_s": max(0.0, alpha),
                    "beta_s_per_byte": beta, "algbw_Bps": 1 / beta if beta > 0 else None, "busbw_Bps": busbw,
                    "busbw_pct_of_link": 100 * busbw * 8 / link_bps if (busbw and link_bps) else None,
                    "r2_large": r2, "small_bytes": [b for b, _ in small],
                    "large_bytes": [b for b, _ in large]})
    return out


def write(doc: dict, out: Path) -> None:
    try:
        atomic_write_text(out, json.dumps(doc, indent=1) + "\n")
    except OSError as e:
        raise ConfigError(f"cannot write {out}: {e.strerror}") from None


def tables(doc: dict) -> list[object]:
    """rich tables: one per collective, a row per size, time / busbw / % of link per backend; then the fits."""
    from rich.table import Table  # here, not at the top: dpcompare --help loads this module

    out: list[object] = []
    link = doc.get("lab", {}).get("link_bps")
    for coll in COLLECTIVES:
        rows = [r for r in doc["rows"] if collective_name(r["collective"]) == coll and not r.get("back_to_back")]
        if not rows:
            continue
        backends = [b for b in BACKENDS if any(r["backend"] == b for r in rows)]
        t = Table(title=f"{coll}, {doc['ranks']} ranks, link {format_rate_bits(link)} (busbw = algbw × "
                        f"{bus_factor(coll, doc['ranks']):.2g})")
        t.add_column("bytes", justify="right")
        for b in backends:
            t.add_column(f"{b} ms", justify="right")
            t.add_column(f"{b} busbw Gbit/s", justify="right")
            if link:
                t.add_column(f"{b} % link", justify="right")
        by = {(r["backend"], r["bytes"]): r for r in rows}
        for size in sorted({r["bytes"] for r in rows}):
            cells = [f"{size:,}"]
            for b in backends:
                r = by.get((b, size))
                cells += ["–", "–"] + (["–"] if link else []) if r is None else \
                    [f"{r['time_s'] * 1e3:.3f}", f"{r['busbw_Bps'] * 8 / 1e9:.3f}"] + \
                    ([f"{r['busbw_pct_of_link']:.0f}"] if link else [])
            t.add_row(*cells)
        out.append(t)
    out += back_to_back_lines(doc) + mode_lines(doc)
    f = Table(title="α-β fit: time ≈ α + bytes × β (α from small messages, β from large)")
    for c in ("backend", "collective", "α µs", "busbw Gbit/s", "% link", "r² (large)"):
        f.add_column(c, justify="right" if c not in ("backend", "collective") else "left")
    for x in doc["fits"]:
        f.add_row(x["backend"], x["collective"], f"{x['alpha_s'] * 1e6:.0f}",
                  f"{x['busbw_Bps'] * 8 / 1e9:.3f}" if x["busbw_Bps"] else "–",
                  f"{x['busbw_pct_of_link']:.0f}" if x["busbw_pct_of_link"] else "–", f"{x['r2_large']:.3f}")
    out.append(f)
    return out


def back_to_back_lines(doc: dict) -> list[str]:
    """Per backend and collective timed back to back: its time at each size over the time after the idle gap."""
    idle = {(r["backend"], r["collective"], r["bytes"]): r for r in doc["rows"] if not r.get("back_to_back")}
    ratios: dict[tuple[str, str], list[str]] = {}
    for r in doc["rows"]:
        after = idle.get((r["backend"], r["collective"], r["bytes"])) if r.get("back_to_back") else None
        if after:
            ratios.setdefault((r["backend"], r["collective"]), []).append(
                f"{_size(r['bytes'])} {r['expected_s'] / after['expected_s']:.2f}×")
    return [f"back to back (no idle gap): {b} {c} took {', '.join(v)} the time after the {doc.get('gap_ms', 0):g} ms "
            "gap (predict prices a collective that follows another from these)" for (b, c), v in ratios.items()]


def _size(nbytes: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= div and nbytes % div == 0:
            return f"{nbytes // div} {unit}"
    return f"{nbytes} B"


def mode_lines(doc: dict) -> list[str]:
    """What the bench says about two speeds: each size where it saw two, and where it had too few repeats to see."""
    out, few = [], set()
    for r in doc["rows"]:
        m, n = r.get("modes"), len(r.get("times_s") or [])
        if m:
            slow = round(m["slow_share"] * n)
            when = " back to back" if r.get("back_to_back") else ""
            out.append(f"two speeds{when}: {r['backend']} {r['collective']} {r['bytes']:,} bytes: "
                       f"{m['fast_s'] * 1e3:.3g} ms ({n - slow} of {n}) and {m['slow_s'] * 1e3:.3g} ms ({slow} of "
                       f"{n}); predict uses the mixture")
        elif n < MIN_FOR_MODES:
            few.add(f"{r['backend']} {r['collective']}")
    if few:
        out.append(f"{', '.join(sorted(few))}: fewer than {MIN_FOR_MODES} times per size, too few to see two speeds "
                   "(more --repeats or --iters)")
    return out
