"""Shared names of what dpcompare writes, and the one atomic writer every file goes through (text, JSON and
figures through their helpers here; checkpoints through :func:`dpcompare.checkpoint.atomic_save`); the one line
writer of the logs read as they grow (:func:`append_json_line`); and the one loader of users' plug-ins, strategies,
workloads, models and datasets alike (:func:`is_plugin`, :func:`load_attr`)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from dpcompare.errors import ConfigError
from dpcompare.models.catalog import HF_PREFIX

#: the phases of one training step, timed under every strategy (summary.json ``timing.phases_ms``)
PHASES = ("data", "forward", "backward", "optimizer")
#: the tensors a rank holds (summary.json ``memory``: ``KIND_bytes`` per rank, ``KIND_mb`` for the largest)
MEMORY_PARTS = ("params", "grads", "optimizer_state")
#: the memory kinds summary.json and results.json (``memory_mb``) record: the parts and their total
MEMORY_KINDS = (*MEMORY_PARTS, "total")
#: what a run writes in OUT: its summary, its metric curve (a folder holding one of them holds a run) and the step
#: log a fault is timed by (a line per optimizer step, training/steplog.py and native/record.py)
SUMMARY, METRICS, STEP_LOG = "summary.json", "metrics.jsonl", "steps.jsonl"
RUN_FILES = (METRICS, SUMMARY)
#: the default equivalence margins of a comparison's verdicts (results.json ``config.equivalence``,
#: ``config.accuracy_equivalence``): throughput ratios inside 1 ± EQUIVALENCE are "equal", and final metrics
#: within ± ACCURACY_EQUIVALENCE (0.5 percentage points), a faulted run's against its clean twin's included
EQUIVALENCE, ACCURACY_EQUIVALENCE = 0.05, 0.005
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


def append_json_line(path: str | Path, fields: dict[str, Any]) -> None:
    """One line ``{**fields, "t": now}`` (the wall clock) appended to the log ``path`` with one ``write``: the step
    logs a watcher reads as they grow (``OUT/steps.jsonl``, from training and from the script runner alike)."""
    line = json.dumps({**fields, "t": round(time.time(), 4)}) + "\n"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:  # not atomic: a log read as it grows, one whole line per write
        f.write(line)


# -- users' plug-ins -----------------------------------------------------------------------------------------
_MISSING = object()


def one_line(e: BaseException) -> str:
    """An exception as one line of at most 300 characters, for a refusal that quotes it."""
    return " ".join((f"{type(e).__name__}: {e}" if str(e) else type(e).__name__).split())[:300]


def is_plugin(spec: str | None) -> bool:
    """``MODULE:ATTR`` or ``path/to/file.py:ATTR``: the user's own strategy, workload, model or dataset (both parts
    given; ``hf:NAME`` is a built-in family of models, not a plug-in)."""
    return bool(spec) and all(str(spec).rpartition(":")[::2]) and not str(spec).startswith(HF_PREFIX)


def load_attr(spec: str, flag: str, default: Any = _MISSING) -> Any:
    """The object at ``MODULE:ATTR`` or ``path/to/file.py:ATTR`` (``--strategy``, ``--workload``, ``--model``,
    ``--dataset``: ``flag`` names it in a refusal); ``default`` when the module has no ATTR, given one, else a
    ConfigError. A module is looked for on PYTHONPATH and in the current folder (which the console script leaves
    out); a file is imported once per process (:func:`import_file`). Every refusal is one line naming ``spec``."""
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise ConfigError(f"{flag} {spec!r} is not MODULE:ATTR or path/to/file.py:ATTR (e.g. my_pkg.bench:workload)")
    try:
        if where.endswith(".py") or os.sep in where or "/" in where:
            if not Path(where).is_file():
                raise ConfigError(f"{flag} {spec}: no file {where}; give an existing path/to/file.py")
            module = import_file(Path(where), "dpcompare_plugin_")
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.append(os.getcwd())
            module = importlib.import_module(where)
    except ConfigError:
        raise
    except ModuleNotFoundError as e:
        if not (e.name and where.startswith(e.name)):  # a module the plug-in itself imports is missing
            raise ConfigError(f"{flag} {spec}: importing {where} failed: {one_line(e)}") from None
        raise ConfigError(f"{flag} {spec}: cannot import {where!r} ({one_line(e)}); give a module on PYTHONPATH "
                          "or in this folder, or a path/to/file.py") from None
    except BaseException as e:  # noqa: BLE001  (the plug-in's own code failed while importing)
        raise ConfigError(f"{flag} {spec}: importing {where} failed: {one_line(e)}") from None
    found = getattr(module, attr, default)
    if found is _MISSING:
        raise ConfigError(f"{flag} {spec}: {where} has no {attr!r}")
    return found
