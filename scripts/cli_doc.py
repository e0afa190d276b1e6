"""Write docs/cli.md from dpcompare's own parsers (``--check``: exit 1 when the page differs from them)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dpcompare.cli import markdown  # noqa: E402
from dpcompare.files import atomic_write_text  # noqa: E402

PAGE = ROOT / "docs" / "cli.md"

if __name__ == "__main__":
    text = markdown()
    if "--check" in sys.argv[1:]:
        same = PAGE.is_file() and PAGE.read_text() == text
        print(f"{PAGE}: {'up to date' if same else 'differs from the parsers; run python scripts/cli_doc.py'}")
        sys.exit(0 if same else 1)
    atomic_write_text(PAGE, text)
    print(f"wrote {PAGE}")
