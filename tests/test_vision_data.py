"""MNIST, CIFAR-10 and ImageFolder data from tiny files in the real on-disk formats; torchvision ResNets.

torchvision's CIFAR10 checks every file's md5 against the official release even with ``download=False``,
so tiny test batches can never pass it. The tests that load them point the class's md5 table at the tiny
files' own md5s (``tiny_cifar_md5s``; the check itself still runs) and one test shows that, unpatched, the
real check refuses them with a clear message. In subprocesses the same table change is made by a small
launcher script that then runs ``dpcompare.cli.main``.
"""

import hashlib
import json
import pickle
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dpcompare import models
from dpcompare.data.datasets import CROP_PAD, build_dataset, train_loader
from dpcompare.errors import ConfigError

from conftest import DPCOMPARE, dpcompare, mpi_env, needs_horovod, needs_mpi, run, summary

tv = pytest.importorskip("torchvision", exc_type=ImportError)
from PIL import Image  # noqa: E402
from torchvision.datasets import CIFAR10  # noqa: E402
from torchvision.datasets.folder import IMG_EXTENSIONS  # noqa: E402

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
CIFAR_MEAN, CIFAR_STD = torch.tensor((0.4914, 0.4822, 0.4465)), torch.tensor((0.247, 0.243, 0.261))
CIFAR_FILES = [n for n, _ in CIFAR10.train_list + CIFAR10.test_list] + [CIFAR10.meta["filename"]]
QUICK = ("--no-tensorboard", "--threads", "1", "--warmup-steps", "0", "--progress", "none")


# ---- files in the real formats ------------------------------------------------------------------------------

def write_mnist(root: Path, n_train: int = 64, n_test: int = 16) -> Path:
    """MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte: big-endian magic 2051/2049, dims, uint8 data."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + labels.tobytes())
    return root


def write_cifar(root: Path, per_batch: int = 16, n_test: int = 16) -> Path:
    """cifar-10-batches-py/ as the python version: pickled dicts of uint8 N×3072 (RGB planes) and labels."""
    folder = root / CIFAR10.base_folder
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i, name in enumerate(CIFAR_FILES[:-1]):
        n = n_test if name == "test_batch" else per_batch
        batch = {
            "batch_label": f"batch {i}",
            "labels": [int(v) for v in rng.integers(0, 10, n)],
            "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            "filenames": [f"{i}_{k}.png" for k in range(n)],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    meta = {"label_names": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"],
            "num_cases_per_batch": per_batch, "num_vis": 3072}
    (folder / CIFAR10.meta["filename"]).write_bytes(pickle.dumps(meta, protocol=2))
    return root


def tiny_cifar_md5s(root: Path) -> dict[str, str]:
    return {n: hashlib.md5((root / CIFAR10.base_folder / n).read_bytes()).hexdigest() for n in CIFAR_FILES}


def use_md5s(cls: type, md5: dict[str, str]) -> None:
    """Point torchvision's md5 table at the tiny files (shared by the in-process tests and the launcher)."""
    cls.train_list = [[n, md5[n]] for n, _ in cls.train_list]
    cls.test_list = [[n, md5[n]] for n, _ in cls.test_list]
    cls.meta = {**cls.meta, "md5": md5[cls.meta["filename"]]}


LAUNCHER = '''"""dpcompare, with torchvision's CIFAR-10 md5 table pointed at the tiny test files."""
import json, sys
from torchvision.datasets import CIFAR10
md5 = json.loads({md5!r})
CIFAR10.train_list = [[n, md5[n]] for n, _ in CIFAR10.train_list]
CIFAR10.test_list = [[n, md5[n]] for n, _ in CIFAR10.test_list]
CIFAR10.meta = {{**CIFAR10.meta, "md5": md5[CIFAR10.meta["filename"]]}}
from dpcompare.cli import main
sys.exit(main())
'''


def cifar_launcher(root: Path) -> str:
    script = root / "dpcompare_tiny_cifar.py"
    script.write_text(LAUNCHER.format(md5=json.dumps(tiny_cifar_md5s(root))))
    return str(script)


