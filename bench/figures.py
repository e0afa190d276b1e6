"""Write what one ``bench/remeasure.sh`` section measured into bench/figures.json, the one file the docs quote.

    python bench/figures.py SECTION LOG [FILE]

Each entry of the file is one measurement: its figures (strings, as a page quotes them) with the date, the
machine and the load that ``bench/quiet.sh`` printed, and the command. A section's figures come from its log:
any line ``figure: KEY = VALUE`` a script prints, and for the sections whose output is another tool's (the
suite's pytest, the demo's verdict) the patterns in ``PATTERNS``. A log without a figure leaves the file alone:
an entry is never re-dated with figures it did not measure. The site reads the file through mkdocs-macros
(``mkdocs.yml``: ``fig``), so a remeasure changes every page that quotes it at the next build.
"""

from __future__ import annotations

import datetime
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dpcompare.files import atomic_write_text  # noqa: E402

FILE = ROOT / "bench" / "figures.json"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
FIGURE = re.compile(r"^figure: (\w+) = (.+)$", re.M)
#: per section, KEY: (pattern, which match): 0 the first, -1 the last (``make test`` runs pytest twice: the suite,
#: then the ``solitary`` tests); a ``_s`` key is a duration in seconds, written as the pages write one
PATTERNS: dict[str, dict[str, tuple[re.Pattern[str], int]]] = {
    "suite": {"tests": (re.compile(r"(\d+) passed"), 0),
              "pytest_s": (re.compile(r"passed[^\n]* in ([\d.]+)s"), 0),
              "solitary_s": (re.compile(r"passed[^\n]* in ([\d.]+)s"), 1),
              "total_s": (re.compile(r"make test: ([\d.]+) s wall"), -1)},
    "demo": {"verdict": (re.compile(r"((?:horovod|ddp|zero|fsdp)\S* [\d.]+ % (?:faster|slower) than \S+ at np=\d+)"),
                         -1),
             "ci": (re.compile(r"at np=\d+ \((95 % CI [^)]*)\)"), -1),
             "blocks": (re.compile(r"^compare: (\d+) blocks in", re.M), -1),
             "comparison_s": (re.compile(r"^compare: \d+ blocks in ([\d.]+) s", re.M), -1),
             "setup": (re.compile(r"ready in (\d+ min \d+ s|[\d.]+ s)"), -1),
             "total_s": (re.compile(r"make demo: ([\d.]+) s wall"), -1)},
    "trackers": {key: (re.compile(rf"^{line}[^\n]*?: ([\d.]+ s) \(median of \d+; ([^)]*)\)", re.M), -1)
                 for key, line in (("wandb_import", "import wandb"), ("wandb_run", "wandb offline run"),
                                   ("mlflow_import", "import mlflow"), ("mlflow_run", "mlflow run"))},
}


def duration(seconds: float) -> str:
    """``649.1`` → ``10 min 49 s``, as the pages write a time."""
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes} min {s} s" if minutes else f"{s} s"


def measured(section: str, log: str) -> dict[str, str]:
    """The figures in ``log``: its ``figure:`` lines and the section's patterns (``*_s`` ones as durations)."""
    text = ANSI.sub("", log)
    values = {k: v.strip() for k, v in FIGURE.findall(text)}
    for key, (pattern, which) in PATTERNS.get(section, {}).items():
        found = pattern.findall(text)
        if len(found) > max(which, -1 - which):
            value = found[which]
            if isinstance(value, tuple):  # a figure and its range: "0.4 s (0.4–0.6)"
                value = f"{value[0]} ({value[1]})"
            values[key.removesuffix("_s")] = duration(float(value)) if key.endswith("_s") else value
    return values


def conditions(log: str) -> dict[str, str]:
    """The machine and the load, from ``bench/quiet.sh``'s lines (a load not quiet says so)."""
    text = ANSI.sub("", log)
    machine = re.search(r"\[quiet\] machine: (\d+ cores), ([^,]+), ([^,]+),", text)
    load = re.search(r"\[quiet\] (quiet|NOT QUIET): load average ([\d.]+)", text)
    out = {}
    if machine:
        cpu = re.sub(r"\s*\d+-Core Processor|\(R\)|\(TM\)|CPU @.*", "", machine.group(2)).strip()
        out["machine"] = f"{machine.group(1)} {cpu}, {machine.group(3)}"
    if load:
        out["load"] = f"{load.group(2)} at the start" + ("" if load.group(1) == "quiet" else " (not quiet)")
    return out


def record(figures: dict, section: str, log: str, when: datetime.datetime) -> dict:
    """``figures`` with ``section``'s entry updated from ``log`` (unchanged when the log measured nothing)."""
    values = measured(section, log)
    if not values:
        return figures
    entry = {**figures.get(section, {}), **conditions(log), **values}
    entry.update(date=f"{when:%Y-%m-%d}", command=f"bash bench/remeasure.sh {section}")
    return {**figures, section: entry}


if __name__ == "__main__":
    section, log = sys.argv[1], Path(sys.argv[2]).read_text(errors="replace")
    path = Path(sys.argv[3]) if len(sys.argv) > 3 else FILE
    old = json.loads(path.read_text())
    new = record(old, section, log, datetime.datetime.now(datetime.timezone.utc))
    if new != old:
        atomic_write_text(path, json.dumps(new, indent=2, ensure_ascii=False) + "\n")
    print(f"figures: {section} → {path}" if new != old else f"figures: {section} measured no figure; {path} unchanged")
