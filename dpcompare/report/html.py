"""report.html: one self-contained file (figures as base64 data URIs, inline CSS, no external URL)."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dpcompare.files import ACCURACY_EQUIVALENCE, PHASES, atomic_write_text
from dpcompare.report import attribution, fmt, mechanisms, noise, regime
from dpcompare.report.groups import (
    MEMORY_KINDS,
    MEMORY_LABELS,
    Group,
    arm_of,
    final_metric,
    launch_note,
    measured_share,
    metric_of,
    phase_shifts,
    strategy_order,
    tta_target,
    workload_label,
)
from dpcompare.report.plots import Plot, colors
from dpcompare.report.verdicts import Verdict

CSS = """
:root { --fg:#1f2328; --muted:#626a73; --line:#e3e6ea; --bg:#f6f7f9; --ok:#1a7f37; --bad:#c0303a; --accent:#3b6fb6; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
       font: 15px/1.55 -apple-system, BlinkMacSystemFont, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1120px; margin: 0 auto; padding: 28px 24px 60px; }
h1 { font-size: 28px; margin: 0 0 4px; letter-spacing: -0.01em; }
h2 { font-size: 20px; margin: 36px 0 12px; padding-bottom: 6px; border-bottom: 1px solid var(--line); }
h3 { font-size: 16px; margin: 22px 0 6px; }
.sub { color: var(--muted); margin: 0 0 20px; }
.card { background: #fff; border: 1px solid var(--line); border-radius: 10px; padding: 18px 22px; margin: 14px 0; }
.verdict { border-left: 5px solid var(--accent); }
.verdict ul { margin: 6px 0 0; padding-left: 20px; } .verdict li { margin: 6px 0; font-size: 16.5px; }
.warn { border-left: 5px solid var(--bad); }
table { border-collapse: collapse; width: 100%; font-size: 13.5px; font-variant-numeric: tabular-nums; }
th, td { padding: 6px 9px; border-bottom: 1px solid var(--line); text-align: right; white-space: nowrap; }
th { white-space: normal; min-width: 3.5em; }
th { background: #fafbfc; font-weight: 600; color: #3a4047; vertical-align: bottom; }
td:first-child, th:first-child { text-align: left; }
td.l, th.l { text-align: left; white-space: normal; }
/* every table sits in .scroll: one wider than its card scrolls inside it (a shadow marks the hidden side) */
.scroll { overflow-x: auto; max-width: 100%; }
.scroll { background:
  linear-gradient(to right, #fff 30%, #fff0), linear-gradient(to left, #fff 30%, #fff0) 100% 0,
  radial-gradient(farthest-side at 0 50%, #0003, #0000),
  radial-gradient(farthest-side at 100% 50%, #0003, #0000) 100% 0;
  background-repeat: no-repeat; background-size: 40px 100%, 40px 100%, 12px 100%, 12px 100%;
  background-attachment: local, local, scroll, scroll; }
td:first-child { white-space: normal; overflow-wrap: break-word; min-width: 9em; }
table.fits td { white-space: normal; }
details > summary { cursor: pointer; color: var(--accent); }
.ratios { color: var(--muted); font-size: 13px; overflow-wrap: anywhere; margin: 4px 0 0; }
.tiny { border-left: 4px solid var(--bad); background: #fdf3f3; padding: 8px 12px; border-radius: 6px;
        margin: 10px 0 0; font-size: 14px; }
.sentence { margin: 10px 0 0; font-size: 14px; }
.card > h3:first-child { margin-top: 0; }
.bar { display: inline-block; height: 10px; border-radius: 2px; vertical-align: -1px; }
.dbar { display: inline-block; white-space: nowrap; } .dbar .half { display: inline-block; width: 64px; height: 12px; }
.dbar .half.l { text-align: right; border-right: 1px solid #8a929b; } .dbar .half .bar { vertical-align: 1px; }
.swatch { display:inline-block; width:10px; height:10px; border-radius:2px; margin-right:6px; vertical-align:0; }
.ok { color: var(--ok); font-weight: 600; } .failed { color: var(--bad); font-weight: 600; }
figure { margin: 0; } figure img { max-width: 100%; height: auto; display: block; margin: 0 auto; }
figcaption { color: var(--muted); font-size: 13.5px; margin-top: 8px; }
pre, code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; }
pre { background: #f3f4f6; padding: 10px 12px; border-radius: 6px; overflow-x: auto; white-space: pre-wrap; }
.cols { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; }
@media (max-width: 800px) { .cols { grid-template-columns: 1fr; } main { padding: 20px 12px 40px; }
  .card { padding: 14px 12px; } table { font-size: 12.5px; } th, td { padding: 5px 5px; } }
.muted { color: var(--muted); } footer { color: var(--muted); font-size: 12.5px; margin-top: 40px; }
dl.kv { display:grid; grid-template-columns: max-content 1fr; gap: 4px 18px; margin: 0; font-size: 13.5px; }
dl.kv dt { color: var(--muted); }
dl.kv dd { margin: 0; font-family: ui-monospace, Menlo, Consolas, monospace; overflow-wrap: anywhere; min-width: 0; }
.cols > * { min-width: 0; }
"""

#: after the strategies' cards (:mod:`dpcompare.report.mechanisms`): how to read the evidence
EVIDENCE_NOTE = """
<p>The step-time breakdown is the evidence: compare the <strong>backward</strong> bar with the
<strong>optimizer</strong> bar of each strategy, and their growth from np=1 to more processes. The sum
(the time per step) is what decides throughput; which phase the communication hides in is how each
library schedules it. When a phase where no strategy communicates differs, the cores decide: the table's
<em>CPU ms/step</em> gives the main thread's CPU time per step beside the other threads' (the libraries'
background and communication threads), and the attribution under the verdict names them.</p>
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def _table(groups: Sequence[Group], strategies: Sequence[str], results: dict[str, Any] | None = None) -> str:
    """Throughput, step and phase times, accuracy, peak RSS, the threads' CPU: one row per (arm, np); memory has
    its own table."""
    col = colors(strategies)
    several_np = len({g.np for g in groups}) > 1
    cpu = {(g.arm, g.np): attribution.thread_cpu(results or {}, g.arm, g.np) for g in groups}
    head = ["arm", "np", "runs ok", "samples/s<br>mean ± 95 % CI", "step ms<br>median / p95",
            *(f"{p}<br>ms" for p in PHASES), fmt.metric_label(groups[0].metric if groups else {}),
            "final train loss", "peak RSS<br>MB"]
    if several_np:
        head.append("scaling<br>efficiency")
    if any(cpu.values()):
        head.append("CPU ms/step<br>main / other threads")
    rows = []
    for g in groups:
        ok_cls = "ok" if g.ok == g.runs else "failed"
        cells = [f'<span class="swatch" style="background:{col[g.arm]}"></span>{_e(g.arm).replace("/", "/<wbr>")}',
                 str(g.np), f'<span class="{ok_cls}">{g.ok}/{g.runs}</span>', _e(fmt.sps(g.samples_per_sec)),
                 f"{fmt.ms(g.step_ms_median)} / {fmt.ms(g.step_ms_p95)}",
                 *(fmt.ms(g.phases_ms.get(p)) for p in PHASES), _e(fmt.accuracy(g)),
                 "–" if g.final_train_loss is None else f"{g.final_train_loss:.4f}", fmt.mb(g.peak_rss_mb)]
        if several_np:
            cells.append(fmt.pct(g.efficiency, 0) if g.efficiency is not None and g.np > 1 else "")
        if any(cpu.values()):
            c = cpu[(g.arm, g.np)]
            cells.append("–" if c is None else f"{fmt.ms(c['main'])} / {fmt.ms(c['helpers'])}")
        rows.append(cells)
    return _html_table(head, rows)


def _memory_table(groups: Sequence[Group], strategies: Sequence[str]) -> str:
    """Tensor memory per rank (what sharding saves), when the runs recorded it."""
    if not any(g.memory_mb for g in groups):
        return ""
    col = colors(strategies)
    head = ["arm", "np", *(f"{MEMORY_LABELS[k]}<br>MB/rank" for k in MEMORY_KINDS)]
    rows = [[f'<span class="swatch" style="background:{col[g.arm]}"></span>{_e(g.arm).replace("/", "/<wbr>")}',
             str(g.np), *(fmt.size_mb(g.memory_mb.get(k)) for k in MEMORY_KINDS)] for g in groups]
    return ('<h3>Memory per rank</h3>' + _html_table(head, rows)
            + '<p class="muted" style="font-size:13px;margin:10px 0 0">Tensors held by the largest rank at the end '
              "of training (a sharded strategy counts only its own shards).</p>")


def _html_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A table in a wrapper that scrolls inside its card, never the page, on a narrow screen."""
    return ('<div class="scroll"><table><thead><tr>' + "".join(f"<th>{h}</th>" for h in head)
            + "</tr></thead><tbody>" + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
            + "</tbody></table></div>")


MEASURABLE_MS = 0.05
#: a run table longer than this starts collapsed
OPEN_RUNS = 12


def _signed_ms(v: float) -> str:
    return f"{v:+.2f} ms".replace("-", "−")


def _evidence(groups: Sequence[Group], strategies: Sequence[str]) -> str:
    """Per strategy: backward vs optimizer time at the largest np, and their growth against np=1."""
    items = []
    for s in strategies:
        gs = [g for g in groups if g.arm == s and g.phases_ms]
        if not gs:
            continue
        g = max(gs, key=lambda x: x.np)
        text = (f"<strong>{_e(s)}</strong> at np={g.np}: backward {fmt.ms(g.phases_ms.get('backward'))} ms, "
                f"optimizer {fmt.ms(g.phases_ms.get('optimizer'))} ms per step")
        shift = phase_shifts(groups, s).get(g.np)
        if shift:
            b, o = shift.get("backward", 0.0), shift.get("optimizer", 0.0)
            text += (f"; against np=1, backward {_signed_ms(b)} and optimizer {_signed_ms(o)} per step")
            if max(b, o) >= MEASURABLE_MS:
                text += (
                    f": the cost of going distributed sits in <strong>{'backward' if b >= o else 'optimizer'}</strong>"
                )
        items.append(f"<li>{text}.</li>")
    if not items:
        return ""
    return "<h3>In this comparison</h3><ul>" + "".join(items) + "</ul>"


def _mechanisms(results: dict[str, Any], arms: Sequence[str]) -> str:
    known = (results.get("environment") or {}).get("strategies") or {}
    by_arm = {arm_of(r): r["strategy"] for r in results.get("runs", [])}
    strategies = list(dict.fromkeys(by_arm.get(a, a) for a in arms))
    items = [f"<li><strong>{_e(s)}</strong>: {_e(known[s].get('sync_mechanism') or known[s].get('summary'))}</li>"
             for s in strategies if s in known]
    return "<h3>As recorded by each strategy</h3><ul>" + "".join(items) + "</ul>" if items else ""


def _runs(results: dict[str, Any]) -> str:
    rows = []
    metric = metric_of(results.get("runs", []))
    for r in results.get("runs", []):
        ok = r.get("status") == "ok"
        step = (r.get("step_ms") or {}).get("median")
        cells = [f"{_e(arm_of(r))}-np{r['np']}-r{r['repeat']}",
                 f'<span class="{"ok" if ok else "failed"}">{_e(r.get("status"))}</span>',
                 fmt.rate(r.get("samples_per_sec")),
                 fmt.ms(step), fmt.metric_value(metric, final_metric(r)),
                 "–" if r.get("wall_seconds") is None else f"{r['wall_seconds']:.1f}", _others_cell(r),
                 f'<code>{_e(r.get("dir", ""))}</code>']
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        if not ok and r.get("error"):
            rows.append(f'<tr><td colspan="8" class="l"><details><summary class="failed">'
                        f'{_e(fmt.headline(r["error"]))}</summary><pre>{_e(r["error"])}</pre></details></td></tr>')
    head = ["run", "status", "samples/s", "step ms", fmt.metric_label(metric, short=True), "wall s",
            "others'<br>CPU", "folder"]
    runs = results.get("runs", [])
    failed = sum(r.get("status") != "ok" for r in runs)
    table = ('<div class="scroll"><table><thead><tr>' + "".join(f"<th>{h}</th>" for h in head)
             + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table></div>")
    summary = f"{len(runs)} runs" + (f", {failed} failed" if failed else ", all ok")
    return f'<details{" open" if len(runs) <= OPEN_RUNS else ""}><summary>{summary}</summary>{table}</details>'



def _others_cell(run: dict[str, Any]) -> str:
    """The share of the cores other processes took during the run (its ``load``), flagged past the threshold."""
    share = (run.get("load") or {}).get("others_cpu_share")
    if share is None:
        return "–"
    return f'<span class="failed">{fmt.pct(share, 0)}</span>' if share >= regime.SHARED_SHARE else fmt.pct(share, 0)


def _kv(d: dict[str, Any]) -> str:
    items = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in d.items() if not isinstance(v, dict))
    return f'<dl class="kv">{items}</dl>'


def command_line(results: dict[str, Any]) -> str:
    cfg = results.get("config") or {}
    parts = ["dpcompare", "compare"]
    if cfg.get("np") and not cfg.get("cli"):
        parts += ["--np", ",".join(map(str, cfg["np"]))]
    if cfg.get("cli"):
        parts += list(cfg["cli"])
    else:
        if cfg.get("strategies"):
            parts += ["--strategies", ",".join(cfg["strategies"])]
        if cfg.get("repeats"):
            parts += ["--repeats", str(cfg["repeats"])]
    parts += [f for f in cfg.get("train_flags") or [] if f != "--no-tensorboard"]  # compare's default
    out = (cfg.get("train") or {}).get("out")
    if out:
        parts += ["--out", str(out)]
    return " ".join(parts)


def _accuracy_table(results: dict[str, Any], groups: Sequence[Group], strategies: Sequence[str]) -> str:
    """Per (arm, np): final accuracy and loss over seeds, time and steps to the target, next to throughput."""
    col = colors(strategies)
    target = tta_target(results)
    head = ["arm", "np", "seeds", f"{fmt.metric_label(groups[0].metric if groups else {})}<br>mean ± 95 % CI",
            "final train loss"]
    if target:
        head += [f"reached<br>{100 * target:g} %" if (groups and groups[0].metric.get("unit") == "%")
                 else f"reached<br>{target:g}", "time to the target<br>s (mean)", "steps to<br>the target",
                 "epochs to<br>the target"]
    head.append("samples/s<br>mean ± 95 % CI")
    rows = []
    for g in groups:
        ok = [r for r in results.get("runs", []) if arm_of(r) == g.arm and int(r["np"]) == g.np
              and r.get("status") == "ok"]
        cells = [f'<span class="swatch" style="background:{col[g.arm]}"></span>{_e(g.arm).replace("/", "/<wbr>")}',
                 str(g.np), str(len({r.get("seed") for r in ok})), _e(fmt.accuracy(g)),
                 "–" if g.final_train_loss is None else f"{g.final_train_loss:.4f}"]
        if target:
            hit = [r for r in ok if r.get("time_to_accuracy_s") is not None]
            means = {k: sum(float(r[k]) for r in hit) / len(hit) if hit else None
                     for k in ("time_to_accuracy_s", "steps_to_accuracy", "epochs_to_accuracy")}
            cls = "ok" if len(hit) == len(ok) else "failed"
            cells += [f'<span class="{cls}">{len(hit)}/{len(ok)}</span>',
                      *("–" if means[k] is None else f"{means[k]:.{d}f}" for k, d in (
                          ("time_to_accuracy_s", 2), ("steps_to_accuracy", 0), ("epochs_to_accuracy", 2)))]
        cells.append(_e(fmt.sps(g.samples_per_sec)))
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return ('<div class="scroll"><table><thead><tr>' + "".join(f"<th>{h}</th>" for h in head)
            + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table></div>")


def _accuracy_section(results: dict[str, Any], groups: Sequence[Group], verdicts: Sequence[Verdict],
                      plots: Sequence[Plot], strategies: Sequence[str]) -> list[str]:
    """The accuracy and time-to-accuracy verdicts, their table and the accuracy curves (with --seeds or
    --target-accuracy)."""
    target = tta_target(results)
    if not verdicts and not plots and not target:
        return []
    cfg = results.get("config") or {}
    name = metric_of(results.get("runs", []))["name"]
    body = [f'<h2 id="accuracy">Test {_e(name)} and time to the target</h2>']
    if verdicts:
        items = []
        for v in verdicts:
            what = name if v.metric == "accuracy" else "time to the target"
            cls = ' class="failed"' if v.outcome == "mismatch" else ""
            items.append(f"<li><strong{cls}>{_e(what)}: {_e(v.outcome)}</strong> {_e(v.full_text)}</li>")
        seeds = cfg.get("seeds") or []
        body.append(f'<div class="card verdict"><strong>Test {_e(name)} verdicts</strong><ul>' + "".join(items)
                    + "</ul>"
                    + '<p class="muted" style="margin:10px 0 0;font-size:13px">'
                    + (f"Seeds {_e(', '.join(map(str, seeds)))}: each seed is a block that every arm runs with "
                       "the same initial weights and data order. Accuracy: the difference of final test accuracy "
                       "(other − baseline) per seed, with a 95 % Student-t interval over the seeds; <em>equal</em> "
                       "when it lies inside "
                       f"±{100 * float(cfg.get('accuracy_equivalence') or ACCURACY_EQUIVALENCE):g} points "
                       "(--accuracy-equivalence). Arms that differ only in strategy and exact knobs must match "
                       "exactly; the report checks that they do. " if seeds else "")
                    + ("Time to accuracy: training time until the test accuracy first reached "
                       f"{100 * target:g} % (only the optimizer steps of the slowest rank: start-up, evaluation and "
                       "checkpoints excluded), as a ratio other ÷ baseline paired within blocks, with a 95 % "
                       "interval; runs that never reached the target are counted, not dropped." if target else "")
                    + "</p></div>")
    if groups:
        body.append('<div class="card">' + _accuracy_table(results, groups, strategies) + "</div>")
    for p in plots:
        body.append(f'<div class="card"><figure><img alt="{_e(p.title)}" src="{data_uri(p.path)}">'
                    f"<figcaption><strong>{_e(p.title)}.</strong> {_e(p.caption)}</figcaption></figure></div>")
    return body


def render_html(results: dict[str, Any], groups: Sequence[Group], verdicts: Sequence[Verdict],
                plots: Sequence[Plot], extra: Sequence[str] = (),
                attributions: Sequence[dict[str, Any]] | None = None, lead: Sequence[str] = ()) -> str:
    """The page; ``extra``: self-contained HTML sections added after the plots (e.g. the traced step);
    ``attributions``: as results.json stores them (default: stored, else computed from the runs); ``lead``: what
    the page leads with, before the throughput verdict (a fault's cost: its title line, then its points)."""
    if attributions is None:
        attributions = attribution.for_report(results)
    acc_verdicts = [v for v in verdicts if v.metric != "throughput"]
    verdicts = [v for v in verdicts if v.metric == "throughput"]
    acc_plots = [p for p in plots if p.key == "accuracy"]
    plots = [p for p in plots if p.key != "accuracy"]
    strategies = strategy_order(results)
    cfg = results.get("config") or {}
    train = cfg.get("train") or {}
    title = " vs ".join(strategies) if strategies else "comparison"

    body = [f"<h1>dpcompare: {_e(title)}</h1>", f'<p class="sub">{_subtitle(results)}</p>',
            *map(_lead_card, [lead] if lead else [])]
    if verdicts:
        body.append(_verdict_card(results, verdicts, strategies, attributions, groups))
    elif strategies:
        body.append('<div class="card verdict">One strategy only: nothing to compare.</div>')
    if acc_verdicts:
        body.append(_accuracy_card(acc_verdicts, metric_of(results.get("runs", []))["name"]))
    body.extend(_warnings(results))

    body.append("<h2>Results</h2>")
    if groups:
        body.append('<div class="card">' + _table(groups, strategies, results)
                    + '<p class="muted" style="font-size:13px;margin:10px 0 0">Step and phase times are medians '
                      "over the timed steps (warm-up excluded): step times of the slowest rank, phases averaged "
                      "over ranks, then averaged over repeats. Peak RSS is the largest resident memory of any "
                      "rank. CPU ms/step: CPU time per timed step of the thread that runs the steps and of all the "
                      "process's other threads (background and communication threads), mean over ranks and runs.</p>"
                    + _memory_table(groups, strategies) + "</div>")
    for p in plots:
        body.append(f'<div class="card"><figure><img alt="{_e(p.title)}" src="{data_uri(p.path)}">'
                    f"<figcaption><strong>{_e(p.title)}.</strong> {_e(p.caption)}</figcaption></figure></div>")
    body.extend(_accuracy_section(results, groups, acc_verdicts, acc_plots, strategies))
    body.extend(extra)

    body.append("<h2>Why the phases differ</h2>" + mechanisms.cards(results, strategies) + EVIDENCE_NOTE
                + _evidence(groups, strategies) + _mechanisms(results, strategies))
    body.append('<h2 id="runs">Runs</h2><div class="card">' + _runs(results) + "</div>")
    body.append("<h2>Configuration</h2>"
                f'<div class="card"><p style="margin-top:0">Reproduce with:</p><pre>{_e(command_line(results))}</pre>'
                + "<details><summary>Every training setting</summary>"
                + _kv({k: v for k, v in train.items() if k not in ("out", "overwrite", "progress", "strategy")
                       and not (train.get("workload") and k in ("model", "dataset"))})  # a plug-in replaces both
                + "</details></div>")
    env = results.get("environment") or {}
    body.append("<h2>Environment</h2><div class=\"card\">" + _kv(env) + "</div>")
    body.append(f"<footer>Rendered by dpcompare {_e(env.get('dpcompare', ''))} from results.json (schema "
                f"{_e(results.get('schema'))}); every number above can be recomputed from it with "
                f"<code>dpcompare report DIR</code>.</footer>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>dpcompare: {_e(title)}</title><style>{CSS}</style></head>"
            "<body><main>" + "\n".join(body) + "</main></body></html>\n")


def _lead_card(lead: Sequence[str]) -> str:
    """What the comparison is about, first: the fault's cost (its title, then one item per line)."""
    items = "".join(f"<li>{_e(x.strip().removeprefix('• '))}</li>" for x in lead[1:])
    return (f'<div class="card verdict"><strong>{_e(lead[0])}</strong><ul>{items}</ul>'
            '<p class="muted" style="margin:8px 0 0;font-size:13px">Details, table and figure: '
            '<a href="#fault">When a host dies</a>; the throughput without the fault follows.</p></div>')


def _subtitle(results: dict[str, Any]) -> str:
    """The line under the title: devices, workload, process counts, repeats, seeds, date."""
    cfg = results.get("config") or {}
    train = cfg.get("train") or {}
    devices = sorted({str(r["device"]) for r in results.get("runs", []) if r.get("device")})
    script = fmt.script_description(cfg)
    workload = (script,) if script else (workload_label(results), train.get("epochs") and f"{train['epochs']} epochs",
                                         train.get("batch_size") and f"batch {train['batch_size']}/process")
    return " · ".join(_e(x) for x in (
        "/".join(devices), *workload,
        cfg.get("np") and "np " + ", ".join(map(str, cfg["np"])),
        cfg.get("repeats") and f"{cfg['repeats']} repeat{'s' if cfg['repeats'] != 1 else ''}",
        cfg.get("seeds") and "seeds " + ", ".join(map(str, cfg["seeds"])),
        results.get("created")) if x)


def _verdict_item(v: Verdict) -> str:
    """One throughput verdict, stated once (its words carry the outcome); the ratio of every block and how the
    interval was made behind a <details> (the drift plot draws them)."""
    blocks = ""
    if v.block_ratios:
        how = ""
        if v.ci_low is not None:
            units = f", in {len(v.unit_log_ratios)} units of neighbouring blocks" if v.unit_blocks > 1 else ""
            how = f" ({_e(v.method)} interval over {v.blocks} blocks{units})"
        blocks = (f"<details><summary>{_e(v.other)}/{_e(v.baseline)} throughput ratio per block{how}</summary>"
                  f'<p class="ratios">{" ".join(f"{x:.3f}" for x in v.block_ratios)}</p></details>')
    floor = f'<p class="muted">{_e(noise.floor_words(noise.verdict_floor(v)))}</p>' if v.block_ratios else ""
    return f'<li><strong class="outcome-{_e(v.outcome)}">{_e(v.full_text)}</strong>{floor}{blocks}</li>'


def _shortfall_html(text: str) -> str:
    """results.json's ``config.stop.shortfall``, its flags as code that does not wrap."""
    words, sep, flags = text.partition(" with --")
    return _e(words) + (f' with <code style="white-space:nowrap">--{_e(flags)}</code>' if sep else "")


def _verdict_card(results: dict[str, Any], verdicts: Sequence[Verdict], strategies: Sequence[str],
                  attributions: Sequence[dict[str, Any]] = (), groups: Sequence[Group] = ()) -> str:
    """The throughput verdicts at the top of the page; beside them where the difference lies (attribution) and
    what the comparison measured (the regime); then how the verdicts were drawn and why the comparison stopped."""
    eq = verdicts[0].equivalence
    share = measured_share(results)
    stop = (results.get("config") or {}).get("stop") or {}
    shared = "".join(f'<p class="tiny"><strong>np={r.np}:</strong> {_e(regime.shared_line(r))}</p>'
                     for r in regime.regimes(results) if r.shared and r.np in {v.np for v in verdicts})
    verdict = ('<div class="card verdict"><strong>Verdict</strong><ul>' + "".join(_verdict_item(v) for v in verdicts)
               + "</ul>" + shared + "".join(f'<p class="muted">{_e(x)}</p>' for x in noise.setting_lines(results))
               + (f'<p class="muted">Stopped short: {_shortfall_html(stop["shortfall"])}.</p>'
                  if stop.get("shortfall") else "")
               + "</div>")
    why = _attribution_card(attributions)
    regimes = "".join(_regime_card(r, groups) for r in regime.regimes(results) if r.np in {v.np for v in verdicts})
    how = (f'<details class="card"><summary>How the verdict is drawn</summary>'
           f'<p class="muted" style="margin:10px 0 0;font-size:13px">Paired verdicts: every repeat is a '
           f'block that runs each arm once, side by side, so the machine\'s drift cancels in the ratio '
           f'of the two arms within a block. Throughput per run is the global batch over the slowest '
           f'rank\'s median step time; the verdict is the geometric mean of the per-block ratios against '
           f'{_e(strategies[0])} (the first arm) with a 95 % interval (Student t on the log ratios). '
           f'<em>faster</em>/<em>slower</em>: the 95 % interval excludes no '
           f'difference; <em>equal</em>: two one-sided tests at 5 %, i.e. the 90 % interval lies inside '
           f'±{100 * eq:g} %; otherwise <em>undecided</em>, with an estimate of the repeats that would decide. '
           f'The phase differences are paired the same way: per block, the other arm\'s median phase time less '
           f'the baseline\'s, with a 95 % Student-t interval over the blocks.'
           + (f" Timed steps were {100 * share:.0f} % of the runs' wall time; "
              f"{_e(launch_note(results))}." if share is not None else "")
           + (f" {_e(stop.get('blocks'))} block{'s' if stop.get('blocks') != 1 else ''}: "
              f"{_e(stop.get('reason'))}." if stop else "")
           + "</p></details>")
    return verdict + f'<div class="cols">{why or ""}<div>{regimes}</div></div>' + how


def _attribution_card(attributions: Sequence[dict[str, Any]]) -> str:
    """Per verdict: each phase's paired difference in ms with its interval and a bar on one ms scale, and the
    sentence. No shares of the gap: when phases offset each other, a share of the small net means nothing."""
    out = [f"<h3>Where the difference lies · {_e(a['other'])} vs {_e(a['baseline'])} at np={a['np']}</h3>"
           + _html_table(["phase", f"{_e(a['other'])} − {_e(a['baseline'])}<br>ms/step", "95 % CI<br>ms",
                          "less ◂ ms ▸ more"], _attribution_rows(a))
           + f'<p class="sentence">{_e(a.get("text", ""))}</p>' for a in attributions]
    if not out:
        return ""
    return ('<div class="card">' + "".join(out) + '<p class="muted" style="font-size:12.5px;margin:8px 0 0">'
            "Bars in milliseconds, all on one scale: left (green), the other arm spends less time in that phase; "
            "right (red), more. ◀ marks the phases that carry the gap; <em>other</em> is the step less the four "
            "timed phases (bookkeeping, waits outside them).</p></div>")


#: half the width of an attribution bar, px (the bar grows left or right of its centre line)
BAR_HALF_PX = 64


def _bar(ms: float, top: float, colour: str | None = None) -> str:
    """A bar of ``ms`` on a scale where ``top`` ms fills one half: left of the centre line when negative."""
    px = round(BAR_HALF_PX * min(abs(ms) / top, 1.0))
    fill = colour or ("var(--ok)" if ms < 0 else "var(--bad)")
    bar = f'<span class="bar" style="width:{px}px;background:{fill}"></span>'
    return (f'<span class="dbar"><span class="half l">{bar if ms < 0 else ""}</span>'
            f'<span class="half r">{bar if ms >= 0 else ""}</span></span>')


def _attribution_rows(a: dict[str, Any]) -> list[list[str]]:
    """(phase, mean, interval, bar) per phase, then the whole step, every bar on the same ms scale."""
    phases = a.get("phases") or {}
    step = a.get("step") or {}
    means = [abs(p.get("mean_ms") or 0.0) for p in phases.values()] + [abs(step.get("mean_ms") or 0.0)]
    top = max(means, default=0.0) or 1.0
    rows = []
    for name, p in phases.items():
        m = p.get("mean_ms")
        if m is None:
            continue
        rows.append([_e(name) + (" ◀" if name in (a.get("main") or []) else ""), _signed(m),
                     _span(p.get("ci_low_ms"), p.get("ci_high_ms")), _bar(m, top)])
    m = step.get("mean_ms")
    rows.append(["<strong>step</strong>", f"<strong>{_signed(m)}</strong>",
                 _span(step.get("ci_low_ms"), step.get("ci_high_ms")),
                 "" if m is None else _bar(m, top, "var(--accent)")])
    return rows


def _span(lo: float | None, hi: float | None) -> str:
    return "–" if lo is None or hi is None else f"{_signed(lo)} … {_signed(hi)}"


def _signed(v: float | None) -> str:
    return "–" if v is None else f"{v:+.2f}".replace("-", "−")


def _regime_card(r: regime.Regime, groups: Sequence[Group] = ()) -> str:
    """What a verdict at one np speaks for: step time, gradient bytes, communication share, link, threads."""
    per_arm = " · ".join(f"{g.arm} {fmt.ms(g.step_ms_median)}" for g in groups
                         if g.np == r.np and g.step_ms_median is not None)
    kv = {"step time (median)": f"{per_arm} ms" if per_arm else "–" if r.step_ms is None else f"{fmt.ms(r.step_ms)} ms",
          "gradients per step": "–" if r.gradient_mb is None else f"{fmt.size_mb(r.gradient_mb)} MB",
          "communicating or waiting": "not traced (--trace N measures it)" if r.comm_share is None
          else fmt.pct(r.comm_share, 0),
          "link": r.link, "threads per rank": "–" if r.threads is None else str(r.threads),
          "other processes' CPU": regime.others_text(r),
          **({"model traits": " · ".join(r.model)} if r.model else {})}
    items = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in kv.items())
    warn = (f'<p class="tiny"><strong>Tiny steps:</strong> under {regime.TINY_STEP_MS:g} ms or under '
            f"{regime.TINY_GRADIENT_MB:g} MB of gradients, fixed per-step costs decide.</p>" if r.tiny else "")
    if r.shared:
        warn += (f'<p class="tiny"><strong>Shared machine:</strong> other processes took at least '
                 f"{100 * regime.SHARED_SHARE:g} % of the cores during a run; their work, not the strategies, may "
                 "decide this verdict.</p>")
    return (f'<div class="card regime"><strong>What was measured · np={r.np}</strong>'
            f'<dl class="kv" style="margin-top:8px">{items}</dl>{warn}<p class="sentence">{_e(r.sentence)}</p></div>')


def _accuracy_card(acc_verdicts: Sequence[Verdict], name: str) -> str:
    """The outcomes of the workload's metric (``name``) and time to its target at the top; their words are in
    its section."""
    return (f'<div class="card verdict"><strong>Test {_e(name)}</strong><ul>' + "".join(
        f"<li><strong>{_e(name if v.metric == 'accuracy' else 'time to the target')}: {_e(v.outcome)}"
        f"</strong> ({_e(v.other)} vs {_e(v.baseline)}, np={v.np})</li>" for v in acc_verdicts)
            + '</ul><p class="muted" style="margin:10px 0 0;font-size:13px">In words, with the table and '
              f'the curves: <a href="#accuracy">Test {_e(name)} and time to the target</a>.</p></div>')


def _warnings(results: dict[str, Any]) -> list[str]:
    """Cards for failed runs and for an interrupted comparison."""
    out = []
    failed = [r for r in results.get("runs", []) if r.get("status") != "ok"]
    if failed:
        out.append(f'<div class="card warn"><strong class="failed">{len(failed)} of {len(results["runs"])} runs '
                   f'failed.</strong> They are left out of every number below; their errors are listed under '
                   f'<a href="#runs">Runs</a>.</div>')
    if not results.get("complete", True):
        out.append('<div class="card warn">results.json is incomplete: the comparison was interrupted.</div>')
    return out


def write_html(path: Path, results: dict[str, Any], groups: Sequence[Group], verdicts: Sequence[Verdict],
               plots: Sequence[Plot], extra: Sequence[str] = (),
               attributions: Sequence[dict[str, Any]] | None = None, lead: Sequence[str] = ()) -> Path:
    return atomic_write_text(path, render_html(results, groups, verdicts, plots, extra, attributions, lead))

