#!/usr/bin/env bash
# Idempotent set-up for dpcompare: Open MPI, .venv, torch, mpi4py, dpcompare (editable), Horovod.
# Re-running it skips whatever is already in place; the Horovod wheel is cached outside the repo.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${DPCOMPARE_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
TORCH_SPEC=${DPCOMPARE_TORCH:-torch==2.13.0}     # any torch>=2.1 works; override on other machines
HOROVOD_VERSION=0.28.1
CACHE=${DPCOMPARE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dpcompare}
WITH_HOROVOD=${DPCOMPARE_WITH_HOROVOD:-1}

APT_UPDATED=0
apt_install() {  # apt_install PKG...: as root on Debian/Ubuntu; returns 1 elsewhere
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || return 1
  [ "$APT_UPDATED" = 1 ] || { apt-get update -qq && APT_UPDATED=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

# 1. Open MPI (mpirun + mpicc are needed by mpi4py and Horovod's MPI controller).
if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
  say "installing Open MPI from the OS packages (libopenmpi-dev openmpi-bin)"
  apt_install libopenmpi-dev openmpi-bin || \
    die "mpirun/mpicc not found: install Open MPI (Debian/Ubuntu: 'sudo apt-get install libopenmpi-dev openmpi-bin'; or 'module load openmpi' on a cluster) and re-run"
fi
# iproute2 lets the multi-host test make network namespaces (skipped, with the reason, without it).
command -v ip >/dev/null || apt_install iproute2 || true
command -v cmake >/dev/null || apt_install cmake || die "cmake not found: install cmake (>= 3.13, < 4) and re-run"

# 2. Virtual environment.
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "$PY is older than 3.10"
  say "creating $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
pipq() { "$VPY" -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither" >&2); }

# 3. torch (first, so nothing later pulls a different build), then the package itself.
if ! "$VPY" -c 'import torch' 2>/dev/null; then
  say "installing $TORCH_SPEC"
  pipq "$TORCH_SPEC" || die "could not install $TORCH_SPEC; set DPCOMPARE_TORCH to a torch>=2.1 spec that your index has"
fi
if ! "$VPY" -c 'import dpcompare, mpi4py, pytest, ruff' 2>/dev/null \
   || [ "$ROOT/setup.cfg" -nt "$VENV/.dpcompare-installed" ]; then
  say "installing dpcompare (editable) with its dependencies"
  pipq -e "$ROOT[dev]"
  touch "$VENV/.dpcompare-installed"
fi

# 4. Horovod 0.28.1, built once per (python, torch) and cached.
if [ "$WITH_HOROVOD" = 1 ] && ! "$VPY" -c 'import horovod.torch' 2>/dev/null; then
  key=$("$VPY" -c 'import sys, torch; print(f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}")')
  wheeldir="$CACHE/wheels/horovod-$HOROVOD_VERSION-$key"
  if ! ls "$wheeldir"/horovod-*.whl >/dev/null 2>&1; then
    say "building Horovod $HOROVOD_VERSION for $key (about 6 minutes on 2 cores; cached in $wheeldir)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    pipq cloudpickle psutil pyyaml packaging setuptools wheel
    "$VPY" -m pip download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work"
    tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"
    # torch >= 2.1 headers need C++17; Horovod 0.28.1 asks for C++14.
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    # Use the system CMake (3.x): pip's CMake 4 rejects the bundled gloo.
    PATH=$(echo "$PATH" | tr ':' '\n' | grep -v "^$VENV/bin\$" | paste -sd:) \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
      "$VPY" -m pip wheel -q --no-build-isolation --no-deps -w "$work/dist" "$src" >"$work/build.log" 2>&1 \
      || { tail -30 "$work/build.log" >&2; die "Horovod build failed (log above)"; }
    mkdir -p "$wheeldir"
    cp "$work"/dist/horovod-*.whl "$wheeldir/"
  fi
  say "installing Horovod from $wheeldir"
  pipq "$wheeldir"/horovod-*.whl
fi

say "ready: $("$VENV/bin/dpcompare" doctor --short 2>/dev/null || echo "$VENV")"
