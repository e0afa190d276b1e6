# Horovod from the PyPI sdist, built for the machine it is on; sourced by scripts/setup.sh, which defines
# VPY, CACHE, VENV, HOROVOD_VERSION, HOROVOD_GPU (auto, 1, 0), CMAKE_WHEEL and pipq/begin/done_/say/die.
#
# * NCCL GPU operations only when a GPU is visible (nvidia-smi, /dev/nvidia*, torch.cuda) or asked for
#   (DPCOMPARE_HOROVOD_GPU=1: a GPU cluster's login node). They need torch's CUDA build, a CUDA toolkit
#   (CUDA_HOME, else /usr/local/cuda) and pip's nvidia-nccl package.
# * Otherwise a CPU build: MPI + Gloo (horovodrun --gloo and Horovod Elastic need Gloo), and no CUDA code at all,
#   even when torch is a CUDA build and a CUDA toolkit happens to be installed (Horovod's CMake would otherwise
#   compile its CUDA kernels for every GPU architecture, which takes minutes and serves nothing here).
# * Both: TensorFlow and MXNet left out, every core compiling, ccache used when installed (its cache under
#   $CACHE/ccache, so a rebuild for another torch reuses what did not change).

#: minutes the build takes on 2 quiet cores (the estimate printed first; scaled by the cores there are)
HVD_MINUTES_CPU=${HVD_MINUTES_CPU:-2}
HVD_MINUTES_NCCL=${HVD_MINUTES_NCCL:-3}

gpu_visible() {  # gpu_visible TORCH_GPUS: 0 when the driver, a device file or torch shows an NVIDIA GPU
  if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then return 0; fi
  compgen -G '/dev/nvidia[0-9]*' >/dev/null && return 0
  [ "${1:-0}" -gt 0 ]
}

cuda_toolkit() {  # the CUDA toolkit to build against (CUDA_HOME, else /usr/local/cuda), or nothing
  local c
  for c in "${CUDA_HOME:-}" /usr/local/cuda; do
    [ -n "$c" ] && [ -x "$c/bin/nvcc" ] && { echo "$c"; return; }
  done
}

build_estimate() {  # build_estimate MINUTES_ON_2_CORES: "4 min on 2 cores" scaled to this machine
  awk -v m="$1" -v n="$(nproc)" 'BEGIN { t = m * 2 / (n < 2 ? 2 : n); if (t < 1) t = 1;
    printf "%d min on %d core%s", t + 0.5, n, n == 1 ? "" : "s" }'
}

horovod_plan() {  # which build this machine gets: sets HVD_WHEELDIR (its cache), HVD_OPS, HVD_KEY, HVD_CUDA, HVD_NCCL
  local key torch_cuda nccl_dir torch_gpus cuda_home="" ops=cpu mpi_key=""
  # What torch brings: its version, whether it is a CUDA build, pip's NCCL package if any, GPUs it sees.
  read -r key torch_cuda nccl_dir torch_gpus < <("$VPY" -W ignore - <<'EOF'
import os, sys, torch
nccl = ""
try:
    import nvidia.nccl as n
    nccl = os.path.dirname(n.__file__) if n.__file__ else list(n.__path__)[0]
except ImportError:
    pass
gpus = torch.cuda.device_count() if torch.version.cuda else 0
print(f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}", torch.version.cuda or "-", nccl or "-", gpus)
EOF
)
  local want=0
  case "$HOROVOD_GPU" in 1) want=1 ;; auto) gpu_visible "$torch_gpus" && want=1 ;; esac
  if [ "$want" = 1 ]; then
    [ "$torch_cuda" != "-" ] && cuda_home=$(cuda_toolkit)
    if [ -n "$cuda_home" ] && [ "$nccl_dir" != "-" ] && [ -e "$nccl_dir/include/nccl.h" ]; then
      ops=nccl
    elif [ "$HOROVOD_GPU" = 1 ]; then
      die "DPCOMPARE_HOROVOD_GPU=1 needs torch's CUDA build (torch.version.cuda: $torch_cuda), a CUDA toolkit (CUDA_HOME or /usr/local/cuda: ${cuda_home:-none}) and pip's nvidia-nccl package (${nccl_dir})"
    else
      say "a GPU is visible but torch's CUDA build, a CUDA toolkit or NCCL is missing: building Horovod for the CPU"
    fi
  fi
  # A wheel built against PyPI's Open MPI links its libmpi: keyed apart from one built against the OS's.
  [ "$(command -v mpicc)" = "$VENV/bin/mpicc" ] && mpi_key="-mpiwheel"
  # "cpu-mpi-gloo": the CPU build without CUDA code (earlier "cpu" wheels could hold CUDA kernels).
  HVD_WHEELDIR="$CACHE/wheels/horovod-$HOROVOD_VERSION-$key-$([ "$ops" = nccl ] && echo nccl || echo cpu-mpi-gloo)$mpi_key"
  HVD_OPS=$ops HVD_KEY=$key HVD_CUDA=$cuda_home HVD_NCCL=$nccl_dir
}

