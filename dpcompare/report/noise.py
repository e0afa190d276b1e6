"""How noisy a comparison was: the per-block spread, the noise floor it implies, the blocks a target needs, and
where the variance sits (between launches, between runs of one launch, between steps of one run).

Pure functions on lists of numbers (numpy, :mod:`scipy.stats` through :func:`~dpcompare.report.intervals.t_half_width`).

**Per-block spread**: the standard deviation of the per-unit log ratio other ÷ baseline (a unit is a block, or two
neighbouring blocks with persistent workers: :func:`~dpcompare.report.groups.unit_blocks`). Log ratios near 0 read
as fractions: a spread of 0.05 is about ±5 % from one block to the next.

**Noise floor**: the half-width of the 95 % Student-t interval that spread gives over the units run, as a fraction
of the ratio (``exp(t · sd / √n) − 1``): a difference smaller than it could not be told from none by this run. It
is the interval's own width stated apart from where the interval lies, so an A/A comparison and a real one are
read alike.

**Variance components** (Kalibera & Jones, "Rigorous benchmarking in reasonable time", 2013): a nested
random-effects model ``y = μ + a_launch + b_run(launch) + e_step(run)``, estimated by the method of moments from
the nested ANOVA's mean squares, which holds for unequal group sizes (Sokal & Rohlf, *Biometry*, 4th ed., §10.3,
unequal sample sizes)::

    SS_A = Σ_i N_i (ȳ_i − ȳ)²              df_A = a − 1
    SS_B = Σ_ij n_ij (ȳ_ij − ȳ_i)²          df_B = Σ_i b_i − a
    SS_W = Σ_ijk (y_ijk − ȳ_ij)²            df_W = N − Σ_i b_i
    E[MS_W] = σ²_W
    E[MS_B] = σ²_W + c1 σ²_B                c1 = (N − Σ_i Σ_j n_ij² / N_i) / df_B
    E[MS_A] = σ²_W + c2 σ²_B + c3 σ²_A      c2 = (Σ_i Σ_j n_ij² / N_i − Σ_ij n_ij² / N) / df_A
                                            c3 = (N − Σ_i N_i² / N) / df_A

solved for σ²_W, σ²_B, σ²_A (a negative estimate, which sampling allows, is reported as 0). The bench
(``bench/noise.py``) feeds it log step times, so each component reads as a relative spread.

**Modes**: an arm whose per-run throughput falls in two clusters (Horovod's background thread placed well in one
launch and badly in the next, say) is shown as two modes with how often each occurred, so a verdict's interval is
read knowing what it averages over. Two Gaussians (scikit-learn's ``GaussianMixture``) are fitted to the log
throughputs; two modes are reported when they beat one by the Bayesian information criterion, each holds two runs
and a tenth of them or more, and they are separated (Ashman's D = √2 · |μ1 − μ2| / √(σ1² + σ2²) above 2, the
usual bound for a clean separation).

**Stalls**: a run whose throughput fell below a third of its arm's median (:data:`STALL_FRACTION`) stalled as a
whole, as when two busy-polling threads (Horovod's background threads under ``--bind none`` on 2 cores) queue for
one core: too rare for a mode, yet one such run widens a verdict's interval several times. The report counts them
per arm; the interval keeps them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpcompare.report.groups import arm_of, arm_order, run_throughput
from dpcompare.report.intervals import CONFIDENCE, t_half_width

#: the levels of :func:`variance_components`, outermost first
LEVELS = ("launches", "runs", "steps")


def block_spread(log_ratios: Sequence[float]) -> float | None:
    """The sample standard deviation of the per-unit log ratios (None with fewer than 2)."""
    d = np.asarray(log_ratios, dtype=float)
    return float(d.std(ddof=1)) if d.size >= 2 else None


def noise_floor(log_ratios: Sequence[float], confidence: float = CONFIDENCE) -> float | None:
    """The smallest relative difference the units could resolve: the t interval's half-width over them, as a
    fraction of the ratio (0.03: ±3 %); None with fewer than 2 units."""
    sd = block_spread(log_ratios)
    if sd is None:
        return None
    return math.expm1(float(t_half_width(sd, len(log_ratios), confidence)))


def units_to(target: float, sd: float, confidence: float = CONFIDENCE, limit: int = 100_000) -> int | None:
    """How many units bring the t interval's half-width within ``target`` (a fraction: 0.02 is ±2 %) at
    spread ``sd`` of the log ratio; None beyond ``limit``."""
    if sd <= 0.0:
        return 2
    goal = math.log1p(target)
    n = max(2, math.ceil((1.96 * sd / goal) ** 2))  # the normal approximation, then t's few more
    while n <= limit:
        if float(t_half_width(sd, n, confidence)) <= goal:
            return n
        n += 1
    return None


def floor_record(log_ratios: Sequence[float], unit: int = 1, confidence: float = CONFIDENCE) -> dict[str, Any]:
    """results.json's ``noise`` of one verdict: the per-unit spread, the floor, and the blocks ±2 % and ±5 % need."""
    sd = block_spread(log_ratios)
    need = {f"blocks_to_{p}pct": (None if sd is None else _times(units_to(p / 100, sd, confidence), unit))
            for p in (2, 5)}
    floor = noise_floor(log_ratios, confidence)
    return {"units": len(log_ratios), "unit_blocks": unit, "block_sd": None if sd is None else round(sd, 6),
            "floor": None if floor is None else round(floor, 6), **need}


