"""The α-β (Hockney) network model: what a collective of N bytes costs among n ranks on a link.

Ring all-reduce 2(n−1)α + 2(n−1)/n · N/B; ring all-gather and reduce-scatter (n−1)α + (n−1)/n · N/B (N the
bytes of the whole gathered or reduced tensor); broadcast ⌈log2 n⌉α + N/B (a pipelined tree: bandwidth-bound
for large messages). The reduction's own arithmetic is not priced. With G ranks per host (``--ranks-per-host``)
the collectives are hierarchical: inside each host on the intra-host link, across hosts on the host's one
inter-host link, which its G ranks share (so the cross-host part moves the full N bytes per host):
all-reduce = reduce-scatter(G, intra) + all-reduce(H, inter) + all-gather(G, intra), and the others the sum
of their cross-host and in-host parts. A calibration (``lab bench`` JSON) replaces α and B per backend and
collective: a measured fraction of the link it was measured on, applied to the link asked for.

A shaped link's **burst** (tbf's token bucket, the lab's links): a host's link lets ``burst`` bytes through at once
after an idle moment and refills at the link's rate. `lab bench` idles before each operation, so its times are
those of a full bucket; an operation that starts before the bucket refilled (Horovod's fused all-reduces one after
another, DDP's next bucket) waits for the tokens it lacks (:class:`Bucket`).

`lab bench` also times each size **back to back** (no idle moment between operations): in the lab, Open MPI's
all-reduce between two hosts runs slower then (1 MiB at 1.04-1.25× its bytes' time against 0.80-0.82× after the
idle gap, at 200 Mbit/s to 1 Gbit/s; at three and four hosts alike either way), beyond what the bucket explains.
An operation that starts sooner than the bench's idle gap after the previous one ended is priced from those times
where the file has them (:data:`BACK_TO_BACK`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpcompare.errors import ConfigError
from dpcompare.trace import (
    ALL_GATHER,
    ALL_REDUCE,
    BROADCAST,
    REDUCE_SCATTER,
    burst_of_gap,
    bus_factor,
    collective_name,
    fit_line,
    idle_gap_s,
    latency_steps,
)

#: the collectives a network prices (trace's spelling: the bench's rows and the schedules use the same names)
COLLECTIVES = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST)
#: appended to a backend's name in a profile's key for the sizes `lab bench` timed back to back
BACK_TO_BACK = "/back-to-back"
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|ms|us|ns)$")


def parse_duration(text: str) -> float:
    """``5us`` → 5e-6 s (units s, ms, us, ns)."""
    m = _DURATION.match(text.strip().lower())
    if not m:
        raise ConfigError(f"latency {text!r}: write a number and a unit, e.g. 5us, 1.5us or 0.2ms")
    return float(m.group(1)) * _TIME[m.group(2)]


@dataclass(frozen=True)
class Link:
    """α (seconds per message step) and B (bytes per second) of one link."""

    alpha: float
    bandwidth: float

    @classmethod
    def of(cls, alpha: float, bits_per_s: float) -> Link:
        """The link of latency ``alpha`` and a rate in bits per second (as :func:`dpcompare.argtypes.parse_rate_bits`
        reads ``--link``)."""
        return cls(alpha, bits_per_s / 8)

    def time(self, collective: str, nbytes: float, n: int) -> float:
        """Seconds of ``collective`` of ``nbytes`` among ``n`` ranks on this link: α per message step
        (:func:`~dpcompare.trace.latency_steps`) plus the bytes each link carries (the bus factor's share) at B."""
        if n <= 1:
            return 0.0
        return latency_steps(collective, n) * self.alpha + bus_factor(collective, n) * nbytes / self.bandwidth


@dataclass(frozen=True)
class Network:
    """``hosts`` hosts of ``per_host`` ranks; ``inter`` between hosts, ``intra`` inside one.

    ``calibrated`` maps (backend, collective) to a measured (α, fraction of the link's B) that replaces the
    plain link for that backend and collective across hosts. ``floors`` maps a backend to the time its
    all-reduce took on the traced run's own, unlimited link (:func:`floor_from`): an all-reduce then costs at
    least that, rescaled to these ranks (see :meth:`floor`). ``waits`` maps a backend to the part of that floor a
    rank spent waiting for the last rank to arrive (:meth:`wait`), for a schedule that places the wait itself.
    """

    hosts: int
    inter: Link
    per_host: int = 1
    intra: Link | None = None
    calibrated: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    floors: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    #: (backend, collective) → the measured share of the link per message size (:func:`load_profiles`)
    profiles: dict[tuple[str, str], tuple[tuple[float, ...], tuple[float, ...]]] = field(default_factory=dict)
    #: bytes the inter-host link passes at once after an idle moment, found full before every operation the
    #: calibration timed (a tbf burst: :func:`load_bucket`); 0: no bucket to track
    burst: float = 0.0
    #: backend → seconds a traced all-reduce waited for its last rank (``--straggler-from-trace``); empty: none
    waits: dict[str, float] = field(default_factory=dict)
    #: seconds the calibration idled before each operation it timed (the bench's ``gap_ms``): what counts as
    #: back to back, on whatever link is predicted (:func:`load_bucket`); None: from the burst (:attr:`gap`)
    gap_s: float | None = None

    @property
    def ranks(self) -> int:
        return self.hosts * self.per_host

    def with_hosts(self, hosts: int) -> Network:
        return dataclasses.replace(self, hosts=hosts)

    def bucket(self) -> Bucket:
        """The link's token bucket through one step, full at its start."""
        return Bucket(self, self.burst)

    def floor(self, collective: str, nbytes: float, backend: str) -> float:
        """The library's own time for an all-reduce of ``nbytes`` when the link is not the limit: the traced
        run's ``a + b·bytes`` at its n₀ ranks, its fixed part scaled by (n−1)/(n₀−1) and its per-byte part by
        the ring's bus factor 2(n−1)/n over 2(n₀−1)/n₀; 0 for other collectives or without a floor."""
        f, n = self.floors.get(backend), self.ranks
        if collective != ALL_REDUCE or f is None or n < 2 or f[2] < 2:
            return 0.0
        a, b, n0 = f
        return a * (n - 1) / (n0 - 1) + b * nbytes * bus_factor(ALL_REDUCE, n) / bus_factor(ALL_REDUCE, n0)

    def wait(self, backend: str) -> float:
        """Seconds an all-reduce's ranks wait for the last one to arrive (the traced median; 0 without ``waits``):
        a schedule that delays its all-reduces by this prices them with ``own=True`` (:meth:`cost`)."""
        return self.waits.get(backend, 0.0)

    @property
    def gap(self) -> float:
        """Seconds the calibration idled before each operation it timed after the idle gap: the bench's own
        (:attr:`gap_s`, whatever link is predicted), else twice the time the burst takes to refill at this link's
        rate (:func:`~dpcompare.trace.idle_gap_s`: a bucket given without a bench file); 0 without a burst."""
        if self.burst <= 0:
            return 0.0
        return self.gap_s if self.gap_s is not None else idle_gap_s(self.burst, self.inter.bandwidth)

    def link(self, backend: str, collective: str, nbytes: float | None = None, back_to_back: bool = False) -> Link:
        """The inter-host link as ``backend``'s ``collective`` sees it: calibrated α and share of the link,
        the share read off the measured profile at ``nbytes`` when there is one (a library whose speed per
        byte changes with the size, e.g. Open MPI switching algorithms); ``back_to_back``: the profile the bench
        timed without an idle gap, where it has one."""
        alpha, share = self.calibrated.get((backend, collective), (self.inter.alpha, 1.0))
        profile = self.profiles.get((backend + BACK_TO_BACK if back_to_back else backend, collective)) or \
            self.profiles.get((backend, collective))
        if profile and nbytes:  # the measured times hold the fixed cost at the bench's size: only the link's α
            alpha, share = self.inter.alpha, share_at(profile, nbytes)
        return Link(alpha, self.inter.bandwidth * share)

    def cost(self, collective: str, nbytes: float, backend: str = "", tokens: float | None = None,
             own: bool = False, back_to_back: bool = False) -> float:
        """Seconds for one ``collective`` of ``nbytes`` among all ranks (never less than its :meth:`floor`, or with
        ``own`` the floor less the :meth:`wait` for the last rank, which the caller placed before it);
        ``tokens``: the bytes left in the link's bucket when it starts (None: full, as the calibration timed it);
        ``back_to_back``: it starts sooner than the calibration's :attr:`gap` after the previous one ended: the
        times the bench took back to back where it has them (the bucket's state as it was then included)."""
        back_to_back = back_to_back and (backend + BACK_TO_BACK, collective) in self.profiles
        wire = self._wire(collective, nbytes, backend, back_to_back)
        if tokens is not None and self.burst > 0 and self.hosts > 1 and not back_to_back:
            sent = self.sent(collective, nbytes)
            wire += (min(sent, self.burst) - min(sent, tokens)) / self.inter.bandwidth
        floor = self.floor(collective, nbytes, backend)
        return max(wire, max(floor - self.wait(backend), 0.0) if own else floor)

    def fixed(self, backend: str, collective: str) -> float | None:
        """What a message of a few bytes pays in ``backend``'s ``collective`` on this link: the bench's smallest
        size's time less its bytes' time on the wire at the link's rate (the fixed part the α-β fit left out; on
        the lab's shaped links Open MPI's 64 KiB all-reduce took 12 ms at every rate); None without a profile."""
        profile = self.profiles.get((backend, collective))
        if not profile or self.hosts < 2:
            return None
        smallest = profile[0][0]
        wire = self.inter.time(collective, smallest, self.hosts)
        return max(self.cost(collective, smallest, backend) - wire, 0.0)

    def sent(self, collective: str, nbytes: float) -> float:
        """Bytes one host puts on its inter-host link in ``collective`` of ``nbytes`` (the bus factor's share)."""
        return bus_factor(collective, self.hosts) * nbytes if self.hosts > 1 else 0.0

    def bytes_time(self, collective: str, nbytes: float) -> float:
        """The time ``collective`` of ``nbytes`` needs on the link at its rate alone (no latency, no library's own
        cost): :meth:`sent` over the inter-host link; at one host, the bus factor among its ranks over the link
        inside it (0 without one)."""
        if self.hosts > 1:
            return self.sent(collective, nbytes) / self.inter.bandwidth if self.inter.bandwidth > 0 else 0.0
        if self.intra is None or self.per_host < 2 or self.intra.bandwidth <= 0:
            return 0.0
        return bus_factor(collective, self.per_host) * nbytes / self.intra.bandwidth

    def _wire(self, collective: str, nbytes: float, backend: str, back_to_back: bool = False) -> float:
        inter, g = self.link(backend, collective, nbytes, back_to_back), self.per_host
        if g == 1 or self.intra is None:
            return inter.time(collective, nbytes, self.hosts)
        intra = self.intra
        if collective == ALL_REDUCE:
            return (intra.time(REDUCE_SCATTER, nbytes, g) + inter.time(ALL_REDUCE, nbytes, self.hosts)
                    + intra.time(ALL_GATHER, nbytes, g))
        return inter.time(collective, nbytes, self.hosts) + intra.time(collective, nbytes, g)


@dataclass
class Bucket:
    """A shaped link's token bucket through a step: the bytes in it at ``t``; it refills at the link's rate up to
    the network's ``burst`` while the link is idle. ``last``: when the previous operation ended (None: none yet)."""

    net: Network
    level: float
    t: float = 0.0
    last: float | None = None

    def cost(self, collective: str, nbytes: float, backend: str, start: float, own: bool = False) -> float:
        """Seconds of an operation that starts at ``start`` with what the bucket holds then; spends its bytes
        (``own``: as :meth:`Network.cost`); priced as timed back to back when it starts sooner than the
        calibration's idle gap after the previous one."""
        net = self.net
        if net.burst <= 0 or net.hosts < 2:
            return net.cost(collective, nbytes, backend, own=own)
        rate = net.inter.bandwidth
        level = min(net.burst, self.level + max(0.0, start - self.t) * rate)
        back_to_back = self.last is not None and start - self.last < net.gap
        seconds = net.cost(collective, nbytes, backend, tokens=level, own=own, back_to_back=back_to_back)
        self.level = min(net.burst, max(0.0, level - net.sent(collective, nbytes) + rate * seconds))
        self.t = max(self.t, start + seconds)
        self.last = start + seconds
        return seconds


def load_bucket(path: str | Path) -> tuple[float, float | None]:
    """(burst bytes, idle gap seconds) of a `lab bench` file: the burst its operations found full
    (``burst_bytes``, or for files written before it was recorded, what its idle gap refilled at the lab's rate:
    :func:`~dpcompare.trace.burst_of_gap`) and the gap it idled before each (``gap_ms``); (0, None) without them (an
    unshaped link, another tool's file). The gap is the bench's whatever link a prediction asks for: it is what
    told the bench's back-to-back times from its idle ones."""
    try:
        top = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return 0.0, None
    if not isinstance(top, dict):
        return 0.0, None
    link_bps, gap_ms = (top.get("lab") or {}).get("link_bps"), top.get("gap_ms")
    gap = float(gap_ms) / 1e3 if gap_ms else None
    if top.get("burst_bytes") is not None:
        return float(top["burst_bytes"]), gap
    return (burst_of_gap(gap, float(link_bps) / 8), gap) if link_bps and gap else (0.0, None)


#: the most traced all-reduces one floor line is fitted through (Theil-Sen took 0.07 s at 1,000 on a 2-core AMD
#: EPYC, 2.5 s at 6,000)
FLOOR_POINTS = 1000


def floor_from(ops: list[tuple[float, float]], ranks: int) -> tuple[float, float, int] | None:
    """(a seconds, b seconds per byte, ranks) of a traced run's all-reduces given as (bytes, seconds): the
    α-β fit's line (:func:`~dpcompare.trace.fit_line`), or the median time when they all had one size; None without any
    or at one rank. On an unlimited link (a lab host's unshaped veth, shared memory) this is what the library itself
    costs on those CPUs: copies, the reduction, progress threads. A
    median line, not least squares: a traced operation that waited for a late peer or for a core that backward
    held is slower by that wait only, never faster, and the operation a step waits for at its end runs with
    backward's compute done. At most :data:`FLOOR_POINTS` operations, evenly spread (the fit's cost grows with
    their square, and a bootstrap fits it once per replicate)."""
    if ranks < 2 or not ops:
        return None
    xs, ys = zip(*ops[::math.ceil(len(ops) / FLOOR_POINTS)], strict=True)
    if len(set(xs)) < 2:
        return statistics.median(ys), 0.0, ranks
    intercept, slope = fit_line(xs, ys)
    if slope <= 0:
        return statistics.median(ys), 0.0, ranks
    return float(max(intercept, 0.0)), float(slope), ranks


def trace_link(ops: list[tuple[float, float]], ranks: int) -> Link | None:
    """The link a traced run's all-reduces (bytes, seconds) ran on: α and B read off their :func:`floor_from`
    line (a small operation pays its fixed cost, not a bandwidth it never reached), or their median bus
    bandwidth with no latency when the line has no slope (one size); None without any or at one rank."""
    line = floor_from(ops, ranks)
    if line is None:
        return None
    a, b, n = line
    if b > 0:
        return Link(a / latency_steps(ALL_REDUCE, n), bus_factor(ALL_REDUCE, n) / b)
    return Link(0.0, statistics.median(bus_factor(ALL_REDUCE, n) * nb / t for nb, t in ops))


# -- calibration ------------------------------------------------------------------------------------------
def _fit(points: list[tuple[float, float]], collective: str, n: int) -> tuple[float, float]:
    """(α, B) from (bytes, seconds) points of one collective at n ranks: the α-β fit's line through
    time = a + b·bytes (:func:`~dpcompare.trace.fit_line`) read as the formula's fixed and per-byte terms."""
    xs, ys = zip(*points, strict=True)
    intercept, slope = fit_line(xs, ys)
    if slope <= 0:
        raise ConfigError(f"calibration: {collective} times do not grow with the message size; rerun `lab bench`")
    return max(intercept, 0.0) / latency_steps(collective, n), bus_factor(collective, n) / slope


def _entries(data: Any) -> list[dict[str, Any]]:
    """The calibration file's per backend+collective records, whether listed or nested backend → collective."""
    fits = data.get("fits", data.get("results", data)) if isinstance(data, dict) else data
    if isinstance(fits, list):
        return [e for e in fits if isinstance(e, dict)]
    out = []
    for backend, per in (fits or {}).items():
        for coll, rec in (per.items() if isinstance(per, dict) else []):
            if isinstance(rec, dict):
                out.append({"backend": backend, "collective": coll, **rec})
    return out


def _alpha_bandwidth(e: dict[str, Any], coll: str, n: int) -> tuple[float, float] | None:
    """(α per message step, B in bytes/s comparable with the link) from one record, or None."""
    steps = latency_steps(coll, n)
    if e.get("busbw_Bps"):  # `lab bench` (schema dpcompare.lab.bench/1): alpha_s is the whole fixed cost
        return float(e.get("alpha_s", 0.0)) / steps, float(e["busbw_Bps"])
    if e.get("bandwidth_bps"):
        return float(e.get("latency_s", 0.0)), float(e["bandwidth_bps"]) / 8
    pts = e.get("points") or list(zip(e.get("sizes", []), e.get("times_s", []), strict=False))
    return _fit([(float(b), float(t)) for b, t in pts], coll, n) if len(pts) >= 2 else None


def _rows_as_points(data: Any) -> list[dict[str, Any]]:
    """A `lab bench` file's measured rows as one record of (bytes, median seconds) points per backend and
    collective, to be fitted over the whole range of sizes."""
    rows = data.get("rows") if isinstance(data, dict) else None
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows if isinstance(rows, list) else []:
        if isinstance(r, dict) and r.get("bytes") and r.get("time_s"):
            key = (str(r.get("backend")), str(r.get("collective")))
            rec = out.setdefault(key, {"backend": key[0], "collective": key[1], "points": []})
            rec["points"].append((float(r["bytes"]), float(r["time_s"])))
    return [r for r in out.values() if len(r["points"]) >= 2]


def load_calibration(path: str | Path, fit: str = "range") -> dict[tuple[str, str], tuple[float, float]]:
    """(backend, collective) → (α seconds, measured B as a fraction of the link rate it was measured on).

    Reads the JSON ``dpcompare lab bench --out-file FILE`` writes (``rows``: the median time per size; ``fits``:
    ``backend``, ``collective``, ``alpha_s``, ``busbw_Bps``; ``ranks``; ``lab.link_bps``). With ``fit="range"``
    (the default) α and B are the α-β fit's line (:func:`~dpcompare.trace.fit_line`) through every size the bench
    measured, one effective α and B
    over the range training's buckets fall in; ``fit="ends"`` keeps the bench's own fits (α from the smallest
    sizes, B from the largest), which make the middle sizes too fast when a library's speed per byte changes
    with the size (Open MPI's all-reduce in the lab: 1 MiB at 11 % of 1 Gbit/s, 16 MiB at 37 %;
    bench/predict-validation.md).
    Also accepted, per record: a fit as ``latency_s`` (per message step) and ``bandwidth_bps`` (bits/s), or
    points (``sizes`` in bytes + ``times_s``, or ``points`` as [bytes, seconds]) fitted here; ``ranks`` and
    ``link_bps`` per record or at the top level.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--calibration {path}: cannot read it as JSON ({e})") from None
    top = data if isinstance(data, dict) else {}
    top_link = top.get("link_bps") or (top.get("lab") or {}).get("link_bps")
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for e in _entries(data) + (_rows_as_points(data) if fit == "range" else []):  # rows last: they win
        coll = collective_name(str(e.get("collective", "")))
        link_bps = e.get("link_bps") or top_link
        if coll not in COLLECTIVES or not e.get("backend") or not link_bps:
            continue
        ab = _alpha_bandwidth(e, coll, int(e.get("ranks") or top.get("ranks") or 2))
        if ab is not None:
            out[(str(e["backend"]), coll)] = (ab[0], ab[1] / (float(link_bps) / 8))
    if not out:
        raise ConfigError(f"--calibration {path}: no backend+collective fit with the link rate it was measured on; "
                          "give the JSON `dpcompare lab bench --out-file FILE` wrote (on a shaped link)")
    return out


def share_at(profile: tuple[tuple[float, ...], tuple[float, ...]], nbytes: float) -> float:
    """The measured share of the link at ``nbytes``: between two sizes measured, the one whose time lies on the
    straight line between their times (numpy.interp over bytes: the α-β law is linear in bytes, and so is a
    shaped link's burst, free up to its size and at the link's rate beyond); the nearest end's share outside
    them. Interpolating the share itself would carry a burst-sized message's speed (many times the link's) into
    the sizes past it."""
    import numpy as np  # here, not at the top: dpcompare --help loads this module

    sizes, shares = profile
    if nbytes <= sizes[0] or nbytes >= sizes[-1]:
        return shares[0] if nbytes <= sizes[0] else shares[-1]
    return nbytes / float(np.interp(nbytes, sizes, [b / s for b, s in zip(sizes, shares, strict=True)]))


#: which of a bench's speeds a profile follows: the mixture's expectation, or one of Open MPI's two modes
MODES = ("expected", "fast", "slow")
Key = tuple[str, str]
Curve = tuple[tuple[float, ...], tuple[float, ...]]


def _mode_time(times: Any, labels: Any, mode: str) -> float:
    """One size's time in ``mode`` from its repeats and their mode labels (1: the slow mode; None: one mode):
    the median, a mode's median, or the two-component mixture's expectation (each mode's median weighted by its
    share of the repeats)."""
    import numpy as np  # here, not at the top: dpcompare --help loads this module

    if labels is None or labels.min() == labels.max():
        return float(np.median(times))
    fast, slow = float(np.median(times[labels == 0])), float(np.median(times[labels == 1]))
    w = float(labels.mean())
    return {"fast": fast, "slow": slow}.get(mode, (1 - w) * fast + w * slow)


@dataclass(frozen=True)
class Bench:
    """A `lab bench` file's measured rows: (backend, collective) → per size (bytes, every repeat's seconds, each
    repeat's mode label or None). Its profiles per mode, and drawn again for a bootstrap."""

    link_bps: float
    ranks: int
    rows: dict[Key, list[tuple[float, Any, Any]]]

    @classmethod
    def load(cls, path: str | Path, back_to_back: bool = True) -> Bench | None:
        """None for a file without measured rows or its link rate (a ``fits``-only calibration); the sizes timed
        back to back under ``(backend + BACK_TO_BACK, collective)`` (left out with ``back_to_back=False``)."""
        import numpy as np  # here, not at the top: dpcompare --help loads this module

        data = json.loads(Path(path).read_text())
        top = data if isinstance(data, dict) else {}
        link_bps, n = (top.get("lab") or {}).get("link_bps") or top.get("link_bps"), int(top.get("ranks") or 2)
        rows: dict[Key, list[tuple[float, Any, Any]]] = {}
        for r in top.get("rows") or []:
            if not isinstance(r, dict) or (r.get("back_to_back") and not back_to_back):
                continue
            key = (str(r.get("backend")) + (BACK_TO_BACK if r.get("back_to_back") else ""),
                   collective_name(str(r.get("collective"))))
            if not (r.get("bytes") and r.get("time_s")) or key[1] not in COLLECTIVES:
                continue
            times = np.array(r.get("times_s") or [r["time_s"]], dtype=float)
            labels = (r.get("modes") or {}).get("labels")
            rows.setdefault(key, []).append((float(r["bytes"]), times, None if labels is None or len(labels) != len(
                times) else np.array(labels, dtype=int)))
        rows = {k: sorted(v, key=lambda x: x[0]) for k, v in rows.items() if len(v) >= 2}
        return cls(float(link_bps), n, rows) if link_bps and rows else None

    @property
    def bimodal(self) -> bool:
        return any(lab is not None and lab.min() != lab.max() for v in self.rows.values() for _, _, lab in v)

    @property
    def repeats(self) -> int:
        """The fewest repeats any size had."""
        return min(len(t) for v in self.rows.values() for _, t, _ in v)

    def profiles(self, mode: str = "expected", rng: Any = None) -> dict[Key, Curve]:
        """(backend, collective) → (sizes, share of the link at each) in ``mode``; with ``rng`` each size's repeats
        drawn again with replacement (a bootstrap replicate)."""
        out = {}
        for key, sizes in self.rows.items():
            factor, shares = bus_factor(key[1], self.ranks), []
            for b, times, labels in sizes:
                if rng is not None:
                    i = rng.integers(0, len(times), len(times))
                    times, labels = times[i], None if labels is None else labels[i]
                shares.append(factor * b / (self.link_bps / 8) / _mode_time(times, labels, mode))
            out[key] = (tuple(b for b, _, _ in sizes), tuple(shares))
        return out


def load_profiles(path: str | Path, mode: str = "expected", back_to_back: bool = True) -> dict[Key, Curve]:
    """(backend, collective) → (sizes, share of the link at each) from a `lab bench` file's measured rows.

    The share at a size is the α-β formula's bandwidth term over the whole time the bench measured (its fixed
    cost folded in): :meth:`Network.cost` gives back every measured time at the bench's ranks, and between the
    sizes it follows the measured curve instead of one straight line, whose intercept (a fixed cost a few ms
    long for Open MPI in the lab) would be paid again by every one of Horovod's small fused all-reduces. The
    price: the fixed cost does not grow with the ranks beyond the bench's. A size whose repeats fell into two
    speeds (the bench's ``modes``) counts at the mixture's expectation, or at one ``mode``. Empty for files
    without rows; ``back_to_back``: with the sizes timed back to back (:data:`BACK_TO_BACK`)."""
    bench = Bench.load(path, back_to_back)
    return bench.profiles(mode) if bench else {}
