"""bench/quiet.sh from a Python benchmark: wait for a quiet machine and print its facts before measuring."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def wait_for_quiet() -> None:
    """Run bench/quiet.sh; stop the benchmark when the machine stays busy (QUIET_STRICT=0 measures anyway)."""
    rc = subprocess.run(["bash", str(Path(__file__).with_name("quiet.sh"))], check=False).returncode
    if rc != 0:
        sys.exit(f"{Path(sys.argv[0]).name}: the machine is not quiet (bench/quiet.sh exited {rc}); "
                 "figures taken now would measure the other work: rerun later, or QUIET_STRICT=0 to measure anyway")
