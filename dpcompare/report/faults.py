"""The fault as an axis (``compare --fault``): what a lost host cost each arm, and throughput over time.

Every arm ran twice per block, as it is and meeting the fault; the runs of a block are paired. Per arm: the
pause (fault → first step after the recovery), the steps redone, the world size over time, the wall time
against the twin without the fault (the fault's cost, paired over blocks) and the final metric against it
(paired over blocks, and over seeds with ``--seeds``: the accuracy verdict). Between arms, the verdict on wall
time: the paired ratio of the faulted runs' wall times (faster / slower / equal within ±--equivalence). The
figures come from the runs' records (``recovery``, ``world_sizes``, ``timeline``: written by
:mod:`dpcompare.compare.fault_runs`).
"""

from __future__ import annotations

import html
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

from dpcompare.files import ACCURACY_EQUIVALENCE, FAULT
from dpcompare.report.groups import arm_of, final_metric, metric_of, np_order, twins, valued
from dpcompare.report.html import data_uri
from dpcompare.report.intervals import (
    CONFIDENCE,
    EQUIVALENCE,
    Interval,
    decide,
    decide_difference,
    equivalence_confidence,
    mean_ci,
    paired_diff_ci,
    paired_log_ratio_ci,
)
from dpcompare.report.plots import RC, Plot, colors, save_figure


def _runs(results: dict[str, Any], arm: str, np_: int) -> dict[int, dict[str, Any]]:
    return {int(r["repeat"]): r for r in results.get("runs", []) if arm_of(r) == arm and int(r["np"]) == np_}


def _ok(r: dict[str, Any] | None) -> bool:
    return r is not None and r.get("status") == "ok"


def _ci_text(iv: Interval | None, unit: str = "s", digits: int = 1, signed: bool = False) -> str:
    if iv is None:
        return "–"
    f = f"{{:{'+' if signed else ''}.{digits}f}}"
    text = f.format(iv.mean) + (f" {unit}" if unit else "")
    return text + (f" ({f.format(iv.lo)} to {f.format(iv.hi)})" if iv.has_ci and iv.lo != iv.hi else "")


def _world_path(runs: Sequence[dict[str, Any]]) -> str:
    """``3 → 2`` (``3 → 2 → 3`` when the host came back), from the first faulted run that recorded one."""
    for r in runs:
        sizes = [int(w) for _, w in r.get("world_sizes") or []]
        if sizes:
            return " → ".join(map(str, sizes))
    return "–"


def rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (arm that met the fault, np): the figures of its fault against its twin without it."""
    cfg = results.get("config") or {}
    eq = float(cfg.get("accuracy_equivalence") or ACCURACY_EQUIVALENCE)
    points = metric_of(results.get("runs", [])).get("unit") == "%"  # a fraction: its differences in points
    out = []
    clean = twins(results, FAULT)
    for arm, fault in valued(results, FAULT).items():
        base = clean.get(arm, arm)
        for n in np_order(results):
            faulted, twin = _runs(results, arm, n), _runs(results, base, n)
            if faulted:
                out.append({**_row(arm, base, fault, n, faulted, twin, eq), "metric_in_points": points})
    return out


def _row(arm: str, base: str, fault: str, n: int, faulted: dict[int, dict[str, Any]],
         clean: dict[int, dict[str, Any]], eq: float) -> dict[str, Any]:
    oks = [r for r in faulted.values() if _ok(r) and (r.get("recovery") or {}).get("recovered")]
    pairs = [k for k in sorted(faulted) if _ok(faulted[k]) and _ok(clean.get(k))]
    cost = paired_diff_ci([clean[k]["wall_seconds"] for k in pairs], [faulted[k]["wall_seconds"] for k in pairs])
    metric = [(final_metric(clean[k]), final_metric(faulted[k])) for k in pairs]
    metric = [(a, b) for a, b in metric if a is not None and b is not None]
    diff = paired_diff_ci([a for a, _ in metric], [b for _, b in metric])
    eq_iv = paired_diff_ci([a for a, _ in metric], [b for _, b in metric], equivalence_confidence())
    redone = [int(r["recovery"]["steps_redone"]) for r in oks if r["recovery"].get("steps_redone") is not None]
    return {
        "arm": base, "faulted_arm": arm, "fault": fault, "np": n, "runs": len(faulted), "recovered": len(oks),
        "pause_s": _iv_json(mean_ci([r["recovery"]["pause_s"] for r in oks if r["recovery"].get("pause_s")])),
        "steps_redone": {"mean": statistics.fmean(redone), "min": min(redone), "max": max(redone)} if redone else None,
        "world_sizes": _world_path(list(faulted.values())),
        "wall_s": _iv_json(mean_ci([faulted[k]["wall_seconds"] for k in pairs])),
        "wall_clean_s": _iv_json(mean_ci([clean[k]["wall_seconds"] for k in pairs])),
        "wall_cost_s": _iv_json(cost), "pairs": len(pairs),
        "metric_diff": _iv_json(diff), "metric_outcome": decide_difference(diff, eq, eq_iv) if diff else "undecided",
        "ended": [f"repeat {k}: {(str(r.get('error') or '').strip().splitlines() or [''])[-1][:200]}"
                  for k, r in sorted(faulted.items()) if not _ok(r)],
        "replay": _replays(list(faulted.values())),
    }


def _replays(runs: list[dict[str, Any]]) -> str:
    """``2/2 bit for bit`` (``--replay``: the faulted runs whose final weights equal the clean replay's), or –."""
    done = [r["replay"] for r in runs if (r.get("replay") or {}).get("equal") is not None]
    if not done:
        return "–"
    same = sum(bool(d["equal"]) for d in done)
    worst = max(float(d.get("max_abs_diff") or 0.0) for d in done)
    return f"{same}/{len(done)} bit for bit" + ("" if same == len(done) else f" (largest difference {worst:.3g})")


def _iv_json(iv: Interval | None) -> dict[str, Any] | None:
    return None if iv is None else {"mean": iv.mean, "lo": iv.lo, "hi": iv.hi, "n": iv.n}


def _iv(d: dict[str, Any] | None) -> Interval | None:
    return None if d is None else Interval(d["mean"], d["lo"], d["hi"], d["n"])


def wall_verdicts(results: dict[str, Any], confidence: float = CONFIDENCE) -> list[dict[str, Any]]:
    """Every faulted arm after the first against the first: the paired ratio of their wall times with the fault
    (faster / slower / equal within ±--equivalence, or undecided), and the sentence that says it."""
    cfg = results.get("config") or {}
    eq = float(cfg.get("equivalence") or EQUIVALENCE)
    faulted, clean = list(valued(results, FAULT)), twins(results, FAULT)
    out = []
    for n in np_order(results):
        for other in faulted[1:]:
            a, b = _runs(results, faulted[0], n), _runs(results, other, n)
            reps = [k for k in sorted(a) if _ok(a[k]) and _ok(b.get(k))]
            base_w, other_w = [a[k]["wall_seconds"] for k in reps], [b[k]["wall_seconds"] for k in reps]
            # the speed ratio other ÷ baseline: log(baseline wall ÷ other wall)
            iv, _ = paired_log_ratio_ci(other_w, base_w, confidence)
            eq_iv, _ = paired_log_ratio_ci(other_w, base_w, equivalence_confidence(confidence))
            out.append(_wall_words(faulted[0], other, n, iv, eq_iv, eq, base_w, other_w, reps, clean))
    return out


def _wall_words(base: str, other: str, n: int, iv: Interval | None, eq_iv: Interval | None, eq: float,
                base_w: list[float], other_w: list[float], reps: list[int], clean: dict[str, str]) -> dict[str, Any]:
    head = f"with the fault, {clean.get(other, other)} vs {clean.get(base, base)} at np={n}"
    if iv is None:
        return {"np": n, "baseline": base, "other": other, "outcome": "undecided", "ratio": None,
                "text": f"{head}: no comparison (no block where both finished)"}
    ratio = math.exp(iv.mean)
    walls = f"wall time {statistics.fmean(other_w):.1f} s vs {statistics.fmean(base_w):.1f} s, {len(reps)} block(s)"
    if not iv.has_ci:
        outcome, words = "undecided", f"{_times(ratio)} from one block, no interval; run at least 3 repeats"
    else:
        lo, hi = math.exp(iv.lo), math.exp(iv.hi)  # type: ignore[arg-type]
        eq_ci = (math.exp(eq_iv.lo), math.exp(eq_iv.hi)) if eq_iv is not None and eq_iv.has_ci else None  # type: ignore[arg-type]
        outcome = decide(lo, hi, eq, eq_ci)
        span = f"95 % CI {lo:.2f}–{hi:.2f}×"
        words = {"faster": f"finishes {_times(ratio)} ({span})", "slower": f"finishes {_times(ratio)} ({span})",
                 "equal": f"takes as long, within ±{100 * eq:g} % ({span})"}.get(
            outcome, f"undecided: {_times(ratio)} ({span}); more repeats would decide")
    return {"np": n, "baseline": base, "other": other, "outcome": outcome, "ratio": ratio,
            "text": f"{head}: {clean.get(other, other)} {words}; {walls}"}


def _times(ratio: float) -> str:
    """A speed ratio in words: ``1.35× as fast`` / ``1.20× slower``."""
    return f"{ratio:.2f}× as fast" if ratio >= 1 else f"{1 / ratio:.2f}× slower"


def summary(results: dict[str, Any]) -> dict[str, Any] | None:
    """What results.json keeps as ``faults``: the rows and the wall-time verdicts (None without --fault)."""
    if not valued(results, FAULT):
        return None
    return {"rows": rows(results), "verdicts": wall_verdicts(results)}


def lines(results: dict[str, Any]) -> list[str]:
    """The fault's outcome in a few lines, for the terminal."""
    s = summary(results)
    if s is None:
        return []
    out = [f"Fault {s['rows'][0]['fault'] if s['rows'] else ''}: what a lost host cost"]
    for r in s["rows"]:
        out.append(f"  • {r['arm']} np={r['np']}: recovered {r['recovered']}/{r['runs']}; pause "
                   f"{_ci_text(_iv(r['pause_s']))}; steps redone {_redone(r)}; world {r['world_sizes']}; wall "
                   f"{_ci_text(_iv(r['wall_cost_s']), 's', 1, True)} over the run without it; final metric "
                   f"{_metric(r)}" + (f"; replay {r['replay']}" if r.get("replay", "–") != "–" else ""))
    out += [f"  • {v['text']}" for v in s["verdicts"]]
    return out


def _metric(r: dict[str, Any]) -> str:
    """The final metric's difference from the run without the fault, and its verdict."""
    iv = _iv(r["metric_diff"])
    if iv is None:
        return "–"
    if r.get("metric_in_points"):
        iv = Interval(100 * iv.mean, None if iv.lo is None else 100 * iv.lo, None if iv.hi is None else 100 * iv.hi,
                      iv.n)
        return f"{_ci_text(iv, 'points', 2, True)} ({r['metric_outcome']})"
    return f"{_ci_text(iv, '', 4, True)} ({r['metric_outcome']})"


def _redone(r: dict[str, Any]) -> str:
    d = r.get("steps_redone")
    if not d:
        return "–"
    return f"{d['mean']:.3g}" + (f" ({d['min']}–{d['max']})" if d["min"] != d["max"] else "")


def section(results: dict[str, Any], plot: Plot | None) -> str:
    """The report's section on the fault: the verdicts, a table per arm, the figure."""
    s = summary(results)
    if s is None:
        return ""
    e = html.escape
    head = ["arm", "np", "recovered", "pause, s", "steps redone", "world size", "wall with the fault, s",
            "cost over the run without it, s", "final metric − without it", "replay from the rollback"]
    body = "".join(
        "<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in (
            r["arm"], r["np"], f"{r['recovered']}/{r['runs']}", _ci_text(_iv(r["pause_s"]), ""), _redone(r),
            r["world_sizes"], _ci_text(_iv(r["wall_s"]), ""), _ci_text(_iv(r["wall_cost_s"]), "", 1, True),
            _metric(r), r.get("replay", "–"))) + "</tr>"
        for r in s["rows"])
    ended = "".join(f"<li>{e(r['arm'])}: {e(x)}</li>" for r in s["rows"] for x in r["ended"])
    verdicts = "".join(f"<li>{e(v['text'])}</li>" for v in s["verdicts"])
    fig = (f'<figure><img alt="{e(plot.title)}" src="{_uri(plot.path)}"><figcaption><strong>{e(plot.title)}.'
           f"</strong> {e(plot.caption)}</figcaption></figure>") if plot else ""
    fault = s["rows"][0]["fault"] if s["rows"] else ""
    return (f'<h2 id="fault">When a host dies ({e(fault)})</h2><div class="card">'
            + (f"<ul>{verdicts}</ul>" if verdicts else "")
            + '<div class="scroll"><table class="fits"><thead><tr>' + "".join(f"<th>{e(h)}</th>" for h in head)
            + f"</tr></thead><tbody>{body}</tbody></table></div>"
            + (f"<p>Runs the fault ended:</p><ul>{ended}</ul>" if ended else "")
            + '<p class="muted" style="font-size:13px">Pause: from the fault to the first step completed after the '
              "job recovered (torchrun: every process restarted from the newest checkpoint; Horovod Elastic: the "
              "survivors rolled back to their last commit). Steps redone: the steps completed before the recovery "
              "that it rolled back. Cost and final metric: paired with the same block's run without the fault "
              "(mean, 95 % interval over blocks). Replay (--replay): a clean run from the checkpoint the elastic "
              "run rolled back to, at the world size it carried on with; its final weights against the elastic "
              "run's, tensor by tensor.</p>" + fig + "</div>")


