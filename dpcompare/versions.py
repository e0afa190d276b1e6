"""dpcompare's own version, and the library versions recorded in summaries and checkpoints."""

from __future__ import annotations

import functools
import platform
import shutil
import subprocess
from importlib import metadata

#: dpcompare's version (``dpcompare.__version__``, ``dpcompare --version``, setup.cfg's ``attr:``); ``.devN`` until
#: released
__version__ = "0.3.0.dev0"
#: where the documentation lives, wherever dpcompare is installed (mkdocs.yml's ``site_url``; tests check they match)
DOCS_URL = "https://dpcompare.github.io/dpcompare/"


def docs_page(page: str, anchor: str = "") -> str:
    """The address of docs/``page``.md on the documentation site (``anchor``: a heading's id), for help and errors
    that point a user at a page: ``docs/*.md`` paths do not ship in a wheel."""
    return f"{DOCS_URL}{page.removesuffix('.md')}/" + (f"#{anchor}" if anchor else "")


def _dist(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def mpi_version() -> str | None:
    """First line of ``mpirun --version`` (e.g. "mpirun (Open MPI) 4.1.4"), or None without MPI."""
    exe = shutil.which("mpirun")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    return lines[0] if lines else None


def versions() -> dict[str, str | None]:
    import torch  # here, not at the top: dpcompare --help loads this module

    return {"dpcompare": __version__, "python": platform.python_version(), "torch": str(torch.__version__),
            "horovod": _dist("horovod"), "mpi": mpi_version(), "mpi4py": _dist("mpi4py"), "numpy": _dist("numpy")}
