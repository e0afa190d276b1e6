"""Datasets and the samplers that make every strategy see the same samples in the same order.

Training uses ``DistributedSampler(shuffle=True, seed=run seed, drop_last=True)`` with ``set_epoch``
under every strategy (``single`` is simply one replica) and a DataLoader with ``drop_last=True``:
every rank runs the same number of steps, and the union of the ranks' k-th batches is exactly the
k-th batch that one process would take with the global batch size. Evaluation shards the test set
without padding (rank r takes items r, r+N, ...) so the accuracy is exact at any world size.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, TensorDataset

from dpcompare.data.catalog import DATASETS
from dpcompare.errors import ConfigError
from dpcompare.files import atomic_write, one_line
from dpcompare.models.resnet import import_torchvision


@dataclass
class DataBundle:
    name: str
    train: Dataset
    test: Dataset
    input_shape: tuple[int, ...]
    num_classes: int


def cache_dir() -> Path:
    """Where dpcompare keeps what it can rebuild (``$DPCOMPARE_CACHE``, else ``$XDG_CACHE_HOME/dpcompare``)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(os.environ.get("DPCOMPARE_CACHE") or Path(base) / "dpcompare")


def _digits_split() -> dict[str, np.ndarray]:
    """scikit-learn's digits, split 80/20 (stratified, ``random_state=0``) by scikit-learn itself."""
    from sklearn.datasets import load_digits  # only --dataset digits needs scikit-learn

    # lazy: only the digits dataset needs it
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    return {"xtr": xtr, "xte": xte, "ytr": ytr.astype(np.int64), "yte": yte.astype(np.int64)}


def _digits(**_: object) -> DataBundle:
    # A fixed split, independent of the run seed, so every run evaluates on the same 360 images. Importing
    # scikit-learn costs every process 1-2 s (most of a short run's start-up), so the split it makes is kept
    # in the cache, keyed by its version, and read back with numpy.
    try:
        path = cache_dir() / f"digits-sklearn-{version('scikit-learn')}.npz"
    except PackageNotFoundError:
        raise ConfigError("--dataset digits needs scikit-learn: pip install scikit-learn") from None
    try:
        with np.load(path) as f:
            arrays = {k: f[k] for k in ("xtr", "xte", "ytr", "yte")}
        if arrays["xtr"].shape != (1437, 1, 8, 8) or arrays["xte"].shape != (360, 1, 8, 8):
            raise ValueError("not the digits split")
    except (OSError, KeyError, ValueError):  # not there yet, or unreadable: make it (again)
        arrays = _digits_split()
        with contextlib.suppress(OSError):  # a read-only cache only costs the import next time
            atomic_write(path, lambda f: np.savez(f, **arrays))
    as_ds = lambda a, b: TensorDataset(torch.from_numpy(a), torch.from_numpy(b))  # noqa: E731
    return DataBundle("digits", as_ds(arrays["xtr"], arrays["ytr"]), as_ds(arrays["xte"], arrays["yte"]), (1, 8, 8), 10)


def _synthetic(shape: tuple[int, ...] = (3, 32, 32), samples: int = 1024, num_classes: int = 10,
               **_: object) -> DataBundle:
    g = torch.Generator().manual_seed(1234)  # fixed data, whatever the run seed
    x = torch.randn(samples, *shape, generator=g)
    y = torch.randint(0, num_classes, (samples,), generator=g)
    n_test = max(samples // 8, 1)
    return DataBundle("synthetic", TensorDataset(x[n_test:], y[n_test:]), TensorDataset(x[:n_test], y[:n_test]),
                      tuple(shape), num_classes)


# Mean and std per channel, as the tutorials normalise (ImageNet's for users' own images).
_NORM = {
    "mnist": ((0.1307,), (0.3081,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261)),
    "imagefolder": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "imagefolder-gray": ((0.449,), (0.226,)),
}
CROP_PAD = 4
AUGMENTABLE = ("cifar10", "imagefolder")


class SeededAugment(Dataset):
    """Random crop (padding 4) and horizontal flip whose randomness depends on (seed, epoch, index) only.

    torchvision's ``RandomCrop``/``RandomHorizontalFlip`` draw from the global RNG, whose state depends on
    whatever drew from it before (a strategy's setup, a resume); here every sample gets its own generator, so
    the batches are the same bit for bit under every strategy and world size. ``train_loader``'s sampler
    calls :meth:`set_epoch`.
    """

    def __init__(self, base: Dataset, finish: Callable[[Any], torch.Tensor], pad: int = CROP_PAD) -> None:
        self.base, self.finish, self.pad = base, finish, pad
        self.seed = self.epoch = 0

    def set_epoch(self, seed: int, epoch: int) -> None:
        self.seed, self.epoch = seed, epoch

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Any]:
        from torchvision.transforms import functional as F  # optional: torchvision may not be installed

        img, y = self.base[index]
        state = np.random.SeedSequence([self.seed % 2**63, self.epoch, index]).generate_state(1, np.uint64)[0]
        g = torch.Generator().manual_seed(int(state) >> 1)
        top, left = torch.randint(0, 2 * self.pad + 1, (2,), generator=g).tolist()
        flip = bool(torch.rand((), generator=g) < 0.5)
        w, h = img.size  # a PIL image, like the tutorials' RandomCrop(size, padding=4) sees
        img = F.crop(F.pad(img, [self.pad]), top, left, h, w)
        return self.finish(F.hflip(img) if flip else img), y


