"""Installing dpcompare into an environment that already has torch, as on a cluster after ``module load``.

The "existing environment" is a fresh venv whose torch (and the rest of what torch and dpcompare need) comes
from a folder outside it, put on its path by a .pth file, the way a site module puts its PyTorch on
PYTHONPATH. The folder holds links into this test's own environment, minus what each test leaves out
(Horovod, torchvision): no download, no copy of torch, pip runs with no index and no configuration at all.
"""

from __future__ import annotations

import configparser
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from conftest import ROOT, horovod_problem, missing, mpi_env, needs_mpi, run

SOURCE = ("dpcompare", "setup.cfg", "pyproject.toml", "README.md")


def existing_env(tmp: Path, leave_out: set[str]) -> Path:
    """A venv seeing this environment's distributions but ``leave_out`` (and dpcompare, pip) → its python."""
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    base = tmp / "site-module"
    base.mkdir()
    skip = {"dpcompare", "pip", *leave_out}
    for dist in md.distributions(path=[str(site)]):
        if (dist.metadata["Name"] or "").lower() in skip:
            continue
        for top in {f.parts[0] for f in dist.files or ()}:
            if top in ("..", "__pycache__") or top.endswith(".pth") or not (site / top).exists():
                continue
            if not (base / top).exists():
                (base / top).symlink_to(site / top)
    env = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    [env_site] = (env / "lib").glob("python3*/site-packages")
    (env_site / "site-module.pth").write_text(f"{base}\n")
    return env / "bin" / "python"


def clean_env(env_python: Path) -> dict[str, str]:
    """What a user's shell in that venv has: its bin first, no PYTHONPATH to this checkout, no pip config."""
    env = mpi_env({"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "COLUMNS": "200"})
    env.pop("PYTHONPATH", None)
    env["PATH"] = f"{env_python.parent}{os.pathsep}{env['PATH']}"
    return env


def pip_install_here(env_python: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    """``pip install .`` (dependencies resolved, none downloadable) of a copy of this checkout."""
    src = tmp / "src"
    src.mkdir()
    for name in SOURCE:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, src / name)
    return run([sys.executable, "-m", "pip", "--python", str(env_python), "install", "--no-index",
                "--no-build-isolation", str(src)], env=clean_env(env_python), timeout=300)


def versions_in(env_python: Path, *names: str) -> dict[str, str | None]:
    code = ("import importlib.metadata as md, json, sys\n"
            "def v(n):\n    try: return md.version(n)\n    except md.PackageNotFoundError: return None\n"
            "import torch\nprint(json.dumps({'torch_file': torch.__file__, 'torch_build': torch.__version__, **{n: "
            "v(n) for n in sys.argv[1:]}}))")
    return json.loads(run([str(env_python), "-c", code, *names], env=clean_env(env_python)).stdout)


def test_install_requires_pin_no_torch_build():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    reqs = [r.strip() for r in cfg["options"]["install_requires"].splitlines() if r.strip()]
    torch_reqs = [r for r in reqs if r.startswith("torch")]
    assert torch_reqs == ["torch>=2.1"] and not any("torchvision" in r or "horovod" in r for r in reqs)


@needs_mpi
def test_pip_install_keeps_torch_and_doctor_says_what_is_missing(tmp_path):
    py = existing_env(tmp_path, {"horovod", "torchvision"})
    before = versions_in(py, "torch")
    assert before["torch"] == md.version("torch") and "site-module" in before["torch_file"]

    pip_install_here(py, tmp_path)
    after = versions_in(py, "torch", "dpcompare", "horovod")
    assert after["torch"] == before["torch"] and after["torch_file"] == before["torch_file"]
    assert after["dpcompare"] and after["horovod"] is None
    env = clean_env(py)
    dpc = str(py.parent / "dpcompare")
    info = json.loads(run([dpc, "doctor", "--json"], env=env).stdout)
    assert info["strategies"]["horovod"]["installed"] is False and info["strategies"]["ddp"]["installed"]
    hints = {m["what"]: m["hint"] for m in info["missing"]}
    assert "scripts/setup.sh" in hints["strategy horovod"] and "module load" in hints["strategy horovod"]
    assert f"torch=={before['torch']}'" in next(h for w, h in hints.items() if w.startswith("torchvision"))
    assert info["datasets"]["digits"] == "ready" and info["datasets"]["mnist"] == "needs torchvision"
    assert "strategy horovod" in run([dpc, "doctor"], env=env).stdout

    out = tmp_path / "ddp"
    p = run(["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", dpc, "train", "--strategy", "ddp",
             "--model", "mlp", "--width", "32", "--dataset", "digits", "--epochs", "1", "--max-steps", "6",
             "--warmup-steps", "2", "--threads", "1", "--trackers", "none", "--progress", "none", "--out", str(out)],
            env=env)
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["world_size"] == 2 and summary["steps"] == 6 and summary["versions"]["torch"] == before["torch_build"]
    )
    assert p.returncode == 0


def test_pip_install_beside_torchvision_and_horovod_keeps_them(tmp_path):
    if (problem := horovod_problem()) is not None:
        missing(problem)
    py = existing_env(tmp_path, set())
    before = versions_in(py, "torch", "torchvision", "horovod")
    pip_install_here(py, tmp_path)
    after = versions_in(py, "torch", "torchvision", "horovod")
    assert after == before and before["horovod"] and before["torchvision"]
    info = json.loads(run([str(py.parent / "dpcompare"), "doctor", "--json"], env=clean_env(py)).stdout)
    assert info["strategies"]["horovod"]["installed"] and info["datasets"]["mnist"] == "ready"


def test_gpu_check_without_a_gpu_says_so(tmp_path):
    env = {**mpi_env(), "GPU_OUT": str(tmp_path / "gc"), "PYTHON": sys.executable,
           "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh")], capture_output=True, text=True, timeout=120,
                       env=env)
    assert p.returncode == 0 and "no GPU" in p.stdout, p.stdout + p.stderr
    assert not (tmp_path / "gc").exists()  # nothing set up, nothing run