def _uri(path: Path) -> str:
    return data_uri(path)


def plot(results: dict[str, Any], path: Path) -> Plot | None:
    """Throughput over time of each arm's first faulted run (its twin without the fault behind it), the fault
    and the pause marked, the world size on the right."""
    clean = twins(results, FAULT)
    runs = [(a, _first(results, a), _first(results, clean.get(a, a))) for a in valued(results, FAULT)]
    runs = [(a, f, c) for a, f, c in runs if f is not None and f.get("timeline")]
    if not runs:
        return None
    col = colors([clean.get(a, a) for a, _, _ in runs])
    with matplotlib.rc_context(RC):
        # lazy: matplotlib is slow to import; only plotting needs it
        from matplotlib.figure import Figure

        fig = Figure(figsize=(7.5, 2.6 * len(runs)), layout="constrained")
        axes = fig.subplots(len(runs), 1, squeeze=False)[:, 0]
        for ax, (arm, f, c) in zip(axes, runs, strict=True):
            _panel(ax, clean.get(arm, arm), f, c, col[clean.get(arm, arm)])
        axes[-1].set_xlabel("seconds since the job started")
        save_figure(fig, path)
    return Plot("fault", path, "Throughput over time, the fault marked",
                "Samples per second (steps completed per time bin) of each arm's first run with the fault (solid) and "
                "the same block's run without it (pale); the red line is the fault (the host's link down, then its "
                "processes killed), the shaded span the pause until the first step after the recovery, the grey "
                "steps (right axis) the number of processes.")