def _bundle(name: str, tv: Any, make: Callable[[bool, Any], Dataset], prep: list[Any],
            norm: tuple[tuple[float, ...], tuple[float, ...]], augment: bool, shape: tuple[int, ...],
            num_classes: int) -> DataBundle:
    """Train and test sets from ``make(train, transform)``; the train set wrapped in SeededAugment if asked."""
    T = tv.transforms
    finish = T.Compose([T.ToTensor(), T.Normalize(*norm)])
    full = T.Compose([*prep, finish])
    train = (SeededAugment(make(True, T.Compose(prep) if prep else None), finish) if augment
             else make(True, full))
    return DataBundle(name, train, make(False, full), shape, num_classes)


def _where(data_dir: str | None) -> str:
    if not data_dir:
        return "under --data-dir DIR (none given)"
    return f"under --data-dir {data_dir}" + ("" if Path(data_dir).is_dir() else " (no such folder)")


def _mnist(data_dir: str | None, **_: object) -> DataBundle:
    tv = _import_tv("mnist")
    cls = tv.datasets.MNIST
    names = [Path(url).stem for url, _ in cls.resources]  # torchvision reads the uncompressed files
    expected = f"{cls.__name__}/raw/{{{', '.join(names)}}}"
    raw = Path(data_dir or ".") / cls.__name__ / "raw"
    missing = [n for n in names if not (raw / n).is_file()]
    legacy = all((raw.parent / "processed" / f).is_file() for f in (cls.training_file, cls.test_file))
    if not data_dir or (missing and not legacy):
        gz = [n for n in missing if (raw / f"{n}.gz").is_file()]
        hint = (f"; {', '.join(n + '.gz' for n in gz)} must be gunzipped (torchvision does not read .gz)"
                if gz else "; fetch them once with torchvision.datasets.MNIST(DIR, download=True) where there is "
                           "network access")
        raise ConfigError(f"--dataset mnist expects the uncompressed idx files {expected} {_where(data_dir)}"
                          f"{'; missing ' + ', '.join(missing) if data_dir else ''}{hint}")

    def make(train: bool, tf: Any) -> Dataset:
        ds = cls(data_dir, train=train, download=False, transform=tf)
        if len(ds.data) != len(ds.targets) or tuple(ds.data.shape[1:]) != (28, 28):
            raise ValueError(f"{len(ds.data)} images of {tuple(ds.data.shape[1:])} but {len(ds.targets)} labels")
        return ds

    try:
        return _check(_bundle("mnist", tv, make, [], _NORM["mnist"], False, (1, 28, 28), 10))
    except Exception as e:  # noqa: BLE001  (torchvision's idx reader fails with AssertionError, RuntimeError...)
        raise ConfigError(f"--dataset mnist: cannot read {expected} {_where(data_dir)} as MNIST idx files "
                          f"(big-endian magic 2051/2049, 28x28 uint8 images, as many labels): {one_line(e)}"
                          ) from None


def _cifar10(data_dir: str | None, augment: bool = False, **_: object) -> DataBundle:
    tv = _import_tv("cifar10")
    cls = tv.datasets.CIFAR10
    entries = [*cls.train_list, *cls.test_list, [cls.meta["filename"], cls.meta["md5"]]]
    expected = f"{cls.base_folder}/{{{', '.join(n for n, _ in entries)}}}"
    folder = Path(data_dir or ".") / cls.base_folder
    missing = [n for n, _ in entries if not (folder / n).is_file()]
    if not data_dir or missing:
        raise ConfigError(f"--dataset cifar10 expects the CIFAR-10 python version {expected} {_where(data_dir)}"
                          f"{'; missing ' + ', '.join(missing) if data_dir else ''}; fetch it once with "
                          "torchvision.datasets.CIFAR10(DIR, download=True) where there is network access")
    # torchvision verifies every file's md5 against the official release, even with download=False.
    from torchvision.datasets.utils import check_integrity

    def make(train: bool, tf: Any) -> Dataset:
        try:
            return cls(data_dir, train=train, download=False, transform=tf)
        except RuntimeError:
            bad = [n for n, md5 in entries if not check_integrity(str(folder / n), md5)]
            if not bad:
                raise
            raise ConfigError(f"--dataset cifar10: {', '.join(bad)} in {folder} differ from the official CIFAR-10 "
                              f"python version (torchvision checks their md5); expected {expected}") from None

    try:
        return _check(_bundle("cifar10", tv, make, [], _NORM["cifar10"], augment, (3, 32, 32), 10))
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"--dataset cifar10: cannot read {expected} {_where(data_dir)}: {one_line(e)}") from None


