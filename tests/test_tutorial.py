"""docs/tutorial.ipynb runs from top to bottom (nbclient), so the tutorial cannot rot."""

import base64

import pytest

from conftest import ROOT, missing, mpi_env, needs_horovod, needs_mpi

pytestmark = [needs_mpi, needs_horovod]


def test_tutorial_notebook_runs(tmp_path, monkeypatch):
    try:
        import nbclient
        import nbformat
    except ImportError as e:
        missing(f"nbclient/nbformat are not installed ({e}); pip install -e '.[dev]'")
    for k, v in mpi_env({"TUTORIAL_OUT": str(tmp_path / "out")}).items():
        monkeypatch.setenv(k, v)  # the kernel inherits this process's environment
    nb = nbformat.read(ROOT / "docs" / "tutorial.ipynb", as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    try:
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(tmp_path)}}).execute()
    except nbclient.exceptions.CellExecutionError as e:  # the cell and its traceback, not nbclient's internals
        pytest.fail(str(e)[-4000:], pytrace=False)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "largest difference: 0.0" in text  # parity: bit-identical losses at np=2
    assert "has the drawn step: True" in text
    pngs = [base64.b64decode(o["data"]["image/png"]) for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    # the images shown are the ones the cells drew, in order: ddp and horovod's timelines, ddp's two widths, the
    # projection (a cell that showed a stale or another file would show other bytes)
    drawn = [tmp_path / "out" / name for name in ("timeline.png", "timeline-wide.png", "predict/prediction.png")]
    assert pngs == [p.read_bytes() for p in drawn] and len(set(pngs)) == 3
    assert (tmp_path / "out" / "compare" / "report.html").is_file()
    assert "falls below 80 % efficiency on 25 Gbit/s" in text  # the tutorial ends with the cluster question
