"""``dpcompare parity``: prove that DDP and Horovod compute the same thing.

Runs the same K steps under each strategy (and, where that is exact in arithmetic, one process with
the global batch), then compares the final weights tensor by tensor and the loss curves step by step. With
``--script`` it runs a user's Horovod script under real Horovod and the native layer (or its DDP port) and
compares the final weights its optimizer held (:mod:`.script`). Each run is a job of :mod:`dpcompare.launch.jobs` (its
own session, ``--run-timeout``, its output in OUT/<strategy>/stdout.log and stderr.log).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from dpcompare import backends, knobs
from dpcompare.argtypes import nonneg_float, positive_int
from dpcompare.compare.cmdline import DEFAULT_RUN_TIMEOUT
from dpcompare.compare.plan import parse_strategies
from dpcompare.compare.script import add_script_arguments, port_notes, script_plan
from dpcompare.compare.workers import WorkerPool
from dpcompare.config import HOW_LONG, KNOBS, OUTPUT, TRAINING, WHERE, TrainConfig
from dpcompare.data.plugins import check_workload, resolve_workload
from dpcompare.errors import ConfigError
from dpcompare.files import SUMMARY, atomic_write_json
from dpcompare.lab import session
from dpcompare.lab.spec import lab_spec_arg
from dpcompare.launch.env import local_cores
from dpcompare.launch.jobs import dpcompare_command, log_tail, run_job
from dpcompare.launch.mpirun import in_slurm_allocation, job_command, job_env
from dpcompare.native.calls import LAYER_ARM
from dpcompare.options import (
    CONFIG_FILE,
    START,
    add_config_file_option,
    add_config_options,
    config_from_args,
    given_settings,
    train_argv,
    write_config,
)
from dpcompare.versions import docs_page

if TYPE_CHECKING:
    import torch

    from dpcompare.compare.workers import WorkerPool
    from dpcompare.data.workload import ModelTraits
    from dpcompare.lab import Lab

#: optimizers whose update scales each gradient by its running size: one process's global-batch sums, which
#: differ from the processes' in the last bits, can then move a weight by up to the learning rate
ADAPTIVE = ("adam", "adamw")



#: the section of parity's --help for a Horovod script
SCRIPT = "a Horovod script (dpcompare parity --script train.py -- ARGS)"
#: parity's --help by concern: what a first user needs first
SECTIONS = {START: ("--config", "--strategies", "--np", "--steps", "--model", "--dataset", "--batch-size",
                    "--tolerance",
                    "--script", "--out", "--overwrite"),
            "what to compare": ("--single-tolerance", "--no-single"), HOW_LONG: ("--run-timeout",),
            WHERE: ("--lab", "--workers"),
            SCRIPT: (), TRAINING: (), KNOBS: (), OUTPUT: ()}


def register(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:

    p = sub.add_parser(
        "parity", help="run ddp and horovod (or any --strategies) for K steps and compare weights and losses tensor "
                       "by tensor",
        description="Run the same K steps under each strategy at --np processes, and under `single`: one process "
                    "that replays the --np processes (each one's batch, random state and BatchNorm statistics, "
                    "one after the other; under --sync-bn the global batch in one pass), then print the largest "
                    "absolute difference per tensor of the final weights and between the loss curves. "
                    "Exit code 0 only when everything agrees within the tolerances.",
        epilog="examples:\n  dpcompare parity --np 2 --model convnet --dataset digits --steps 100\n"
               "  dpcompare parity --script train.py --np 2 -- --epochs 1     # a Horovod script: horovod vs native\n"
               "  dpcompare parity --script train.py --strategies horovod,native,ddp -- --epochs 1",
        formatter_class=argparse.RawDescriptionHelpFormatter, sections=SECTIONS)
    add_config_file_option(p)
    p.add_argument("--np", type=positive_int, default=2, help="processes per distributed run (default: 2)")
    p.add_argument("--steps", type=positive_int, default=100, help="optimizer steps per run (default: 100)")
    p.add_argument("--strategies", type=parse_strategies,
                   help="strategies to compare, the first is the reference (default: ddp,horovod; with --script: "
                        "horovod,native)")
    p.add_argument("--tolerance", type=nonneg_float, default=1e-6,
                   help="largest allowed |difference| between distributed strategies (default: 1e-6, fp32 CPU)")
    p.add_argument("--single-tolerance", type=nonneg_float, default=1e-5,
                   help="largest allowed |difference| against the one-process reference, whose sums over the "
                        "processes' gradients are taken in another order (default: 1e-5)")
    p.add_argument("--no-single", dest="single", action="store_false", help="skip the one-process reference")
    p.add_argument("--lab", type=lab_spec_arg, metavar="hosts=N,link=RATE[,slots=K]",
                   help="run the distributed runs across an emulated cluster made for this check and removed after "
                        f"it (root, iproute2, tbf; {docs_page('lab')}); the one-process run stays on this host")
    p.add_argument("--workers", choices=("fresh", "persistent"), default="persistent", metavar="fresh|persistent",
                   help="how the distributed runs start. persistent: one job of --np processes runs them one after "
                        "another (Python, torch and MPI start once; each run still builds its data, model and "
                        "optimizer and joins and leaves its strategy's process group). fresh: each is its own "
                        "mpirun/srun job. The one-process reference is always its own process; under --lab every run "
                        "is its own job (default: persistent, unlike compare's fresh: parity compares weights, not "
                        "start-up times)")
    p.add_argument("--run-timeout", type=nonneg_float, default=DEFAULT_RUN_TIMEOUT, metavar="SECONDS",
                   help="stop a run that takes longer (all its processes) and fail the check; each run's output is "
                        f"in OUT/<strategy>/stdout.log and stderr.log (default: {DEFAULT_RUN_TIMEOUT:g}; 0: no limit)")

    add_script_arguments(p.add_argument_group(SCRIPT), compare=False)
    add_config_options(p, exclude=("strategy",), defaults={"out": "runs/parity"},
                       helps={"out": "output folder (default: runs/parity)"})
    p.set_defaults(func=run_parity)


def judge(cfg: TrainConfig) -> tuple[str, float, str | None]:
    """How the knobs in ``cfg`` let ddp and horovod be compared: (mode, tolerance floor, what to tell the user).

    ``exact``: the usual tolerance; ``lossy``: a tolerance suited to the wire dtype; ``distance``: the two are
    not meant to match, so only the distance is reported.
    """
    active = knobs.active(cfg)
    different = [k for k in active if knobs.TABLE[k].exactness == "different"]
    if different:
        return "distance", 0.0, "; ".join(knobs.TABLE[k].note for k in different) + ": the distance is reported"
    if cfg.grad_compression != "none":
        tol = knobs.COMPRESSION_TOLERANCE[cfg.grad_compression]
        return "lossy", tol, (f"{cfg.grad_compression} compression: {knobs.TABLE['grad_compression'].note}; "
                              f"tolerance {tol:g} for the distributed strategies")
    return "exact", 0.0, None


def model_traits(cfg: TrainConfig) -> ModelTraits:
    """What one batch forward and backward on the CPU shows of the model ``cfg`` trains (a plug-in's pre-check
    already ran; a built-in workload is checked here, before any run)."""
    workload = resolve_workload(cfg).workload
    return workload.traits or check_workload(workload)


#: what a knob that changes the arithmetic does to the result (parity names it beside the difference)
KNOB_CAUSES = {"grad_compression": "{} compression rounds the exchanged gradients",
               "adasum": "Adasum combines the gradients instead of averaging them",
               "powersgd_rank": "PowerSGD sends a low-rank approximation of the gradients"}


def known_causes(strategy: str, ref: str, base: TrainConfig, np_: int, summary: dict[str, Any],
                 traits: ModelTraits) -> list[str]:
    """Why ``strategy``'s run may differ from ``ref``'s, where that is known: a knob that changes the arithmetic
    on either side, sums of more than two terms taken in another order (sparse gradients' rows included), the
    one-process reference's replay of the processes' random streams failing, non-deterministic CUDA kernels."""
    causes = [KNOB_CAUSES[k].format(v) for k, v in knobs.active(base).items() if k in KNOB_CAUSES
              and any(k in backends.facts(s).knobs for s in (strategy, ref))]
    one = not backends.facts(strategy).distributed
    diverged = (summary.get("comm") or {}).get("diverged_at_step")
    if one and diverged:
        causes.append(f"random operations (dropout): from step {diverged} the processes drew different amounts of "
                      "random numbers (batch shapes differ by process), which one process cannot replay")
    if one and base.sync_bn:
        causes.append("BatchNorm: statistics over the global batch, summed in another order than across processes")
    if (one and (np_ > 2 or base.accumulate > 1)) or (not one and np_ > 2):
        causes.append("summation order: sums of more than two terms grouped differently")
    if traits.sparse:
        causes.append("sparse gradients: each library adds the rows of the processes' sparse gradients in its own "
                      "order (DDP over gloo: coalesced rows all-gathered and summed; Horovod: all-gathered, divided, "
                      "then summed by the update)")
    if str(summary.get("device", "")).startswith("cuda") and not base.deterministic:
        causes.append("non-deterministic CUDA kernels (atomic adds in some backward passes)")
    return causes


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
    import torch

    if a.shape != b.shape:
        return float("inf")
    if not a.is_floating_point():
        return float((a.to(torch.float64) - b.to(torch.float64)).abs().max()) if a.numel() else 0.0
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def parity_diff(ref: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Per-tensor and loss-curve differences between two finished runs (``weights``, ``losses``)."""
    per_tensor = {k: max_abs_diff(v, other["weights"][k]) if k in other["weights"] else float("inf")
                  for k, v in ref["weights"].items()}
    la, lb = ref["losses"], other["losses"]
    loss = max((abs(x - y) for x, y in zip(la, lb, strict=False)), default=0.0) if len(la) == len(lb) else float("inf")
    parted = next((i for i, (x, y) in enumerate(zip(la, lb, strict=False)) if x != y), None)
    return {
        "per_tensor": per_tensor,
        "weights_max": max(per_tensor.values(), default=0.0),
        "loss_max": loss,
        "steps": len(la),
        "first_step": parted,
        "largest": max(per_tensor, key=per_tensor.__getitem__, default=None),
    }


def _run_one(cfg: TrainConfig, np_: int, console: Console, lab: Lab | None = None,
             timeout: float | None = None, pool: WorkerPool | None = None) -> dict[str, Any]:
    """Run ``cfg`` as ``np_`` processes (on ``pool``'s job, or across ``lab`` when given; ``single`` as one
    process on this host), its output in its folder, stopped after ``timeout`` seconds; its final weights and
    loss curve."""
    from dpcompare import checkpoint  # here, not at the top: it loads torch and numpy

    distributed = backends.facts(cfg.strategy).distributed
    out = Path(cfg.out)
    if distributed and pool is not None:
        console.print(f"[bold]{cfg.strategy}[/] at np={np_} (batch {cfg.batch_size}/process): on the persistent "
                      f"worker job")
        out.mkdir(parents=True, exist_ok=True)
        rc, seconds = pool.run(np_, train_argv(cfg), out, timeout)
    else:
        cmd = dpcompare_command(np_ if distributed else None, ["train", *train_argv(cfg)],
                                lab if distributed else None)
        console.print(f"[bold]{cfg.strategy}[/] at np={np_ if distributed else 1} "
                      f"(batch {cfg.batch_size}/process): {' '.join(cmd[:6])} …")
        rc, seconds = run_job(cmd, out, job_env(), timeout)
    if rc != 0:
        what = (
            f"failed (exit {rc})" if rc is not None else f"took longer than --run-timeout {timeout:g} s and was stopped"
        )
        raise RuntimeError(f"{cfg.strategy} run {what}; its output is in {out}/stdout.log and stderr.log:\n"
                           f"{log_tail(out)}")
    path = checkpoint.latest_checkpoint(out)
    if path is None:
        raise RuntimeError(f"{cfg.strategy} run wrote no checkpoint in {out}")
    console.print(f"  done in {seconds:.1f} s")
    return {"weights": checkpoint.load_checkpoint(path)["model"],
            "losses": json.loads((out / "step_losses.json").read_text()),
            "summary": json.loads((out / SUMMARY).read_text())}


def _runs(a: argparse.Namespace, base: TrainConfig, strategies: list[str],
          traits: ModelTraits) -> tuple[dict[str, TrainConfig], list[str]]:
    """The distributed runs (each strategy without the knobs it lacks) and notes on what was left out; a knob or
    a model a strategy cannot take is refused here, before any run."""
    runs: dict[str, TrainConfig] = {}
    notes: list[str] = []
    for s in strategies:  # a knob only one library has (Adasum, PowerSGD): the other runs without it
        foreign = [k for k in knobs.active(base) if k not in backends.facts(s).knobs]
        runs[s] = dataclasses.replace(knobs.without(base, foreign), strategy=s,
                                      out=str(Path(a.out) / backends.catalog.folder(s)))
        if foreign:
            notes.append(f"{s} runs without {', '.join(foreign)} (it has no equivalent)")
        backends.check_config(s, runs[s], a.np)  # refuse now, not after the other runs
        backends.check_model(s, traits, runs[s])
    return runs, notes


def _single(a: argparse.Namespace, base: TrainConfig, traits: ModelTraits) -> tuple[TrainConfig | None, str | None]:
    """The one-process reference, or why it is skipped. It takes each step as the ``--np`` processes would
    (``emulate_ranks``: their batches, random states and BatchNorm statistics, one after the other), except under
    ``--sync-bn``, where it takes the global batch in one pass (BatchNorm's statistics are the global batch's)."""
    if not a.single:
        return None, None
    one = backends.one_process()
    unsupported = [k for k in knobs.active(base) if k not in backends.facts(one).knobs]
    if unsupported:
        return None, f"single skipped: it has nothing to communicate, so {', '.join(unsupported)} has no meaning there"
    out = str(Path(a.out) / one)
    lr = base.lr * a.np if base.scale_lr else base.lr
    threads = rank_threads(base, a.np)
    if not base.sync_bn:
        return dataclasses.replace(base, strategy=one, out=out, accumulate=base.accumulate * a.np,
                                   emulate_ranks=a.np, lr=lr, scale_lr=False, threads=threads), None
    if traits.random:
        return None, (f"single skipped: under --sync-bn it takes the global batch in one pass, whose random masks "
                      f"({', '.join(traits.random)}) come from one random stream instead of one per process")
    if base.amp != "none":
        return None, (f"single skipped: under --amp {base.amp} one global batch's gradient sums round differently "
                      "from per-process ones")
    if base.optimizer in ADAPTIVE:
        return None, (f"single skipped: under --sync-bn it takes the global batch in one pass, and --optimizer "
                      f"{base.optimizer} divides each gradient by its running root mean square, so a gradient near 0, "
                      "whose sum over one global batch and over per-process batches differ in the last bits, moves its "
                      "weight by up to --lr either way")
    return dataclasses.replace(base, strategy=one, out=out, batch_size=base.batch_size * a.np, lr=lr, scale_lr=False,
                               sync_bn=False, threads=threads), None


def rank_threads(base: TrainConfig, np_: int) -> int:
    """The torch CPU threads each of the ``np_`` ranks takes (``--threads``; 0: this host's cores shared among
    them, as every run's ranks share them), which the one-process reference takes too: CPU kernels split some
    reductions by thread (LayerNorm's weight and bias gradients), so another thread count sums them in another
    order, and AdamW turns those last bits into steps of up to ``--lr``."""
    return base.threads or max(1, local_cores() // np_)


def _table(a: argparse.Namespace, results: dict[str, dict[str, Any]], ref: str, diffs: dict[str, dict[str, Any]],
           tol: dict[str, float]) -> Table:
    others = list(diffs)
    table = Table(title=f"parity after {a.steps} steps, np={a.np}: largest |difference| from {ref}")
    table.add_column("tensor")
    table.add_column("shape")
    for s in others:
        table.add_column(f"{s} (tol {tol[s]:g})", justify="right")
    fmt = lambda v, t: f"[green]{v:.2e}[/]" if v <= t else f"[red]{v:.2e}[/]"  # noqa: E731
    for k, v in results[ref]["weights"].items():
        table.add_row(
            k, "×".join(map(str, v.shape)) or "scalar", *(fmt(diffs[s]["per_tensor"][k], tol[s]) for s in others)
        )
    table.add_section()
    table.add_row("[bold]all weights[/]", "", *(fmt(diffs[s]["weights_max"], tol[s]) for s in others))
    table.add_row("[bold]loss curve[/]", f"{a.steps} steps", *(fmt(diffs[s]["loss_max"], tol[s]) for s in others))
    if any(_differs(diffs[s]) for s in others):
        table.add_row("[bold]known cause[/]", "", *(_cause_cell(diffs[s]) for s in others))
    return table


def _differs(d: dict[str, Any]) -> bool:
    return bool(d["weights_max"] or d["loss_max"])


def _cause_cell(d: dict[str, Any]) -> str:
    """What the table says beside a difference: its known causes, or that none is known (nothing when it is 0)."""
    if not _differs(d):
        return ""
    return "; ".join(d["causes"]) if d["causes"] else "none known"


def _verdict(mode: str, passed: bool, ref: str, diffs: dict[str, dict[str, Any]], tol: dict[str, float]) -> str:
    if mode == "distance":
        return "[yellow]NOT MEANT TO MATCH[/]: " + ", ".join(
            f"{s} is {d['weights_max']:.2e} (weights) / {d['loss_max']:.2e} (loss) from {ref}" for s, d in diffs.items()
        )
    if passed:
        return "[green]PASS[/]: " + ", ".join(f"{s} matches {ref} within {tol[s]:g}" for s in diffs)
    over = [s for s, d in diffs.items() if d["weights_max"] > tol[s] or d["loss_max"] > tol[s]]
    return "[red]FAIL[/]: differences above tolerance (red above): " + "; ".join(
        f"{s} ({', '.join(diffs[s]['causes']) or unexplained(diffs[s])})" for s in over)


def unexplained(d: dict[str, Any]) -> str:
    """What parity says of a difference it knows no cause for: where it shows first (never an empty reason)."""
    step = d.get("first_step")
    where = (f"its loss first differs at step {step}" if step is not None
             else "its loss curve is the same" if d["steps"] else "it recorded no loss")
    return f"no known cause: {where}; its largest weight difference is in {d.get('largest') or 'no tensor'}"


def refuse_nothing_to_compare(a: argparse.Namespace, runs: list[str], single_note: str | None) -> None:
    """One strategy compared with nothing is no pass: refuse before anything runs."""
    if len(runs) >= 2:
        return
    why = f" ({single_note})" if single_note else " (--no-single)" if not a.single else ""
    other = next(n for n in backends.names() if n != runs[0] and backends.facts(n).distributed)
    raise ConfigError(f"parity needs two runs to compare but --strategies {','.join(a.strategies)} gives only "
                      f"{', '.join(runs)}{why}; name another, e.g. --strategies {runs[0]},{other}")


def _run_all(a: argparse.Namespace, runs: dict[str, TrainConfig], console: Console) -> dict[str, dict[str, Any]]:
    """Every run, the distributed ones across ``--lab`` when given (made for them, removed after them), else on one
    persistent worker job unless ``--workers fresh``."""
    pool = None
    if a.workers == "persistent" and a.lab is None:
        pool = WorkerPool(Path(a.out), job_env(), job_command, local=not in_slurm_allocation())
    with session(a.lab, console.print) as lab, (contextlib.closing(pool) if pool else contextlib.nullcontext()):
        return {name: _run_one(cfg, a.np, console, lab, a.run_timeout or None, pool) for name, cfg in runs.items()}


def _lab_json(a: argparse.Namespace) -> dict[str, Any]:
    return {"lab": a.lab.to_json()} if a.lab is not None else {}


def run_parity(a: argparse.Namespace) -> int:
    console = Console(highlight=False)
    if a.strategies is None:
        a.strategies = ["horovod", "native"] if a.script is not None else ["ddp", "horovod"]
    if a.script is not None or LAYER_ARM in a.strategies:
        return _script_parity(a, console)
    # the one-process run is added below, where it is exact
    strategies = [s for s in a.strategies if backends.facts(s).distributed]
    if not strategies:
        raise ConfigError("--strategies needs a distributed strategy (" + ", ".join(
            n for n in backends.names() if backends.facts(n).distributed) + ", or your own MODULE:CLASS)")
    out = Path(a.out)
    if (out / "parity.json").exists() and not a.overwrite:
        raise ConfigError(f"{out} already holds a parity result; pass --overwrite or another --out")
    if a.lab is not None:
        a.lab.check_np(a.np)
    base = config_from_args(a, epochs=0, max_steps=a.steps, record_step_loss=True, save_final=True,
                            checkpoint_every=0, overwrite=True, tensorboard=False, progress="none",
                            resume=None, strategy=strategies[0], deterministic=a.device != "cpu")
    traits = model_traits(base)
    runs, notes = _runs(a, base, strategies, traits)
    mode, knob_tol, knob_note = judge(base)
    notes += [knob_note] if knob_note else []
    single, single_note = _single(a, base, traits)
    if single is not None:
        runs[single.strategy] = single
    refuse_nothing_to_compare(a, list(runs), single_note)
    _write_config(a, out)  # after every refusal: a refused check writes nothing
    try:
        results = _run_all(a, runs, console)
    except RuntimeError as e:
        console.print(f"[red]parity: {e}[/]")
        return 1

    ref = strategies[0]
    diffs = {
        s: {
            **parity_diff(results[ref], results[s]),
            "causes": known_causes(s, ref, base, a.np, results[s].get("summary", {}), traits),
        }
        for s in results
        if s != ref
    }
    tol = {s: (max(a.tolerance, knob_tol) if backends.facts(s).distributed else a.single_tolerance)
           for s in diffs}
    console.print(_table(a, results, ref, diffs, tol))
    for note in [*notes, *([single_note] if single_note else [])]:
        console.print(note)
    if not diffs:  # every other run was left out: nothing was compared, which is no pass
        console.print(f"[red]NOTHING COMPARED[/]: only {ref} ran")
        return 1
    within = all(d["weights_max"] <= tol[s] and d["loss_max"] <= tol[s] for s, d in diffs.items())
    passed = within or mode == "distance"  # not meant to match: the distance is the result
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "parity.json", {
        "np": a.np, "steps": a.steps, "reference": ref, "passed": passed, "tolerance": tol, "note": single_note,
        "mode": mode, "knobs": knobs.active(base), "notes": notes, **_lab_json(a),
        "config": base.to_dict(), "model": dataclasses.asdict(traits), "diffs": diffs})
    console.print(f"{_verdict(mode, passed, ref, diffs, tol)} → {out / 'parity.json'}", soft_wrap=True)
    return 0 if passed else 1


def _write_config(a: argparse.Namespace, out: Path) -> None:
    """OUT/config.toml: the settings this check was given (file and flags), which rerun it with --config."""
    settings = given_settings(a)
    if settings is not None:
        write_config(out / CONFIG_FILE, a.commands[a.command], settings)


def _script_parity(a: argparse.Namespace, console: Console) -> int:
    """``parity --script``: the script's final weights under each arm (:mod:`dpcompare.compare.script`)."""
    out = Path(a.out)
    if (out / "parity.json").exists() and not a.overwrite:
        raise ConfigError(f"{out} already holds a parity result; pass --overwrite or another --out")
    if a.lab is not None:
        a.lab.check_np(a.np)
    _write_config(a, out)
    return run_script_parity(a, config_from_args(a, strategy="horovod"), console)


# -- parity --script ------------------------------------------------------------------------------------------
def _final_weights(run_dir: Path) -> dict[str, Any]:
    # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
    import torch

    path = run_dir / "params.pt"
    if not path.exists():
        raise RuntimeError(f"{run_dir.name} recorded no weights (no DistributedOptimizer or optimizer stepped)")
    return torch.load(path, weights_only=True)


def run_script_parity(a: argparse.Namespace, cfg: TrainConfig, console: Any) -> int:
    """``parity --script``: the script under each arm, its final weights compared tensor by tensor."""

    arms, out = list(a.strategies), Path(a.out)
    plan = script_plan(a, arms, out)
    assert plan is not None
    if len(arms) < 2:
        raise ConfigError(f"parity needs two arms to compare; --strategies {','.join(arms)} gives one "
                          "(e.g. --strategies horovod,native)")
    weights: dict[str, dict[str, Any]] = {}
    with session(a.lab, console.print) as lab:
        for arm in arms:
            run_dir = out / arm
            cmd = plan.command(arm, a.np, run_dir, cfg, lab)
            console.print(f"[bold]{arm}[/] at np={a.np}: {' '.join(cmd[:6])} …")
            rc, seconds = run_job(cmd, run_dir, job_env(), a.run_timeout or None)
            if rc != 0:
                console.print(f"[red]parity: the {arm} run failed (exit {rc}); its output is in {run_dir}/stdout.log "
                              f"and stderr.log:\n{log_tail(run_dir)}[/]")
                return 1
            weights[arm] = _final_weights(run_dir)
            console.print(f"  done in {seconds:.1f} s")
    ref = arms[0]
    diffs = {arm: {k: max_abs_diff(v, weights[arm]["tensors"][k]) if k in weights[arm]["tensors"] else float("inf")
                   for k, v in weights[ref]["tensors"].items()} for arm in arms[1:]}
    console.print(_parity_table(a, weights[ref], diffs, ref))
    notes = port_notes(plan, arms)
    for note in notes:
        console.print(note)
    worst = {arm: max(d.values(), default=0.0) for arm, d in diffs.items()}
    passed = all(v <= a.tolerance for v in worst.values())
    atomic_write_json(out / "parity.json", {
        "script": str(plan.path), "args": list(plan.args), "np": a.np, "reference": ref, "passed": passed,
        "tolerance": a.tolerance, "weights_max": worst, "notes": notes, "seed": cfg.seed,
        "diffs": {arm: {weights[ref]["names"].get(k, k): v for k, v in d.items()} for arm, d in diffs.items()}})
    verdict = ("[green]PASS[/]: " + ", ".join(f"{arm} matches {ref} within {a.tolerance:g} (largest {w:.2e})"
                                              for arm, w in worst.items())
               if passed else "[red]FAIL[/]: differences above tolerance (red above)")
    console.print(f"{verdict} → {out / 'parity.json'}", soft_wrap=True)
    return 0 if passed else 1


def _parity_table(a: argparse.Namespace, ref: dict[str, Any], diffs: dict[str, dict[str, float]], name: str) -> Any:
    table = Table(title=f"parity of {a.script.name} at np={a.np}: largest |difference| of the final weights from "
                        f"{name}")
    table.add_column("tensor")
    table.add_column("shape")
    for arm in diffs:
        table.add_column(f"{arm} (tol {a.tolerance:g})", justify="right")
    fmt = lambda v: f"[green]{v:.2e}[/]" if v <= a.tolerance else f"[red]{v:.2e}[/]"  # noqa: E731
    for key, t in ref["tensors"].items():
        table.add_row(ref["names"].get(key, key), "×".join(map(str, t.shape)) or "scalar",
                      *(fmt(d[key]) for d in diffs.values()))
    table.add_section()
    table.add_row("[bold]all weights[/]", "", *(fmt(max(d.values(), default=0.0)) for d in diffs.values()))
    return table