def write_images(root: Path, classes=("cat", "dog", "fox"), splits=(("train", 4), ("val", 2)),
                 size=(20, 12)) -> Path:
    """An ImageFolder tree of solid-colour PNGs: class k is colour (40k, 255 - 40k, 128)."""
    for split, n in splits:
        for k, c in enumerate(classes):
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                Image.new("RGB", size, (40 * k, 255 - 40 * k, 128)).save(root / split / c / f"{i}.png")
    return root


@pytest.fixture
def mnist_dir(tmp_path):
    return write_mnist(tmp_path / "data")


@pytest.fixture
def cifar_dir(tmp_path):
    return write_cifar(tmp_path / "data")


@pytest.fixture
def tiny_cifar(cifar_dir, monkeypatch):
    """cifar_dir, with torchvision's CIFAR10 (in this process) checking the tiny files' md5s."""
    for attr in ("train_list", "test_list", "meta"):
        monkeypatch.setattr(CIFAR10, attr, getattr(CIFAR10, attr))
    use_md5s(CIFAR10, tiny_cifar_md5s(cifar_dir))
    return cifar_dir


# ---- loading ------------------------------------------------------------------------------------------------

def test_mnist_loads_with_the_tutorial_normalisation(mnist_dir):
    d = build_dataset("mnist", str(mnist_dir))
    assert (d.name, len(d.train), len(d.test), d.input_shape, d.num_classes) == ("mnist", 64, 16, (1, 28, 28), 10)
    raw = np.frombuffer((mnist_dir / "MNIST/raw/t10k-images-idx3-ubyte").read_bytes()[16:], np.uint8)
    x, y = d.test[3]
    expect = (torch.from_numpy(raw.reshape(16, 1, 28, 28)[3].astype(np.float32)) / 255 - MNIST_MEAN) / MNIST_STD
    assert y == 3 and x.shape == (1, 28, 28) and torch.allclose(x, expect, atol=1e-5)


def test_cifar10_loads_through_torchvisions_md5_check(tiny_cifar):
    d = build_dataset("cifar10", str(tiny_cifar))
    assert (len(d.train), len(d.test), d.input_shape, d.num_classes) == (80, 16, (3, 32, 32), 10)
    batch = pickle.loads((tiny_cifar / CIFAR10.base_folder / "data_batch_2").read_bytes())
    x, y = d.train[16 + 5]  # the 6th image of the second batch
    img = torch.from_numpy(batch["data"][5].reshape(3, 32, 32).astype(np.float32)) / 255
    assert y == batch["labels"][5]
    assert torch.allclose(x, (img - CIFAR_MEAN[:, None, None]) / CIFAR_STD[:, None, None], atol=1e-5)


def test_cifar10_files_that_are_not_the_official_release_are_refused(cifar_dir):
    with pytest.raises(ConfigError) as e:
        build_dataset("cifar10", str(cifar_dir))
    msg = str(e.value)
    assert "data_batch_1" in msg and "md5" in msg and "official" in msg and "\n" not in msg


def _candidates(x: torch.Tensor, fill: torch.Tensor, pad: int = CROP_PAD) -> torch.Tensor:
    """Every crop of ``x`` padded by ``pad`` (with the normalised black ``fill``), flipped or not."""
    c, h, w = x.shape
    padded = fill[:, None, None].expand(c, h + 2 * pad, w + 2 * pad).clone()
    padded[:, pad:pad + h, pad:pad + w] = x
    crops = [padded[:, i:i + h, j:j + w] for i in range(2 * pad + 1) for j in range(2 * pad + 1)]
    return torch.stack(crops + [crop.flip(-1) for crop in crops])