IMAGE_SPLITS = (("train",), ("val", "test"))


def _imagefolder(data_dir: str | None, shape: tuple[int, ...] = (3, 32, 32), augment: bool = False,
                 **_: object) -> DataBundle:
    tv = _import_tv("imagefolder")
    exts = "|".join(tv.datasets.folder.IMG_EXTENSIONS)
    expected = f"train/<class>/<image> and val/<class>/<image> (or test/<class>/<image>), images {exts}"
    if len(shape) != 3 or shape[0] not in (1, 3):
        raise ConfigError(f"--dataset imagefolder needs --input-shape C,H,W with C 1 (grayscale) or 3 (RGB); "
                          f"got {','.join(map(str, shape))}")
    root = Path(data_dir or ".")
    dirs = [next((root / s for s in split if (root / s).is_dir()), None) for split in IMAGE_SPLITS]
    if not data_dir or None in dirs:
        raise ConfigError(f"--dataset imagefolder expects {expected} {_where(data_dir)}"
                          + (f"; no {' or '.join(s + '/' for s in IMAGE_SPLITS[dirs.index(None)])} there"
                             if data_dir else ""))
    T = tv.transforms
    prep = [T.Grayscale(1)] if shape[0] == 1 else []
    prep.append(T.Resize(tuple(shape[1:])))
    norm = _NORM["imagefolder" if shape[0] == 3 else "imagefolder-gray"]
    folders: dict[bool, Any] = {}

    def make(train: bool, tf: Any) -> Dataset:
        ds = tv.datasets.ImageFolder(str(dirs[0 if train else 1]), transform=tf)
        folders[train] = ds
        return ds

    try:
        bundle = _bundle("imagefolder", tv, make, prep, norm, augment, tuple(shape), 0)
    except OSError as e:  # FileNotFoundError: no class folder, or no image in one
        raise ConfigError(f"--dataset imagefolder expects {expected} {_where(data_dir)}: {one_line(e)}") from None
    classes = folders[True].classes
    if folders[False].classes != classes:
        raise ConfigError(f"--dataset imagefolder: {dirs[1].name}/ has the classes {folders[False].classes} but "
                          f"train/ has {classes} {_where(data_dir)}; both need the same class folders")
    bundle.num_classes = len(classes)
    try:
        return _check(bundle)
    except Exception as e:  # noqa: BLE001  (PIL cannot read an image)
        raise ConfigError(f"--dataset imagefolder: cannot read the first images of {expected} "
                          f"{_where(data_dir)}: {one_line(e)}") from None


def _import_tv(name: str) -> Any:
    return import_torchvision(f"--dataset {name}")


def _check(bundle: DataBundle) -> DataBundle:
    """Read one sample of each split now, so a broken file is a clear error before training starts."""
    for ds in (bundle.train, bundle.test):
        if len(ds) == 0:  # type: ignore[arg-type]
            raise ValueError("a split holds no samples")
        x, _ = ds[0]
        if tuple(x.shape) != bundle.input_shape:
            raise ValueError(f"samples of shape {tuple(x.shape)}, expected {bundle.input_shape}")
    return bundle


#: the loader of every dataset named in :data:`dpcompare.data.catalog.DATASETS`
LOADERS: dict[str, Callable[..., DataBundle]] = {name: globals()[fn] for name, (fn, _) in DATASETS.items()}


def build_dataset(name: str, data_dir: str | None = None, shape: tuple[int, ...] = (3, 32, 32),
                  samples: int = 1024, augment: bool = False) -> DataBundle:
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
    if augment and name not in AUGMENTABLE:
        raise ConfigError(f"--augment (random crop + horizontal flip) is for {' and '.join(AUGMENTABLE)}, "
                          f"not --dataset {name}")
    return LOADERS[name](data_dir=data_dir, shape=shape, samples=samples, augment=augment)


