"""Datasets and the samplers that make every strategy see the same samples in the same order.

Training uses ``DistributedSampler(shuffle=True, seed=run seed, drop_last=True)`` with ``set_epoch``
under every strategy (``single`` is simply one replica) and a DataLoader with ``drop_last=True``:
every rank runs the same number of steps, and the union of the ranks' k-th batches is exactly the
k-th batch that one process would take with the global batch size. Evaluation shards the test set
without padding (rank r takes items r, r+N, ...) so the accuracy is exact at any world size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, TensorDataset

from dpcompare.errors import ConfigError


@dataclass
class DataBundle:
    name: str
    train: Dataset
    test: Dataset
    input_shape: tuple[int, ...]
    num_classes: int


def _digits_file() -> Path:
    """scikit-learn's bundled digits.csv.gz, found without importing scikit-learn (≈2 s per process)."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    raise ConfigError("--dataset digits needs scikit-learn's bundled data: pip install scikit-learn")


def _digits(**_: object) -> DataBundle:
    data = np.loadtxt(_digits_file(), delimiter=",", dtype=np.float32)  # 1797 rows: 64 pixels (0–16), label
    x, y = (data[:, :-1] / 16.0).reshape(-1, 1, 8, 8), data[:, -1].astype(np.int64)
    # A fixed, stratified split independent of the run seed: shuffle once (seed 0), group by class, and
    # every 5th image of the grouped order is a test image, so each class gives a fifth (360 test images).
    order = np.random.default_rng(0).permutation(len(y))
    order = order[np.argsort(y[order], kind="stable")]
    test = np.zeros(len(y), dtype=bool)
    test[order[::5]] = True
    as_ds = lambda a, b: TensorDataset(torch.from_numpy(np.ascontiguousarray(a)), torch.from_numpy(b))  # noqa: E731
    return DataBundle("digits", as_ds(x[~test], y[~test]), as_ds(x[test], y[test]), (1, 8, 8), 10)


def _synthetic(shape: tuple[int, ...] = (3, 32, 32), samples: int = 1024, num_classes: int = 10,
               **_: object) -> DataBundle:
    g = torch.Generator().manual_seed(1234)  # fixed data, whatever the run seed
    x = torch.randn(samples, *shape, generator=g)
    y = torch.randint(0, num_classes, (samples,), generator=g)
    n_test = max(samples // 8, 1)
    return DataBundle("synthetic", TensorDataset(x[n_test:], y[n_test:]), TensorDataset(x[:n_test], y[:n_test]),
                      tuple(shape), num_classes)


def _torchvision(name: str, data_dir: str | None, **_: object) -> DataBundle:
    from dpcompare.models.resnet import import_torchvision

    tv = import_torchvision(f"--dataset {name}")
    if not data_dir or not Path(data_dir).is_dir():
        raise ConfigError(f"--dataset {name} needs --data-dir pointing at a folder that holds it "
                          f"(torchvision layout; got {data_dir!r}); fetch it once with torchvision on a "
                          "machine with network access")
    cls, shape, mean, std = {
        "mnist": (tv.datasets.MNIST, (1, 28, 28), (0.1307,), (0.3081,)),
        "cifar10": (tv.datasets.CIFAR10, (3, 32, 32), (0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261)),
    }[name]
    tf = tv.transforms.Compose([tv.transforms.ToTensor(), tv.transforms.Normalize(mean, std)])
    try:
        train = cls(data_dir, train=True, download=False, transform=tf)
        test = cls(data_dir, train=False, download=False, transform=tf)
    except RuntimeError as e:
        raise ConfigError(f"--dataset {name}: no usable data in {data_dir} ({e})") from None
    return DataBundle(name, train, test, shape, 10)


DATASETS: dict[str, tuple[Callable[..., DataBundle], str]] = {
    "digits": (_digits, "scikit-learn's bundled 8x8 digits (1437 train / 360 test), offline"),
    "synthetic": (_synthetic, "fixed random tensors of --input-shape, like Horovod's synthetic benchmark"),
    "mnist": (lambda **kw: _torchvision("mnist", **kw), "MNIST from --data-dir (needs [vision])"),
    "cifar10": (lambda **kw: _torchvision("cifar10", **kw), "CIFAR-10 from --data-dir (needs [vision])"),
}


def names() -> list[str]:
    return list(DATASETS)


def build_dataset(name: str, data_dir: str | None = None, shape: tuple[int, ...] = (3, 32, 32),
                  samples: int = 1024) -> DataBundle:
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
    return DATASETS[name][0](data_dir=data_dir, shape=shape, samples=samples)


def train_loader(ds: Dataset, batch_size: int, rank: int, world_size: int, seed: int,
                 workers: int = 0) -> tuple[DataLoader, DistributedSampler]:
    sampler = DistributedSampler(ds, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True)
    if len(sampler) < batch_size:
        raise ConfigError(f"--batch-size {batch_size} is larger than the {len(sampler)} training samples each of "
                          f"the {world_size} processes gets; use a smaller batch")
    loader = DataLoader(ds, batch_size=batch_size, sampler=sampler, drop_last=True, num_workers=workers)
    return loader, sampler


def eval_loader(ds: Dataset, rank: int, world_size: int, batch_size: int = 512) -> DataLoader:
    return DataLoader(Subset(ds, range(rank, len(ds), world_size)), batch_size=batch_size, shuffle=False)
