#!/usr/bin/env bash
# Horovod's own PyTorch examples through the way out: for each of the six, `dpcompare migrate` writes its DDP
# port, the port compiles, it runs (torchrun, 2 processes on this machine) and, for the three plain training
# scripts, `dpcompare parity --script` agrees between real Horovod, the native layer and the port; the elastic
# MNIST example's port loses a host in a 2-host lab (needs root) and finishes with the metric of the run without
# the fault. Prints a table: example, port written, compiles, runs, parity, a host lost. The examples are read where they lie in a Horovod
# checkout (never copied here); their data is a tiny stand-in made in a temporary folder (MNIST in torchvision's
# raw layout, an ImageFolder tree): no network.
#
#   git clone --branch v0.28.1 https://github.com/horovod/horovod /tmp/horovod
#   bash bench/horovod_examples.sh /tmp/horovod
#
# Knobs: NP (2), RUN_TIMEOUT (900: seconds per run), OUT (a temporary folder: ports, logs, parity runs), ONLY
# (a comma list of example names, e.g. ONLY=pytorch_mnist,pytorch_lightning_mnist). Real Horovod
# (`make setup` builds it) is needed for the horovod arm of parity; without it parity compares native and the
# port and says so. The Lightning example needs Lightning 2 (`pip install -e '.[lightning]'`).
# Nothing here is timed: it checks, it does not measure.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
if [ $# -ne 1 ] || [ ! -d "$1/examples/pytorch" ]; then
  echo "usage: bash bench/horovod_examples.sh HOROVOD_DIR (a Horovod checkout: HOROVOD_DIR/examples/pytorch/ missing)" >&2
  exit 2
fi
exec "$VENV/bin/python" "$ROOT/bench/horovod_examples.py" "$1"