horovod_cached() { ls "$HVD_WHEELDIR"/horovod-*.whl >/dev/null 2>&1; }

horovod_build_deps() {  # what the build imports, installed before anything else may run pip alongside it
  pipq numpy cloudpickle psutil pyyaml packaging setuptools wheel
}

horovod_build() {  # the wheel of horovod_plan's build into HVD_WHEELDIR
  local what="MPI + Gloo, CPU only" minutes=$HVD_MINUTES_CPU
  [ "$HVD_OPS" = nccl ] && { what="MPI + Gloo + NCCL GPU operations"; minutes=$HVD_MINUTES_NCCL; }
  begin "building Horovod $HOROVOD_VERSION for $HVD_KEY ($what; cached in $HVD_WHEELDIR)" "$(build_estimate "$minutes")"
  build_horovod "$HVD_OPS" "$HVD_CUDA" "$HVD_NCCL"
  done_ "$(du -h "$HVD_WHEELDIR"/horovod-*.whl | cut -f1) wheel"
}

patch_source() {  # patch_source SRC OPS: the C++ standard torch needs; for a CPU build, no CUDA anywhere
  local src=$1
  # torch >= 2.1 headers need C++17 (Horovod 0.28.1 asks for C++14); torch >= 2.15's ATen needs C++20 in the
  # torch extension.
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  if "$VPY" -c 'import sys, torch; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(v < (2, 15))'; then
    sed -i 's/set(CMAKE_CXX_STANDARD 17)/set(CMAKE_CXX_STANDARD 20)/' "$src/horovod/torch/CMakeLists.txt"
  fi
  # Horovod builds RelWithDebInfo (-O3 -g): the same optimised code as Release plus debug information, which
  # costs compile time and makes the wheel several times larger. Release builds the same code without it;
  # DPCOMPARE_HOROVOD_DEBUGINFO=1 keeps Horovod's choice (for a debugger on a crash).
  if [ "${DPCOMPARE_HOROVOD_DEBUGINFO:-0}" != 1 ]; then
    sed -i "s/else 'RelWithDebInfo'$/else 'Release'/" "$src/setup.py"
    grep -q "else 'Release'$" "$src/setup.py" || die "Horovod $HOROVOD_VERSION's setup.py is not the one scripts/horovod-build.sh patches"
  fi
  # Newer GCCs (13+) no longer pull <string> and <stdexcept> in through other headers (seen on a GPU image):
  # include them where Horovod 0.28.1 uses them.
  grep -q '^#include <string>' "$src/horovod/common/group_table.h" \
    || sed -i '0,/^#include/s//#include <string>\n#include/' "$src/horovod/common/group_table.h"
  grep -q '^#include <stdexcept>' "$src/horovod/common/common.h" \
    || sed -i '0,/^#include/s//#include <stdexcept>\n#include/' "$src/horovod/common/common.h"
  [ "$2" = cpu ] || return 0
  # Horovod's CMake enables CUDA whenever it finds nvcc, and its torch extension adds the CUDA operations and
  # kernels (and links cudart) whenever torch is a CUDA build and torch finds a toolkit: neither for the CPU.
  sed -i -e 's/^check_language(CUDA)$/# CPU build: CUDA not looked for/' \
         -e 's/^if(NOT CMAKE_CUDA_COMPILER)$/if(FALSE)/' -e 's/^if(CMAKE_CUDA_COMPILER)$/if(FALSE)/' "$src/CMakeLists.txt"
  sed -i 's/print(True if ((torch.version.cuda is not None) and (CUDA_HOME is not None)) else False)/print(False)/' \
    "$src/cmake/Modules/FindPytorch.cmake"
  [ "$(grep -c '^if(FALSE)$' "$src/CMakeLists.txt")" = 2 ] && grep -q 'print(False)' "$src/cmake/Modules/FindPytorch.cmake" \
    || die "Horovod $HOROVOD_VERSION's CMakeLists.txt is not the one scripts/horovod-build.sh patches for a CPU build"
}