def _times(n: int | None, unit: int) -> int | None:
    return None if n is None else n * unit


def floor_words(noise: dict[str, Any]) -> str:
    """One line for the report: the floor and the spread it comes from."""
    if noise.get("floor") is None:
        return "noise floor unknown (fewer than 2 blocks)"
    units, unit = noise["units"], noise.get("unit_blocks", 1)
    spread = (f"per-block spread {noise['block_sd']:.3f} of the log ratio over {units} blocks" if unit == 1 else
              f"spread {noise['block_sd']:.3f} of the log ratio per unit of {unit} blocks, over {units} units")
    need = noise.get("blocks_to_2pct")
    return (f"noise floor ±{100 * noise['floor']:.1f} % ({spread}); ±2 % would take about "
            f"{need if need is not None else 'too many'} blocks")


@dataclass(frozen=True)
class Components:
    """The variance of each level of a nested design (:data:`LEVELS`) with its share of the total."""

    launches: float
    runs: float
    steps: float
    counts: tuple[int, int, int]  # launches, runs, steps

    @property
    def total(self) -> float:
        return self.launches + self.runs + self.steps

    def to_json(self) -> dict[str, Any]:
        tot = self.total or 1.0
        return {level: {"variance": round(v, 10), "sd": round(math.sqrt(v), 6), "share": round(v / tot, 4)}
                for level, v in zip(LEVELS, (self.launches, self.runs, self.steps), strict=True)} | {
                   "counts": dict(zip(LEVELS, self.counts, strict=True))}


def variance_components(data: Sequence[Sequence[Sequence[float]]]) -> Components:
    """The method-of-moments variance components of ``data[launch][run][step]`` (see the module's docstring).

    ValueError unless there are 2 launches or more, a launch with 2 runs or more and a run with 2 steps or more
    (each level needs a spread to be estimated); empty runs and launches are left out."""
    groups = [[np.asarray(r, dtype=float) for r in launch if len(r)] for launch in data]
    groups = [g for g in groups if g]
    a, b = len(groups), sum(len(g) for g in groups)
    n_ij = [np.array([r.size for r in g], dtype=float) for g in groups]
    big_n_i = np.array([x.sum() for x in n_ij])
    big_n = float(big_n_i.sum())
    if a < 2 or b <= a or big_n <= b:
        raise ValueError("variance components need 2 launches or more, more runs than launches and more steps "
                         "than runs")
    grand = float(np.concatenate([np.concatenate(g) for g in groups]).mean())
    mean_i = [float(np.concatenate(g).mean()) for g in groups]
    ss_a = float(sum(n * (m - grand) ** 2 for n, m in zip(big_n_i, mean_i, strict=True)))
    ss_b = float(sum(r.size * (r.mean() - m) ** 2 for g, m in zip(groups, mean_i, strict=True) for r in g))
    ss_w = float(sum(((r - r.mean()) ** 2).sum() for g in groups for r in g))
    df_a, df_b, df_w = a - 1, b - a, big_n - b
    ms_a, ms_b, ms_w = ss_a / df_a, ss_b / df_b, ss_w / df_w
    sq_over_ni = float(sum((x ** 2).sum() / x.sum() for x in n_ij))
    c1 = (big_n - sq_over_ni) / df_b
    c2 = (sq_over_ni - float(sum((x ** 2).sum() for x in n_ij)) / big_n) / df_a
    c3 = (big_n - float((big_n_i ** 2).sum()) / big_n) / df_a
    s_w = ms_w
    s_b = max((ms_b - ms_w) / c1, 0.0)
    s_a = max((ms_a - ms_w - c2 * s_b) / c3, 0.0)
    return Components(s_a, s_b, s_w, (a, b, int(big_n)))


