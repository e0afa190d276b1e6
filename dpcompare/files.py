"""Shared names of what dpcompare writes, and the one atomic writer every file goes through."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

#: the phases of one training step, timed under every strategy (summary.json ``timing.phases_ms``)
PHASES = ("data", "forward", "backward", "optimizer")
#: what a training run writes in OUT (a folder holding one of them holds a run)
RUN_FILES = ("metrics.jsonl", "summary.json")
#: a comparison's results, and the version of their schema (docs/results-schema.md)
RESULTS = "results.json"
SCHEMA = 2
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
