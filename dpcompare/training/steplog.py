"""``OUT/steps.jsonl``: a line per optimizer step and per event, for whoever watches a run as it goes.

Written by the reporting rank of the world as it is now (after an elastic recovery that may be another process
on another host: every line is appended, and the lab's hosts share the file system), one JSON object per line,
each written whole with one ``write`` and flushed::

    {"event": "start", "t": 1795524621.6, "step": 0, "world_size": 3, "resumed_from": null}
    {"step": 1, "t": 1795524622.0, "world_size": 3, "samples": 96}
    {"event": "commit", "t": ..., "step": 10}          (or "checkpoint": a file was written at that step)
    {"event": "reset", "t": ..., "step": 10, "world_size": 2}     (Horovod Elastic rolled back to step 10)

``t`` is the wall clock (``time.time()``), comparable across the processes of one machine or a synchronised
cluster. ``compare --fault`` reads it to take a host down at a step, and afterwards to measure the pause, the
steps redone and the world size over time (:mod:`dpcompare.compare.fault_runs`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpcompare.files import STEP_LOG, append_json_line


class StepLog:
    """Appends lines to ``OUT/steps.jsonl`` while ``enabled`` (only the reporting rank's lines are written)."""

    def __init__(self, out: Path, enabled: bool) -> None:
        self.path, self.enabled = Path(out) / STEP_LOG, enabled

    def write(self, main: bool, **fields: Any) -> None:
        """One line ``{**fields, "t": now}``, when enabled and ``main`` (this rank reports now)."""
        if not (self.enabled and main):
            return
        append_json_line(self.path, fields)


def read_step_log(path: Path) -> list[dict[str, Any]]:
    """The lines of a step log written so far (a last line still being written is left out)."""
    rows = []
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows
