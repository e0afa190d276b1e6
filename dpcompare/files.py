"""Shared names of what dpcompare writes, and the one atomic writer every file goes through (text, JSON and
figures through their helpers here; checkpoints through :func:`dpcompare.checkpoint.atomic_save`); also the one
way a user's Python file (a plug-in workload or strategy) is imported, :func:`import_file`."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

#: the phases of one training step, timed under every strategy (summary.json ``timing.phases_ms``)
PHASES = ("data", "forward", "backward", "optimizer")
#: the tensors a rank holds (summary.json ``memory``: ``KIND_bytes`` per rank, ``KIND_mb`` for the largest)
MEMORY_PARTS = ("params", "grads", "optimizer_state")
#: the memory kinds summary.json and results.json (``memory_mb``) record: the parts and their total
MEMORY_KINDS = (*MEMORY_PARTS, "total")
#: what a training run writes in OUT (a folder holding one of them holds a run)
RUN_FILES = ("metrics.jsonl", "summary.json")
#: a comparison's results, and the version of their schema (docs/results-schema.md)
RESULTS = "results.json"
SCHEMA = 2
#: the axis of the lab link an arm ran on (compare/axes.py; results.json: ``config.arms[].axes``, ``runs[].axes``,
#: ``config.lab``; under ``knobs`` in older files), swept with ``--sweep link=1gbit,200mbit``
LINK = "link"
#: the axis of the fault an arm met (``--fault host=2,at-step=40``; results.json: ``config.arms[].axes``,
#: ``runs[].axes``; under ``knobs`` in older files), named in arm labels as ``ddp-elastic/fault=host2@40``
FAULT = "fault"
#: prefix of the temporary files an atomic write leaves behind when it is killed
TMP_PREFIX = "."
TMP_MARK = ".tmp-"


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any]) -> Path:
    """Write ``path`` through ``write(file)`` so that it is either absent, the old file, or the whole new one.

    The data goes to a temporary file beside it (``.NAME.tmp-PID``), is fsynced, then renamed over
    ``path``; the folder is fsynced so the rename survives a crash.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}{TMP_MARK}{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode()))


def atomic_write_json(path: str | Path, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def atomic_write_figure(path: str | Path, fig: Any, **savefig: Any) -> Path:
    """A matplotlib figure written as :func:`atomic_write` writes (``fig.savefig`` into the temporary file, in the
    format ``path``'s suffix names); ``savefig`` are ``Figure.savefig``'s other arguments."""
    return atomic_write(path, lambda f: fig.savefig(f, format=Path(path).suffix.lstrip(".") or "png", **savefig))


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Delete the temporary files (``.NAME.tmp-PID``) that killed atomic writes left in ``folder``.

    Only files of processes that no longer run go (another live process may be writing one now).
    Returns what was removed.
    """
    removed = []
    for p in Path(folder).glob(f"{TMP_PREFIX}*{TMP_MARK}*"):
        pid = p.name.rsplit(TMP_MARK, 1)[1]
        if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
            continue
        try:
            p.unlink()
            removed.append(p)
        except FileNotFoundError:
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def import_file(path: Path, prefix: str) -> Any:
    """The module in the Python file ``path``, imported once per process under a name made of ``prefix`` and its
    resolved path (dataclasses and pickle look a module up by that name); a failed import leaves no trace."""
    name = prefix + "".join(c if c.isalnum() else "_" for c in str(path.resolve()))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module
