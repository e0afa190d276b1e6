"""bench/horovod_examples.sh's work: port, compile, run and check Horovod's six PyTorch examples from a checkout.

``python bench/horovod_examples.py HOROVOD_DIR``: for each example, ``dpcompare migrate EXAMPLE --port PORT``,
``py_compile`` of the port, the port run under ``torchrun --standalone`` at NP processes on tiny stand-in data,
for the plain training scripts ``dpcompare parity --script EXAMPLE --strategies horovod,native,ddp
--ddp-script PORT``, and for the elastic MNIST example ``dpcompare compare --script EXAMPLE --strategies
ddp-elastic --lab hosts=2 --fault host=1,at-step=30 --metric avg_accuracy`` (the port on torchrun's elastic agents,
a host lost; needs root for the lab); then a table. Each step's output is kept in OUT/NAME/ (the table says where).
"""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import re
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

BIN = Path(sys.executable).parent
NP = int(os.environ.get("NP", "2"))
RUN_TIMEOUT = float(os.environ.get("RUN_TIMEOUT", "900"))
#: the runs' environment: one thread per rank (several ranks share this machine's cores), torchrun's own store
#: per rendezvous round (docs/elastic.md)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def _mnist(data: Path, work: Path) -> list[str]:
    return ["--epochs", "1", "--batch-size", "8", "--test-batch-size", "8", "--no-cuda", "--data-dir",
            str(data / "mnist")]


def _imagenet(data: Path, work: Path) -> list[str]:
    return ["--train-dir", str(data / "images" / "train"), "--val-dir", str(data / "images" / "val"),
            "--batch-size", "2", "--val-batch-size", "2", "--epochs", "1", "--batches-per-allreduce", "2",
            "--warmup-epochs", "0", "--no-cuda", "--log-dir", str(work / "logs"),
            "--checkpoint-format", str(work / "checkpoint-{epoch}.pth.tar")]


@dataclass(frozen=True)
class Example:
    name: str
    path: str                                      # in the Horovod checkout
    args: Callable[[Path, Path], list[str]]        # (data, work) -> the script's arguments, tiny
    parity: str = ""                               # why there is no parity run ("": there is one)
    own_checkpoints: bool = False                  # resumes from --checkpoint-format when it exists (see _fresh)
    #: a difference migrate names, and the script's arguments that take its cause away: when the port differs,
    #: parity runs again with them, to show the named cause is the whole difference
    cause: tuple[str, tuple[str, ...]] | None = None
    lost_host: bool = False                        # the port survives a lost host in the lab (see lost_host)


EXAMPLES = (
    Example("pytorch_mnist", "examples/pytorch/pytorch_mnist.py", _mnist),
    Example("pytorch_synthetic_benchmark", "examples/pytorch/pytorch_synthetic_benchmark.py",
            lambda d, w: ["--no-cuda", "--model", "resnet18", "--batch-size", "2", "--num-warmup-batches", "1",
                          "--num-batches-per-iter", "1", "--num-iters", "2"]),
    Example("pytorch_imagenet_resnet50", "examples/pytorch/pytorch_imagenet_resnet50.py", _imagenet,
            own_checkpoints=True,
            cause=("broadcast_optimizer_state's zero-gradient step with weight decay", ("--wd", "0"))),
    Example("pytorch_lightning_mnist", "examples/pytorch/pytorch_lightning_mnist.py", _mnist,
            parity="n/a (Trainer(accelerator='horovod') runs on Lightning 1.x only)"),
    Example("pytorch_mnist_elastic", "examples/elastic/pytorch/pytorch_mnist_elastic.py",
            _mnist, parity="n/a (elastic: the lost-host column)", lost_host=True),
    Example("pytorch_imagenet_resnet50_elastic", "examples/elastic/pytorch/pytorch_imagenet_resnet50_elastic.py",
            lambda d, w: [*_imagenet(d, w), "--batches-per-commit", "1"],
            parity="n/a (elastic: compare --fault checks it)"),
)


@dataclass
class Row:
    name: str
    written: str = "-"
    compiles: str = "-"
    runs: str = "-"
    parity: str = "-"
    lost_host: str = "-"
    notes: list[str] = field(default_factory=list)