def test_augmentation_is_a_crop_and_flip_fixed_by_seed_epoch_and_index(tiny_cifar):
    plain = build_dataset("cifar10", str(tiny_cifar)).train
    aug = build_dataset("cifar10", str(tiny_cifar), augment=True).train
    fill = -CIFAR_MEAN / CIFAR_STD
    moved = 0
    for i in range(0, 80, 9):
        x = aug[i][0]
        assert aug[i][1] == plain[i][1]
        assert ((_candidates(plain[i][0], fill) - x).abs().amax((1, 2, 3)) < 1e-5).any()
        moved += not torch.equal(x, plain[i][0])
    assert moved >= 6

    def batches(world: int, rank: int, epoch: int, batch: int) -> list[torch.Tensor]:
        torch.manual_seed(1000 * world + rank)  # global RNG state must not matter
        torch.rand(world + rank)
        loader, sampler = train_loader(aug, batch, rank, world, seed=7)
        sampler.set_epoch(epoch)
        return [x for x, _ in loader]

    for epoch in (0, 1):
        one = batches(1, 0, epoch, 16)
        two = [batches(2, r, epoch, 8) for r in (0, 1)]
        for k, x in enumerate(one):
            key = lambda t: sorted(map(tuple, t.flatten(1).tolist()))  # noqa: E731
            assert key(x) == key(torch.cat([two[0][k], two[1][k]]))
    aug.set_epoch(7, 0)
    e0 = torch.stack([aug[i][0] for i in range(8)])
    aug.set_epoch(7, 1)
    assert not torch.equal(e0, torch.stack([aug[i][0] for i in range(8)]))  # a new epoch, new crops


def test_imagefolder_resizes_normalises_and_counts_classes(tmp_path):
    root = write_images(tmp_path / "imgs")
    d = build_dataset("imagefolder", str(root), shape=(3, 16, 8))
    assert (len(d.train), len(d.test), d.input_shape, d.num_classes) == (12, 6, (3, 16, 8), 3)
    x, y = d.test[5]  # sorted: cat 0,1  dog 2,3  fox 4,5
    mean, std = torch.tensor((0.485, 0.456, 0.406)), torch.tensor((0.229, 0.224, 0.225))
    expect = (torch.tensor((80, 175, 128)) / 255 - mean) / std
    assert y == 2 and x.shape == (3, 16, 8)
    assert torch.allclose(x, expect[:, None, None].expand(3, 16, 8), atol=1e-5)
    gray = build_dataset("imagefolder", str(root), shape=(1, 8, 8), augment=True)
    assert gray.input_shape == (1, 8, 8) and gray.train[0][0].shape == (1, 8, 8)


def test_imagefolder_takes_test_when_there_is_no_val(tmp_path):
    root = write_images(tmp_path / "imgs", classes=("a", "b"), splits=(("train", 2), ("test", 1)))
    for f in (root / "test").rglob("*.png"):
        Image.new("RGB", (20, 12), (9, 99, 199)).save(f)  # the test split's own colour, in no train image
    d = build_dataset("imagefolder", str(root), shape=(3, 8, 8))
    mean, std = torch.tensor((0.485, 0.456, 0.406)), torch.tensor((0.229, 0.224, 0.225))
    test_colour = ((torch.tensor((9, 99, 199)) / 255 - mean) / std)[:, None, None].expand(3, 8, 8)
    assert (len(d.train), len(d.test), [y for _, y in d.test]) == (4, 2, [0, 1])
    assert all(torch.allclose(x, test_colour, atol=1e-5) for x, _ in d.test)
    assert not any(torch.allclose(x, test_colour, atol=1e-5) for x, _ in d.train)


# ---- missing or malformed data ------------------------------------------------------------------------------

def _gz_only(root: Path) -> Path:
    import gzip

    write_mnist(root)
    for f in (root / "MNIST/raw").iterdir():
        f.with_name(f.name + ".gz").write_bytes(gzip.compress(f.read_bytes()))
        f.unlink()
    return root


def _bad_magic(root: Path) -> Path:
    write_mnist(root)
    f = root / "MNIST/raw/train-images-idx3-ubyte"
    f.write_bytes(b"\x00\x00\x00\x00" + f.read_bytes()[4:])
    return root