def verdict_floor(v: Any) -> dict[str, Any]:
    """:func:`floor_record` of a throughput verdict (:class:`~dpcompare.report.verdicts.Verdict`): its units' log
    ratios, so a stored verdict gives the same floor as a fresh one."""
    return floor_record(v.unit_log_ratios, v.unit_blocks)


def floors(verdicts: Sequence[Any]) -> list[dict[str, Any]]:
    """results.json's ``noise``: per throughput verdict (np, baseline, other) its :func:`floor_record`."""
    return [{"np": v.np, "baseline": v.baseline, "other": v.other, **verdict_floor(v)}
            for v in verdicts if v.metric == "throughput"]


def binding_words(binding: dict[str, Any] | None, used: Sequence[int] = ()) -> str | None:
    """results.json's ``config.binding`` in one line (None: a comparison from before it was recorded); ``used``:
    the intra-op thread counts the runs recorded (what ``--threads 0`` came to)."""
    if not binding:
        return None
    # what the ranks got: "1", "0" (the user's), or absent (recorded since 2026-12-03: before, comm did not yield)
    yielding = " and MPI's waits yielding the core" if str(binding.get("mpi_yield_when_idle"))[:1] == "1" else ""
    where = {"none": "ranks not bound (mpirun --bind-to none: the scheduler places them and their threads)",
             "comm": "ranks not bound (mpirun --bind-to none), each rank's communication thread on a core of its "
                     f"own{yielding} (--bind comm; gloo's threads, under DDP and the others, left to the scheduler)",
             "core": "each rank bound to its own core(s) (--bind core)",
             "by arm": "binding per arm (--sweep bind=...: each arm's label says it)"}.get(str(binding.get("bind")),
                                                                          f"binding {binding.get('bind')}")
    threads = binding.get("threads")
    affinity = binding.get("horovod_thread_affinity")
    waits = ("" if "mpi_yield_when_idle" not in binding  # recorded since --bind comm sets it
             else f"; Open MPI's mpi_yield_when_idle: {binding['mpi_yield_when_idle'] or 'unset'}")
    auto = "the cores a rank may use ÷ the ranks sharing them (--threads 0)"
    if not threads and used:
        low, high = min(used), max(used)
        auto = f"{low if low == high else f'{low}–{high}'}, {auto}"
    return (f"{where}; intra-op threads per rank: {threads if threads else auto}; "
            f"HOROVOD_THREAD_AFFINITY: {affinity if affinity else 'unset'}{waits}")


def disturbed_words(results: dict[str, Any]) -> str | None:
    """How many blocks were run again because others' CPU or steal time disturbed them, and why (None: none).

    results.json's ``disturbed``: one entry per disturbed try of a block; ``counted`` true on a block's last try,
    still disturbed but counted (it had used up its tries)."""
    entries = results.get("disturbed") or []
    if not entries:
        return None
    again = [d for d in entries if not d.get("counted")]
    kept = [d for d in entries if d.get("counted")]
    why = "; ".join(f"block {d['block']}, try {d['try']}: {d['why']}" for d in entries[:3]) + (
        "; …" if len(entries) > 3 else "")
    parts = [f"{len(again)} disturbed block{'s' if len(again) != 1 else ''} run again, not counted"] if again else []
    if kept:
        parts.append(f"{len(kept)} still disturbed after its last try, counted anyway")
    return f"{', '.join(parts)} ({why})"


#: fewer runs than this in an arm: no search for modes (two clusters of 3 are noise as often as not)
MODE_MIN_RUNS = 8
#: Ashman's D above this: two modes apart enough to say so
MODE_SEPARATION = 2.0
#: a mode holds at least this share of the runs (and 2 of them): a few outlying runs are not a mode
MODE_MIN_SHARE = 0.1


@dataclass(frozen=True)
class Mode:
    """One mode of an arm's per-run throughput: its geometric-mean centre (samples/s) and how many runs fell in it."""

    centre: float
    runs: int


