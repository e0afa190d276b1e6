"""Put one ``bench/remeasure.sh`` section's output into docs/measurements.md, with its date and the machine's load.

    python bench/remeasure_doc.py SECTION LOG [PAGE]

The page keeps one block per section between ``<!-- remeasure:SECTION -->`` and ``<!-- /remeasure:SECTION -->``
under its "Latest remeasure" heading; a section measured again replaces its block, the others stay.
"""

from __future__ import annotations

import datetime
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dpcompare.files import atomic_write_text  # noqa: E402

HEADING = "## Latest remeasure"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def block(section: str, log: str, when: datetime.datetime) -> str:
    """The section's block: a heading with its date and the quiet check's lines (as code: they are a log, not
    figures the page quotes), then the output as it was."""
    text = ANSI.sub("", log).strip()
    quiet = [line.removeprefix("[quiet] ") for line in text.splitlines() if line.startswith("[quiet]")]
    body = "\n".join(line for line in text.splitlines() if not line.startswith("[quiet]"))
    return (f"<!-- remeasure:{section} -->\n### `{section}`, {when:%Y-%m-%d %H:%M} UTC\n\n"
            + "".join(f"- `{q}`\n" for q in quiet) + f"\n```text\n{body}\n```\n<!-- /remeasure:{section} -->")


def update(page: str, section: str, new: str) -> str:
    """``page`` with ``section``'s block replaced by ``new`` (added under the heading when it is not there)."""
    pattern = re.compile(rf"<!-- remeasure:{re.escape(section)} -->.*?<!-- /remeasure:{re.escape(section)} -->",
                         re.S)
    if pattern.search(page):
        return pattern.sub(lambda _: new, page)
    if HEADING not in page:
        page = page.rstrip() + f"\n\n{HEADING}\n\nWhat `bench/remeasure.sh` printed the last time each section ran " \
               "(it writes these blocks itself; the pages above quote them).\n"
    return page.rstrip() + "\n\n" + new + "\n"


if __name__ == "__main__":
    section, log = sys.argv[1], Path(sys.argv[2]).read_text(errors="replace")
    page = Path(sys.argv[3]) if len(sys.argv) > 3 else ROOT / "docs" / "measurements.md"
    now = datetime.datetime.now(datetime.timezone.utc)
    atomic_write_text(page, update(page.read_text(), section, block(section, log, now)))
    print(f"remeasure: {section} → {page}")