def _first(results: dict[str, Any], arm: str) -> dict[str, Any] | None:
    return next((r for r in sorted(results.get("runs", []), key=lambda r: int(r["repeat"])) if arm_of(r) == arm), None)


def _rates(timeline: Sequence[Sequence[float]], width: float) -> tuple[list[float], list[float]]:
    """(bin starts, samples/s): the samples whose steps completed in each ``width``-second bin, from the first
    logged step to the last (a pause shows as bins with none)."""
    # lazy: numpy loads only where it is used (the command line stays light)
    import numpy as np

    t = np.asarray([p[0] for p in timeline], dtype=float)
    cum = np.asarray([p[3] for p in timeline], dtype=float)
    if t.size < 2:
        return [], []
    edges = np.arange(t[0], t[-1] + width, width)
    at = cum[np.maximum(np.searchsorted(t, edges, side="right") - 1, 0)]  # samples done by each edge
    return edges[:-1].tolist(), (np.diff(at) / width).tolist()


def _width(*timelines: Sequence[Sequence[float]] | None) -> float:
    """A bin width that shows the shape: a hundredth of the longest run's training span, at least 0.2 s."""
    spans = [tl[-1][0] - tl[0][0] for tl in timelines if tl]
    return max(max(spans, default=0.0) / 100.0, 0.2)


def _panel(ax: Any, arm: str, faulted: dict[str, Any], clean: dict[str, Any] | None, color: str) -> None:
    width = _width(faulted["timeline"], (clean or {}).get("timeline"))
    if clean and clean.get("timeline"):
        ts, rs = _rates(clean["timeline"], width)
        ax.step(ts, rs, where="post", color=color, alpha=0.3, lw=1.2, label="without the fault")
    ts, rs = _rates(faulted["timeline"], width)
    ax.step(ts, rs, where="post", color=color, lw=1.6, label="with the fault")
    fault, rec = faulted.get("fault") or {}, faulted.get("recovery") or {}
    if fault.get("t_fault_s") is not None:
        t = fault["t_fault_s"]
        ax.axvline(t, color="#c0404a", ls="--", lw=1.2, label=f"host {fault.get('host')} dies")
        if rec.get("pause_s"):
            ax.axvspan(t, t + rec["pause_s"], color="#c0404a", alpha=0.08, lw=0)
    if fault.get("t_back_s") is not None:
        ax.axvline(fault["t_back_s"], color="#3a9a5b", ls=":", lw=1.2, label="host back")
    ax.set_ylabel("samples/s")
    ax.set_ylim(bottom=0)
    ax.set_title(arm)
    sizes = faulted.get("world_sizes") or []
    if sizes:
        right = ax.twinx()
        end = faulted["timeline"][-1][0] if faulted.get("timeline") else sizes[-1][0]
        right.step([t for t, _ in sizes] + [end], [w for _, w in sizes] + [sizes[-1][1]], where="post",
                   color="#888888", lw=1.0)
        right.set_ylim(0, max(w for _, w in sizes) + 1)
        right.set_ylabel("processes", color="#888888")
        right.grid(False)
    ax.legend(loc="lower left", fontsize=8)