def _short_labels(root: Path) -> Path:
    write_mnist(root)
    (root / "MNIST/raw/t10k-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, 3) + bytes(3))
    return root


def _cifar_without(name: str):
    def make(root: Path) -> Path:
        write_cifar(root)
        (root / CIFAR10.base_folder / name).unlink()
        return root
    return make


def _corrupt_png(root: Path) -> Path:
    write_images(root)
    for f in (root / "train" / "cat").iterdir():
        f.write_bytes(b"not a png")
    return root


def _empty_class(root: Path) -> Path:
    write_images(root)
    for f in (root / "val" / "dog").iterdir():
        f.unlink()
    return root


def _other_classes(root: Path) -> Path:
    write_images(root, splits=(("train", 1),))
    write_images(root, classes=("cat", "dog"), splits=(("val", 1),))
    return root


MNIST_EXPECTED = "MNIST/raw/{train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, " \
                 "t10k-labels-idx1-ubyte}"
CIFAR_EXPECTED = "cifar-10-batches-py/{data_batch_1, data_batch_2, data_batch_3, data_batch_4, data_batch_5, " \
                 "test_batch, batches.meta}"
FOLDER_EXPECTED = "train/<class>/<image> and val/<class>/<image> (or test/<class>/<image>), images " + \
                  "|".join(IMG_EXTENSIONS)

BAD = {  # name: (dataset, make the folder or None for no --data-dir, words the one line must hold)
    "mnist-no-dir": ("mnist", None, [MNIST_EXPECTED, "none given"]),
    "mnist-empty": ("mnist", lambda r: r, [MNIST_EXPECTED, "missing train-images-idx3-ubyte"]),
    "mnist-not-a-folder": ("mnist", lambda r: r / "nope", [MNIST_EXPECTED, "no such folder"]),
    "mnist-gz": ("mnist", _gz_only, [MNIST_EXPECTED, "train-images-idx3-ubyte.gz", "gunzipped"]),
    "mnist-bad-magic": ("mnist", _bad_magic, [MNIST_EXPECTED, "cannot read", "2051", "AssertionError"]),
    "mnist-short-labels": ("mnist", _short_labels, [MNIST_EXPECTED, "cannot read", "3 labels"]),
    "cifar-no-dir": ("cifar10", None, [CIFAR_EXPECTED, "none given"]),
    "cifar-empty": ("cifar10", lambda r: r, [CIFAR_EXPECTED, "missing data_batch_1"]),
    "cifar-no-meta": ("cifar10", _cifar_without("batches.meta"), [CIFAR_EXPECTED, "missing batches.meta"]),
    "cifar-not-official": ("cifar10", write_cifar, [CIFAR_EXPECTED, "md5"]),
    "folder-no-dir": ("imagefolder", None, [FOLDER_EXPECTED, "none given"]),
    "folder-empty": ("imagefolder", lambda r: r, [FOLDER_EXPECTED, "no train/ there"]),
    "folder-no-val": ("imagefolder", lambda r: write_images(r, splits=(("train", 1),)),
                      [FOLDER_EXPECTED, "no val/ or test/ there"]),
    "folder-empty-class": ("imagefolder", _empty_class, [FOLDER_EXPECTED, "dog"]),
    "folder-corrupt-image": ("imagefolder", _corrupt_png, [FOLDER_EXPECTED, "cannot read", "UnidentifiedImageError"]),
    "folder-other-classes": ("imagefolder", _other_classes, ["val/ has the classes", "same class folders"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_missing_or_malformed_data_is_one_clear_line(tmp_path, case):
    dataset, make, words = BAD[case]
    root = tmp_path / "data"
    root.mkdir()
    data_dir = None if make is None else str(make(root))
    with pytest.raises(ConfigError) as e:
        build_dataset(dataset, data_dir)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


@pytest.mark.parametrize("case", ["mnist-empty", "cifar-no-meta", "folder-no-val"])
def test_the_cli_says_it_in_one_line_with_exit_2(tmp_path, case):
    dataset, make, words = BAD[case]
    root = tmp_path / "data"
    root.mkdir()
    p = dpcompare("train", "--dataset", dataset, "--data-dir", str(make(root)), "--out", str(tmp_path / "o"),
                  check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert lines[0].startswith("dpcompare train: error: ") and all(w in lines[0] for w in words)
    assert not (tmp_path / "o").exists()


def test_augment_is_refused_where_it_does_not_apply():
    with pytest.raises(ConfigError, match="--augment"):
        build_dataset("digits", augment=True)


# ---- real runs ----------------------------------------------------------------------------------------------

def _cmd(dataset: str, root: Path) -> list[str]:
    return [DPCOMPARE] if dataset != "cifar10" else [sys.executable, cifar_launcher(root)]


@pytest.mark.parametrize("dataset", ["mnist", "cifar10", "imagefolder"])
def test_one_process_trains_on_each(tmp_path, dataset, monkeypatch):
    writer = {"mnist": write_mnist, "cifar10": write_cifar, "imagefolder": write_images}[dataset]
    root = writer(tmp_path / "data")
    if dataset == "cifar10":  # in this process (dpcompare() runs one process here): the tiny files' md5s
        for attr in ("train_list", "test_list", "meta"):
            monkeypatch.setattr(CIFAR10, attr, getattr(CIFAR10, attr))
        use_md5s(CIFAR10, tiny_cifar_md5s(root))
    out = tmp_path / "run"
    dpcompare("train", "--dataset", dataset, "--data-dir", str(root), "--model", "convnet",
              "--input-shape", "3,16,16", "--batch-size", "4", "--epochs", "1", "--max-steps", "2", *QUICK,
              "--out", str(out))
    s = summary(out)
    assert (s["dataset"], s["steps"]) == (dataset, 2) and s["final_train_loss"] > 0


@needs_mpi
@needs_horovod
@pytest.mark.mpi
def test_resnet18_under_ddp_and_horovod_trains_alike_on_the_same_augmented_cifar(tmp_path):
    """The same augmented CIFAR-10 batches reach both strategies, and resnet18's BatchNorm (buffers broadcast by
    DDP, left per rank by Horovod) does not make them diverge: one pair of np=2 runs for both (10 steps of 8 per
    process; the agreement does not need the acceptance run's 256 samples)."""
    root = write_cifar(tmp_path / "data")
    launcher = cifar_launcher(root)
    losses = {}
    for strategy in ("ddp", "horovod"):
        out = tmp_path / strategy
        run(["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", sys.executable, launcher, "train",
             "--strategy", strategy, "--dataset", "cifar10", "--data-dir", str(root), "--augment",
             "--model", "resnet18", "--batch-size", "8", "--epochs", "2", *QUICK, "--out", str(out)],
            env=mpi_env())
        s = summary(out)
        assert (s["model"], s["world_size"], s["steps"]) == ("resnet18", 2, 10)
        losses[strategy] = s["final_train_loss"]
    assert abs(losses["ddp"] - losses["horovod"]) <= 1e-6, losses


# ---- ResNets ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch, shape", [("resnet18", (3, 32, 32)), ("resnet50", (3, 32, 32)),
                                         ("resnet18", (1, 28, 28))])
def test_resnet_forward_backward(arch, shape):
    torch.manual_seed(0)
    m = models.build_model(arch, shape, 7)
    out = m(torch.randn(2, *shape))
    assert out.shape == (2, 7) and models.has_batchnorm(m)
    out.sum().backward()
    assert m.conv1.weight.grad is not None and m.conv1.in_channels == shape[0]


def test_resnet50_trains_on_imagenet_sized_input(tmp_path):
    dpcompare("train", "--model", "resnet50", "--dataset", "synthetic", "--input-shape", "3,224,224",
              "--samples", "16", "--batch-size", "2", "--epochs", "1", "--max-steps", "2", *QUICK,
              "--out", str(tmp_path / "o"))
    s = summary(tmp_path / "o")
    assert (s["model"], s["steps"]) == ("resnet50", 2)