class _EpochSampler(DistributedSampler):
    """A DistributedSampler that also passes (seed, epoch) to a :class:`SeededAugment` dataset, and can start
    an epoch part-way (:meth:`start_at`)."""

    def __init__(self, ds: Dataset, **kw: Any) -> None:
        super().__init__(ds, **kw)
        self.position = 0
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.position = 0
        if isinstance(self.dataset, SeededAugment):
            self.dataset.set_epoch(self.seed, epoch)

    def start_at(self, position: int) -> None:
        """Leave out the epoch's first ``position`` samples (those a run already trained on, at any world size).

        The epoch's order is DistributedSampler's (a permutation seeded by seed + epoch); the global batch of a
        step is a contiguous slice of it, so after ``position`` samples the rest is split among this world's
        ranks as DistributedSampler splits a whole epoch (rank r takes every N-th, the tail that does not fill
        all ranks dropped). This is Horovod's ElasticSampler's idea on dpcompare's order, so that an elastic run,
        a resumed one and one that never stopped see the same samples in the same global batches.
        """
        self.position = position

    def __iter__(self) -> Any:
        if not self.position:
            return super().__iter__()
        return iter(self._rest()[self.rank::self.num_replicas])

    def __len__(self) -> int:
        return super().__len__() if not self.position else len(self._rest()) // self.num_replicas

    def _rest(self) -> list[int]:
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        rest = torch.randperm(len(self.dataset), generator=g).tolist()[self.position:]  # type: ignore[arg-type]
        return rest[:len(rest) // self.num_replicas * self.num_replicas]


def train_loader(ds: Dataset, batch_size: int, rank: int, world_size: int, seed: int,
                 workers: int = 0, collate: Callable[[list[Any]], Any] | None = None
                 ) -> tuple[DataLoader, DistributedSampler]:
    sampler = _EpochSampler(ds, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True)
    if len(sampler) < batch_size:
        raise ConfigError(f"--batch-size {batch_size} is larger than the {len(sampler)} training samples each of "
                          f"the {world_size} processes gets; use a smaller batch")
    loader = DataLoader(ds, batch_size=batch_size, sampler=sampler, drop_last=True, num_workers=workers,
                        collate_fn=collate)
    return loader, sampler


class Samplers:
    """Several samplers moved to the next epoch together (:class:`ReplayLoader`'s)."""

    def __init__(self, samplers: list[DistributedSampler]) -> None:
        self.samplers = samplers

    def set_epoch(self, epoch: int) -> None:
        for s in self.samplers:
            s.set_epoch(epoch)

    def start_at(self, position: int) -> None:
        """Every rank's sampler leaves out the epoch's first ``position`` samples (a resumed run)."""
        for s in self.samplers:
            s.start_at(position)


class ReplayLoader:
    """The batches ``ranks`` processes would take, in one process: for each step, rank 0's ``accumulate``
    micro-batches, then rank 1's, and so on (each rank's loader as :func:`train_loader` builds it there).

    Each process's DataLoader draws one number from the global random stream when it starts an epoch; here only
    rank 0's draws (the others start under a forked stream), so the stream advances as it does in each process.
    """

    def __init__(self, loaders: list[DataLoader], accumulate: int) -> None:
        self.loaders, self.accumulate = loaders, accumulate

    def __len__(self) -> int:
        return len(self.loaders) * (len(self.loaders[0]) // self.accumulate) * self.accumulate

    def __iter__(self) -> Any:
        its = [iter(self.loaders[0])]
        with torch.random.fork_rng(devices=[]):
            its += [iter(loader) for loader in self.loaders[1:]]
        for _ in range(len(self.loaders[0]) // self.accumulate):
            for it in its:
                for _ in range(self.accumulate):
                    yield next(it)


def replay_loader(ds: Dataset, batch_size: int, ranks: int, accumulate: int, seed: int,
                  collate: Callable[[list[Any]], Any] | None = None) -> tuple[ReplayLoader, Samplers]:
    """:class:`ReplayLoader` over ``ranks`` processes' loaders (``accumulate`` micro-batches each per step)."""
    pairs = [train_loader(ds, batch_size, r, ranks, seed, collate=collate) for r in range(ranks)]
    return ReplayLoader([lo for lo, _ in pairs], accumulate), Samplers([s for _, s in pairs])


def eval_loader(ds: Dataset, rank: int, world_size: int, batch_size: int = 512,
                collate: Callable[[list[Any]], Any] | None = None) -> DataLoader:
    return DataLoader(Subset(ds, range(rank, len(ds), world_size)), batch_size=batch_size, shuffle=False,
                      collate_fn=collate)
