"""scripts/setup.sh and scripts/horovod-build.sh, in the parts that run in seconds: the choice between Horovod's
CPU and NCCL builds, the source patches (on the lines of Horovod 0.28.1's own files), the estimate, the refusals;
and what `make demo` and `make test` install. The build itself is checked by `make setup` (CI runs it)."""

from __future__ import annotations

import configparser
import re
import subprocess
from pathlib import Path

from dpcompare import doctor

from conftest import ROOT

#: the lines of Horovod 0.28.1's sources that a CPU build patches, as the sdist has them
CMAKELISTS = """set(CMAKE_CXX_STANDARD 14)
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
    find_package(CUDAToolkit)
    if(CUDAToolkit_BIN_DIR)
        check_language(CUDA)
    endif()
endif()
if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
endif()
"""
FIND_PYTORCH = ('execute_process(COMMAND ${PY_EXE} -c "import torch; from torch.utils.cpp_extension import '
                'CUDA_HOME; print(True if ((torch.version.cuda is not None) and (CUDA_HOME is not None)) else '
                'False)"\n')
SETUP_PY = "        config = 'Debug' if self.debug or os.environ.get('HOROVOD_DEBUG') == \"1\" else 'RelWithDebInfo'\n"


def bash(script: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``script`` after sourcing horovod-build.sh with setup.sh's helpers stubbed (die exits 1 with its words)."""
    prelude = (f'VPY=python3; HOROVOD_VERSION=0.28.1\nsay() {{ echo "$*"; }}\ndie() {{ echo "error: $*"; exit 1; }}\n'
               f'. {ROOT}/scripts/horovod-build.sh\n')
    return subprocess.run(["bash", "-c", prelude + script], capture_output=True, text=True, timeout=60, env=env)


def fake_source(tmp: Path) -> Path:
    src = tmp / "horovod-0.28.1"
    (src / "horovod" / "torch").mkdir(parents=True)
    (src / "cmake" / "Modules").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text(CMAKELISTS)
    (src / "horovod" / "torch" / "CMakeLists.txt").write_text("set(CMAKE_CXX_STANDARD 14)\n")
    (src / "cmake" / "Modules" / "FindPytorch.cmake").write_text(FIND_PYTORCH)
    (src / "setup.py").write_text(SETUP_PY)
    return src


def test_a_cpu_build_patches_every_cuda_path_out_and_a_nccl_build_keeps_them(tmp_path: Path) -> None:
    cpu, nccl = fake_source(tmp_path / "cpu"), fake_source(tmp_path / "nccl")
    p = bash(f"patch_source {cpu} cpu && patch_source {nccl} nccl")
    assert p.returncode == 0, p.stdout + p.stderr
    top = (cpu / "CMakeLists.txt").read_text()
    assert not re.search(r"^check_language\(CUDA\)$", top, re.M)  # the one left is inside an if(FALSE)
    assert top.count("if(FALSE)") == 2 and "CMAKE_CXX_STANDARD 17" in top
    assert (cpu / "cmake/Modules/FindPytorch.cmake").read_text().endswith('print(False)"\n')
    assert "else 'Release'" in (cpu / "setup.py").read_text()  # -O3 as before, without -g
    assert (nccl / "CMakeLists.txt").read_text().count("check_language(CUDA)") == 2
    assert "torch.version.cuda is not None" in (nccl / "cmake/Modules/FindPytorch.cmake").read_text()


def test_a_source_that_is_not_the_expected_one_stops_the_build_with_one_line(tmp_path: Path) -> None:
    src = fake_source(tmp_path)
    (src / "CMakeLists.txt").write_text("set(CMAKE_CXX_STANDARD 14)\n")  # another Horovod's file
    p = bash(f"patch_source {src} cpu")
    assert p.returncode == 1 and p.stdout.strip().splitlines()[-1].startswith("error: Horovod 0.28.1's CMakeLists")


def test_a_gpu_is_seen_through_nvidia_smi_or_torch_and_otherwise_not(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin"}
    assert bash("gpu_visible 0", env).returncode == 0
    assert bash("gpu_visible 1", {"PATH": "/usr/bin:/bin"}).returncode == 0  # torch sees one
    device_files = list(Path("/dev").glob("nvidia[0-9]*"))
    no_smi = {"PATH": str(tmp_path / "empty") + ":/bin:/usr/bin"}
    if not device_files and subprocess.run(["bash", "-c", "command -v nvidia-smi"], env=no_smi).returncode != 0:
        assert bash("gpu_visible 0", no_smi).returncode == 1  # this machine: no GPU anywhere


def test_the_build_estimate_scales_with_the_cores() -> None:
    p = bash("HVD_MINUTES_CPU=4; nproc() { echo 2; }; build_estimate 4; echo; nproc() { echo 16; }; build_estimate 4")
    assert p.stdout.split("\n")[:2] == ["4 min on 2 cores", "1 min on 16 cores"]


def test_setup_refuses_a_bad_gpu_setting_in_one_line() -> None:
    p = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "DPCOMPARE_HOROVOD_GPU": "yes", "HOME": "/tmp"})
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "DPCOMPARE_HOROVOD_GPU must be 1" in p.stderr


def test_make_demo_installs_no_dev_extra_and_make_test_does() -> None:
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo: setup$", make, re.M) and re.search(r"^test: setup-dev$", make, re.M)
    assert re.search(r"^docs: setup-dev$", make, re.M) and "DPCOMPARE_EXTRAS=dev bash scripts/setup.sh" in make
    assert re.search(r'^EXTRAS=\$\{DPCOMPARE_EXTRAS-\}$', (ROOT / "scripts" / "setup.sh").read_text(), re.M)
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    core = cfg["options"]["install_requires"]
    for need in ("scikit-learn", "scipy", "mpi4py", "psutil", "rich", "matplotlib", "tensorboard"):
        assert need in core, f"make demo needs {need}"
    for dev in ("pytest", "mkdocs", "wandb", "mlflow", "transformers"):
        assert dev not in core and dev in cfg["options.extras_require"]["dev"]


def test_doctor_names_the_extra_for_hf_models_when_transformers_is_absent() -> None:
    info = {"mpi": {"mpirun": "/usr/bin/mpirun"}, "mpi4py": {"installed": True}, "strategies": {},
            "torchvision": "0.29.2", "trackers": {}, "transformers": None}
    assert {"what": "transformers (--model hf:NAME)", "hint": "pip install -e '.[hf]'"} in doctor.missing(info)
    assert not [m for m in doctor.missing({**info, "transformers": "4.57.1"}) if "transformers" in m["what"]]