build_horovod() {  # build_horovod OPS CUDA_HOME NCCL_DIR: the wheel into HVD_WHEELDIR
  local ops=$1 cuda_home=$2 nccl_dir=$3 work src path jobs
  HVD_WORK=$(mktemp -d)
  trap 'rm -rf "$HVD_WORK"' EXIT
  work=$HVD_WORK
  "$VPY" -m pip download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work" \
    2> >(grep -v "is ignored: it is neither" >&2)
  tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
  src="$work/horovod-$HOROVOD_VERSION"
  patch_source "$src" "$ops"
  jobs=$(nproc)
  # CMAKE_POLICY_VERSION_MINIMUM: CMake 4 (pip's, a GPU image's) refuses the bundled projects' old minimums.
  local build_env=(CMAKE_POLICY_VERSION_MINIMUM=3.5 HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1
                   HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
                   "MAKEFLAGS=-j$jobs" "CMAKE_BUILD_PARALLEL_LEVEL=$jobs")
  # ccache (Horovod's CMake uses it when installed): a cache that outlives the temporary source folder.
  command -v ccache >/dev/null && build_env+=("CCACHE_DIR=$CACHE/ccache" "CCACHE_BASEDIR=$work" CCACHE_NOHASHDIR=1)
  # Use the system CMake (3.x): pip's CMake 4 rejects the bundled gloo. The venv's bin goes last: its
  # mpicc (PyPI's Open MPI) and cmake<4 (installed here when the system has none) only when nothing else is.
  [ "$CMAKE_WHEEL" = 1 ] && { pipq "cmake>=3.13,<4" || die "cmake not found: install cmake (>= 3.13, < 4) and re-run"; }
  path=$(echo "$PATH" | tr ':' '\n' | grep -v "^$VENV/bin\$" | paste -sd:):$VENV/bin
  if [ "$ops" = nccl ]; then
    # The nvcc on PATH may be a wrapper that makes torch guess CUDA_HOME wrongly: name the toolkit.
    path="$cuda_home/bin:$path"
    # Horovod wants NCCL_HOME/{include,lib/libnccl.so}; pip's package ships libnccl.so.2 only.
    mkdir -p "$work/nccl/lib"
    ln -s "$nccl_dir/include" "$work/nccl/include"
    ln -s "$nccl_dir/lib/libnccl.so.2" "$work/nccl/lib/libnccl.so"
    build_env+=("CUDA_HOME=$cuda_home" HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED
                "HOROVOD_NCCL_HOME=$work/nccl")
    # Kernels only for the GPUs this machine has (every architecture otherwise: minutes more), unless set.
    local ccs
    ccs=$("$VPY" -c 'import torch; print(",".join(sorted({"%d%d" % torch.cuda.get_device_capability(i)
          for i in range(torch.cuda.device_count())})))' 2>/dev/null)
    [ -n "${HOROVOD_BUILD_CUDA_CC_LIST:-}" ] || [ -z "$ccs" ] || build_env+=("HOROVOD_BUILD_CUDA_CC_LIST=$ccs")
  else
    build_env+=(HOROVOD_WITHOUT_NVTX=1)  # NVTX ranges annotate GPU profiles only
  fi
  local TIMEFORMAT="%R %U %S" ok=1
  { time env PATH="$path" "${build_env[@]}" \
      "$VPY" -m pip wheel -q --no-build-isolation --no-deps -w "$work/dist" "$src" >"$work/build.log" 2>&1 || ok=0; } \
    2>"$work/time.txt"
  [ "$ok" = 1 ] \
    || { mkdir -p "$CACHE"; cp "$work/build.log" "$CACHE/horovod-build.log"
         { grep -A12 "CMake Error" "$work/build.log" | head -40; tail -30 "$work/build.log"; } >&2 || true
         die "Horovod build failed (log above; all of it in $CACHE/horovod-build.log)"; }
  mkdir -p "$HVD_WHEELDIR"
  cp "$work"/dist/horovod-*.whl "$HVD_WHEELDIR/"
  # What the build took, and on what: the figure the estimate above comes from.
  read -r wall user sys <"$work/time.txt"
  printf 'built in %s (compiler: %.0f s wall, %.0f s CPU) on %s cores (%s), load average at the end %s\n' \
    "$(since "$STEP_T")" "$wall" "$(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }')" "$(nproc)" \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')" "$(cut -d' ' -f1-3 /proc/loadavg)" \
    >"$HVD_WHEELDIR/build.txt"
}