def write_mnist(root: Path, n_train: int = 64, n_test: int = 16) -> None:
    """MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte as torchvision reads them (uncompressed): dim noise
    with a bright band at rows 2k+4 and 2k+5 for digit k, so that a test accuracy means something."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = (np.arange(n) % 10).astype(np.uint8)
        images = rng.integers(0, 64, (n, 28, 28), dtype=np.uint8)
        for row in (0, 1):
            images[np.arange(n), 2 * labels + 4 + row, :] = 255
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + labels.tobytes())


def write_images(root: Path, classes: tuple[str, ...] = ("cat", "dog"), per_class: int = 4) -> None:
    """An ImageFolder tree (train/ and val/) of small noisy PNGs, class k tinted by k."""
    rng = np.random.default_rng(1)
    for split in ("train", "val"):
        for k, c in enumerate(classes):
            (root / split / c).mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8) // 2 + np.uint8(100 * k)
                Image.fromarray(pixels, "RGB").save(root / split / c / f"{i}.png")


def _run(cmd: list[str], log: Path, cwd: Path) -> int | None:
    """Run ``cmd`` with its output in ``log``; its exit code, None when it ran past RUN_TIMEOUT."""
    with log.open("w") as f:  # not atomic: a log written as the run goes
        f.write(" ".join(cmd) + "\n\n")
        f.flush()
        try:
            return subprocess.run(cmd, cwd=cwd, env=ENV, stdout=f, stderr=subprocess.STDOUT,
                                  timeout=RUN_TIMEOUT).returncode
        except subprocess.TimeoutExpired:
            return None


def _outcome(rc: int | None, log: Path) -> str:
    if rc == 0:
        return "yes"
    return f"no ({'timeout' if rc is None else f'exit {rc}'}: {log.name})"


def check(example: Example, hvd_dir: Path, data: Path, out: Path, arms: str) -> Row:
    row, work = Row(example.name), out / example.name
    work.mkdir(parents=True, exist_ok=True)
    script, port = hvd_dir / example.path, work / f"{example.name}_ddp.py"
    port.unlink(missing_ok=True)
    rc = _run([str(BIN / "dpcompare"), "migrate", str(script), "--port", str(port)], work / "migrate.log", work)
    row.written = "yes" if port.is_file() else f"no (migrate.log, exit {rc})"
    if not port.is_file():
        row.notes.append(_last_lines(work / "migrate.log"))
        return row
    try:
        py_compile.compile(str(port), cfile=str(work / "port.pyc"), doraise=True)
        row.compiles = "yes"
    except py_compile.PyCompileError as e:
        row.compiles = "no"
        row.notes.append(str(e).splitlines()[-1])
        return row
    args = example.args(data, work)
    for old in work.glob("checkpoint-*"):  # an earlier bench's: the ImageNet scripts would resume from it
        old.unlink()
    rc = _run([str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={NP}", str(port), *args],
              work / "runs.log", work)
    row.runs = _outcome(rc, work / "runs.log")
    if example.lost_host:
        row.lost_host = lost_host(script, data, work)
    if example.parity:
        row.parity = example.parity
        return row
    if example.own_checkpoints:
        script, port = _fresh(script, work), _fresh(port, work)
    rc = _parity(script, port, arms, work, args, "parity")
    row.parity = f"{arms}: " + (f"agree{_largest(work / 'parity.log')}" if rc == 0
                                 else _outcome(rc, work / "parity.log"))
    if rc != 0 and example.cause is not None:  # the port differs: is migrate's named cause all of it?
        why, without = example.cause
        rc = _parity(script, port, arms, work, [*args, *without], "parity-without-cause")
        row.parity += (f"; the cause migrate names ({why}): with {' '.join(without)} "
                       + (f"agree{_largest(work / 'parity-without-cause.log')}" if rc == 0
                          else _outcome(rc, work / "parity-without-cause.log")))
    return row


def lost_host(script: Path, data: Path, work: Path) -> str:
    """``compare --script`` of the example's port on torchrun's elastic agents (``ddp-elastic``), 2 lab hosts,
    host 1 lost at step 30 of 150 (2 epochs of 75 steps on DATA/mnist-elastic), against the same run without the
    fault: whether it recovered, from which step, after how long, and both runs' final ``avg_accuracy``."""
    out = work / "lost-host"
    rc = _run([str(BIN / "dpcompare"), "compare", "--script", str(script), "--strategies", "ddp-elastic", "--lab",
               f"hosts=2,name=hx{os.getpid() % 10000}", "--np", "2", "--fault", "host=1,at-step=30", "--repeats", "1",
               "--min-steps", "0", "--metric", "avg_accuracy", "--progress", "none", "--out", str(out),
               "--overwrite", "--", "--epochs", "2", "--batch-size", "8", "--test-batch-size", "50", "--no-cuda",
               "--data-dir", str(data / "mnist-elastic")], work / "lost-host.log", work)
    if rc != 0:
        return _outcome(rc, work / "lost-host.log")
    runs = {r["arm"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    clean, hit = runs["ddp-elastic"], runs["ddp-elastic/fault=host1@30"]
    r = hit.get("recovery") or {}
    if hit["status"] != "ok" or not r.get("recovered"):
        return f"no ({hit['status']}: {hit.get('error') or 'not recovered'}; lost-host.log)"
    return (f"survives (from step {r['resumed_from_step']}, pause {r['pause_s']:.1f} s, "
            f"2→{r['world_size_after']} ranks); avg_accuracy {hit['final_metric']:.3f}, "
            f"without the fault {clean['final_metric']:.3f}")


def _parity(script: Path, port: Path, arms: str, work: Path, args: list[str], name: str) -> int | None:
    """``dpcompare parity`` of the script's arms and its port, into WORK/NAME and WORK/NAME.log."""
    return _run([str(BIN / "dpcompare"), "parity", "--script", str(script), "--strategies", arms, "--ddp-script",
                 str(port), "--np", str(NP), "--out", str(work / name), "--overwrite",
                 "--run-timeout", f"{RUN_TIMEOUT:g}", "--", *args], work / f"{name}.log", work)


def _fresh(script: Path, work: Path) -> Path:
    """A script of the bench's that runs ``script`` (where it lies) with ``--checkpoint-format`` in a folder of
    the process's own: parity's arms share one working folder, and the ImageNet example resumes from any
    checkpoint it finds there (rank 0's choice is broadcast), so the second arm would train nothing."""
    wrapper = work / f"fresh_{script.stem}.py"
    wrapper.write_text(  # not atomic: the bench's own scratch file
        "import runpy, sys, tempfile\n"
        "args = sys.argv[1:]\n"
        "args[args.index('--checkpoint-format') + 1] = "
        "tempfile.mkdtemp(prefix='ckpt-') + '/checkpoint-{epoch}.pth.tar'\n"
        f"sys.argv = [{str(script)!r}, *args]\n"
        f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    return wrapper


def _largest(log: Path) -> str:
    """`` (largest D)``: the largest difference parity's verdict line names, or nothing."""
    found = re.findall(r"\(largest ([^)]+)\)", log.read_text(errors="replace"))
    return f" (largest {max(found, key=float)})" if found else ""


def _last_lines(log: Path, n: int = 3) -> str:
    """migrate's reason for writing no port (from "No DDP port written" on), else the log's last lines."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    at = next((i for i, line in enumerate(lines) if line.startswith("No DDP port written")), len(lines) - n)
    return " ".join(lines[max(at, 0):])[:400]


def table(rows: list[Row]) -> str:
    head = ("example", "port written", "compiles", "runs", "parity", "lost host (lab)")
    cells = [head, *((r.name, r.written, r.compiles, r.runs, r.parity, r.lost_host) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(len(head))).rstrip() for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"  {r.name}: {n}" for r in rows for n in r.notes]
    return "\n".join(lines + (["", "notes:", *notes] if notes else []))


def main() -> int:
    hvd_dir = Path(sys.argv[1]).resolve()
    only = {n for n in os.environ.get("ONLY", "").split(",") if n}
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="horovod-examples-"))
    data = out / "data"
    if not data.is_dir():
        write_mnist(data / "mnist")
        write_mnist(data / "mnist-elastic", n_train=1200, n_test=200)
        write_images(data / "images")
    arms = "horovod,native,ddp" if importlib.util.find_spec("horovod") else "native,ddp"
    if arms == "native,ddp":
        print("real Horovod is not installed (make setup builds it): parity compares native and the port only")
    rows = []
    for example in EXAMPLES:
        if only and example.name not in only:
            continue
        if not (hvd_dir / example.path).is_file():
            rows.append(Row(example.name, written=f"no ({example.path} is not in {hvd_dir})"))
            continue
        print(f"== {example.name}", flush=True)
        rows.append(check(example, hvd_dir, data, out, arms))
        print(table(rows[-1:]), flush=True)
    print(f"\n{table(rows)}\n\nlogs, ports and parity runs: {out}/EXAMPLE/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
