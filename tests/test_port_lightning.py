"""The Lightning pass of the port (dpcompare/native/port_lightning.py) on a Lightning 1.x script of our own in the
idioms of Horovod's pytorch_lightning_mnist.py (tests/lightning_hvd.py): the port is written and compiles, says
what it changed, leaves other scripts alone; with Lightning 2 installed it trains one tiny epoch under torchrun
at 2 CPU processes with strategy ddp (``import horovod.torch`` still answered by the native layer: the Horovod
calls outside Lightning are the other passes')."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import libcst as cst
import pytest

from dpcompare.launch.elastic import executable
from dpcompare.native.port_lightning import port_lightning

from conftest import DPCOMPARE, ROOT

SCRIPT = ROOT / "tests" / "lightning_hvd.py"


def _ported() -> tuple[str, list[str]]:
    tree, notes = port_lightning(cst.parse_module(SCRIPT.read_text()))
    return tree.code, notes


def test_the_port_is_lightning_2s_ddp_and_compiles() -> None:
    code, notes = _ported()
    compile(code, "port.py", "exec")
    assert "from lightning.pytorch import Callback, LightningModule, Trainer" in code
    assert "Trainer(accelerator='horovod'," not in code and "gpus=0" not in code
    assert 'Trainer(strategy="ddp",\n                      accelerator="gpu" if (0) else "cpu",' in code
    assert "def on_validation_epoch_end(self):\n        outputs, self.validation_step_outputs = " in code
    assert "self.validation_step_outputs.append(output)" in code
    assert "self.log_dict({'val_loss': avg_loss}, sync_dist=True)" in code
    assert "self.log_dict({'train_loss': loss})\n" in code
    assert "def lightning1_on_epoch_end(self, trainer, model):" in code
    assert "def lightning1_on_init_start" in code and "def on_init_start" not in code
    assert any("on_epoch_end" in n for n in notes) and any("sync_dist=True" in n for n in notes)
    kept = SCRIPT.read_text().splitlines()[:6]  # the docstring and layout kept
    assert code.splitlines()[:6] == kept


def test_a_trainer_on_one_line_stays_on_one_line() -> None:
    src = "import os\nfrom pytorch_lightning import Trainer\nt = Trainer(max_epochs=1, accelerator='horovod')\n"
    code = port_lightning(cst.parse_module(src))[0].code
    assert code.splitlines()[2] == (
        't = Trainer(max_epochs=1, devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")), '
        'num_nodes=int(os.environ.get("WORLD_SIZE", "1")) '
        '// int(os.environ.get("LOCAL_WORLD_SIZE", "1")), strategy="ddp")')


def test_a_script_without_lightning_is_left_alone() -> None:
    src = "import horovod.torch as hvd\nhvd.init()\nclass Callback:\n    def on_epoch_end(self): pass\n"
    tree, notes = port_lightning(cst.parse_module(src))
    assert tree.code == src and notes == []


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="Lightning 2 is not installed "
                    "(pip install -e '.[lightning]')")
def test_the_port_trains_one_epoch_with_ddp_on_two_processes(tmp_path: Path) -> None:
    code, _ = _ported()
    port = tmp_path / "port.py"
    port.write_text(code)
    out = tmp_path / "result.json"
    cmd = [executable("torchrun"), "--standalone", "--nproc-per-node=2", "--no-python", DPCOMPARE, "script",
           "--threads", "1", "--", "python", str(port), str(out)]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["size"] == 2 and result["average_rank"] == 0.5  # the metric helper averaged over both ranks
    assert result["epoch_ends"] == 2  # Lightning 1's on_epoch_end: the training and the validation epoch's end
    assert result["val_loss"] > 0