def modes(throughputs: Sequence[float]) -> list[Mode]:
    """The modes of per-run throughputs (see the module's docstring): one, or two, slower first; [] with fewer than
    :data:`MODE_MIN_RUNS` positive values."""
    y = np.log(np.asarray([t for t in throughputs if t and t > 0], dtype=float)).reshape(-1, 1)
    if y.shape[0] < MODE_MIN_RUNS:
        return []
    one = [Mode(float(np.exp(y.mean())), int(y.shape[0]))]
    if float(y.std()) == 0.0:
        return one
    from sklearn.mixture import GaussianMixture  # a second's import, only where there is something to fit

    fits = [GaussianMixture(k, n_init=3, random_state=0, reg_covar=1e-8).fit(y) for k in (1, 2)]
    two = fits[1]
    if two.bic(y) >= fits[0].bic(y):
        return one
    labels = two.predict(y)
    mu, var = two.means_.ravel(), two.covariances_.ravel()
    ashman = math.sqrt(2.0) * abs(float(mu[0] - mu[1])) / math.sqrt(float(var[0] + var[1]))
    counts = [int((labels == k).sum()) for k in (0, 1)]
    if ashman <= MODE_SEPARATION or min(counts) < max(2, MODE_MIN_SHARE * y.shape[0]):
        return one
    found = [Mode(float(np.exp(y[labels == k].mean())), counts[k]) for k in (0, 1)]
    return sorted(found, key=lambda m: m.centre)


def arm_throughputs(results: dict[str, Any]) -> Iterator[tuple[str, int, list[float]]]:
    """Per arm (in the report's order) and process count, the per-run statistic of its ok runs
    (:func:`~dpcompare.report.groups.run_throughput`)."""
    for arm in arm_order(results):
        runs = [r for r in results.get("runs", []) if arm_of(r) == arm and r.get("status") == "ok"]
        for np_ in sorted({int(r["np"]) for r in runs}):
            yield arm, np_, [t for r in runs if r["np"] == np_ and (t := run_throughput(r))]


def mode_lines(results: dict[str, Any]) -> list[str]:
    """One line per arm and process count whose per-run throughput has two modes, with how often each occurred."""
    lines = []
    for arm, np_, throughputs in arm_throughputs(results):
        found = modes(throughputs)
        if len(found) < 2:
            continue
        total = sum(m.runs for m in found)
        each = " and ".join(f"{m.centre:,.0f} samples/s ({m.runs} of {total} runs)" for m in found)
        lines.append(f"{arm} at np={np_} ran in two modes: {each}; the verdict's interval is over blocks that "
                     "drew either, as often as they occurred here")
    return lines


#: a run below this fraction of its arm's median throughput stalled (see the module's docstring)
STALL_FRACTION = 1 / 3


def stalls(throughputs: Sequence[float]) -> list[float]:
    """The stalled runs' throughputs as fractions of the median of ``throughputs`` (slowest first)."""
    t = [x for x in throughputs if x and x > 0]
    if not t:
        return []
    mid = float(np.median(t))
    return sorted(x / mid for x in t if x < STALL_FRACTION * mid)


def stall_lines(results: dict[str, Any]) -> list[str]:
    """One line per arm and process count with stalled runs: how many, how slow, and what the interval does."""
    lines = []
    for arm, np_, throughputs in arm_throughputs(results):
        found = stalls(throughputs)
        if found:
            at = " and ".join(f"{100 * f:.0f} %" for f in found)
            lines.append(f"{arm} at np={np_}: {len(found)} of {len(throughputs)} runs stalled (at {at} of the arm's "
                         "median of the verdict's statistic, global batch ÷ median step); the verdict's interval "
                         "keeps them and is wider for it. Two polling threads queued on one core stall a run so: "
                         "--bind comm gives each rank's communication thread a core of its own")
    return lines


def setting_lines(results: dict[str, Any]) -> list[str]:
    """The report's lines on how the runs were placed, which blocks were run again, and which arms ran in modes."""
    used = [int(t) for r in results.get("runs") or [] if (t := (r.get("regime") or {}).get("threads"))]
    placed = [binding_words((results.get("config") or {}).get("binding"), used), disturbed_words(results)]
    return [x for x in placed if x] + mode_lines(results) + stall_lines(results)
