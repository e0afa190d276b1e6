"""The documentation site builds from the repository alone, with every link and reference resolved."""

from __future__ import annotations

import re
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


def test_every_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text().split("nav:")[1].split("plugins:")[0]
    pages = sorted(p.name for p in (ROOT / "docs").iterdir() if p.suffix in (".md", ".ipynb"))
    assert [p for p in pages if f": {p}\n" not in nav] == []
    for page in ("troubleshooting.md", "choosing.md", "cli.md", "install.md", "gpu.md", "trackers.md"):
        assert page in pages


def test_the_project_files_a_user_looks_for() -> None:
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text  # the whole text, not a pointer to it
    changelog = (ROOT / "CHANGELOG.md").read_text()  # Keep a Changelog: Unreleased first, then dated versions
    assert changelog.index("## [Unreleased]") < changelog.index("## [0.1.2] - 2026-11-24")
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    assert "bench/quiet.sh" in contributing and "docs/layout.md" in contributing
    gpu_status = "never on two or more"  # one H100 ran bench/gpu_check.sh; multi-GPU never ran
    assert gpu_status in (ROOT / "docs" / "gpu.md").read_text()
    for page in ("README.md", "docs/getting-started.md"):  # they link to the one status, not claim their own
        assert "gpu.md" in (ROOT / page).read_text()


def test_remeasure_writes_its_section_into_the_measurements_page() -> None:
    import datetime
    import importlib.util

    spec = importlib.util.spec_from_file_location("remeasure_doc", ROOT / "bench" / "remeasure_doc.py")
    doc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(doc)
    when = datetime.datetime(2026, 11, 26, 12, 0)
    log = "\x1b[1m== demo\x1b[0m\n[quiet] quiet: load average 0.31 0.40 0.52 (waited 0 s)\nhorovod 20 % faster\n"
    page = doc.update("# Measurements\n", "demo", doc.block("demo", log, when))
    assert "### `demo`, 2026-11-26 12:00 UTC" in page and "- `quiet: load average 0.31" in page
    assert "\x1b" not in page and page.count(doc.HEADING) == 1
    from test_claims import quoted_measurements  # the block's log is not read as figures the page quotes

    assert quoted_measurements(page) == []
    again = doc.update(page, "demo", doc.block("demo", log.replace("20", "21"), when))
    assert "21 % faster" in again and "20 % faster" not in again and again.count("remeasure:demo -->") == 2
    assert doc.update(again, "suite", doc.block("suite", "690 passed", when)).count("<!-- /remeasure:") == 2
    real = (ROOT / "docs" / "measurements.md").read_text()
    assert doc.HEADING in real


def test_the_docs_address_is_the_sites_and_every_page_it_names_exists() -> None:
    import configparser

    from dpcompare import versions

    site_url = re.search(r"^site_url: *(\S+)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert site_url and site_url.group(1) == versions.DOCS_URL
    assert versions.docs_page("lab.md", "x") == f"{versions.DOCS_URL}lab/#x"
    named = set()
    for path in (ROOT / "dpcompare").rglob("*.py"):
        named |= set(re.findall(r"docs_page\(['\"]([\w-]+)", path.read_text()))
    assert named and sorted(n for n in named if not (ROOT / "docs" / f"{n}.md").is_file()) == []
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    meta = cfg["metadata"]
    assert meta["version"] == "attr: dpcompare.versions.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+)?", versions.__version__)
    assert versions.DOCS_URL in meta["project_urls"]
    for strategy in ("DDP", "Horovod", "ZeRO-1", "FSDP2"):
        assert strategy in meta["description"]
    for classifier in ("License :: OSI Approved :: Apache Software License", "Operating System :: POSIX :: Linux",
                       "Programming Language :: Python :: 3.10", "Development Status ::"):
        assert classifier in meta["classifiers"]



def test_help_points_at_pages_that_ship_nowhere_but_the_site() -> None:
    from dpcompare import cli

    parser = cli.build_parser()
    texts = [parser.format_help()] + [sp.format_help() for sp in cli.subcommands(parser)]
    for text in texts:
        assert not re.search(r"docs/[\w-]+\.md|bench/\w+\.py", text), text[:200]
        assert "pip install 'dpcompare[" not in text
