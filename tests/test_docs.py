"""The documentation site builds from the repository alone, with every link and reference resolved."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, missing


def test_docs_site_builds_strict(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        missing("mkdocs (the dev extra: pip install -e '.[dev]')")
    p = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "tutorial" / "index.html").is_file()  # the notebook, rendered
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    assert "Workload" in reference and "TrainConfig" in reference  # generated from docstrings


@pytest.mark.parametrize("page", ["README.md"])
def test_readme_is_a_front_door(page: str) -> None:
    lines = (ROOT / page).read_text().splitlines()
    assert len(lines) <= 150, f"{page} has {len(lines)} lines; depth belongs in docs/"
