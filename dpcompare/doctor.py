"""``dpcompare doctor``: what this machine can run (torch, MPI, mpi4py, each strategy's build, torchvision, GPUs)."""

from __future__ import annotations

import shutil
from typing import Any

from dpcompare import backends
from dpcompare.versions import mpi_version, versions


def _mpi4py() -> dict[str, Any]:
    try:
        import mpi4py
    except ImportError as e:
        return {"installed": False, "error": str(e)}
    cfg = mpi4py.get_config() if hasattr(mpi4py, "get_config") else {}
    return {"installed": True, "version": mpi4py.__version__, "mpicc": cfg.get("mpicc")}


def _torchvision() -> str:
    try:
        import torchvision
    except Exception as e:  # noqa: BLE001
        return f"not usable ({type(e).__name__}); install with pip install 'dpcompare[vision]'"
    return torchvision.__version__


def report() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {
        "versions": versions(),
        "torch_distributed": {"available": dist.is_available(), "gloo": dist.is_gloo_available(),
                              "nccl": dist.is_nccl_available(), "mpi": dist.is_mpi_available()},
        "mpi": {"mpirun": shutil.which("mpirun"), "version": mpi_version()},
        "mpi4py": _mpi4py(),
        "strategies": {name: backends.get(name).build_info() for name in backends.names()},
        "torchvision": _torchvision(),
        "gpus": gpus,
    }


def short() -> str:
    v = versions()
    tv = _torchvision()
    return (f"dpcompare {v['dpcompare']} · torch {v['torch']} · torchvision {tv if tv[0].isdigit() else 'absent'} "
            f"· horovod {v['horovod'] or 'absent'} · {v['mpi'] or 'no MPI'}")


def render(info: dict[str, Any]) -> None:
    import torch
    from rich.console import Console
    from rich.markup import escape
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
    Console().print(t)


def _cmd_doctor(a: Any) -> int:
    if a.short:
        print(short())
        return 0
    info = report()
    if a.json:
        import json

        print(json.dumps(info, indent=2))
    else:
        render(info)
    return 0


def register(sub: Any, parser_class: type) -> None:
    d = sub.add_parser("doctor", help="show what this machine can run: torch, MPI, mpi4py, Horovod's build, GPUs")
    d.add_argument("--json", action="store_true", help="print machine-readable JSON")
    d.add_argument("--short", action="store_true", help="one line of versions")
    d.set_defaults(func=_cmd_doctor)
