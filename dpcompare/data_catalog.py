"""Every dataset by name, with one line for ``--help``, without importing torch or numpy.

:mod:`dpcompare.data` holds the loaders, keyed by these names (it checks that the two tables agree).
"""

from __future__ import annotations

DATASETS: dict[str, str] = {
    "digits": "scikit-learn's bundled 8x8 digits (1437 train / 360 test), offline",
    "synthetic": "fixed random tensors of --input-shape, like Horovod's synthetic benchmark",
    "mnist": "MNIST from --data-dir/MNIST/raw (torchvision's layout, uncompressed idx files)",
    "cifar10": "CIFAR-10 from --data-dir/cifar-10-batches-py (torchvision's layout)",
    "imagefolder": "your images in --data-dir/train/<class>/ and val/<class>/ (or test/), resized to --input-shape H,W",
}


def names() -> list[str]:
    return list(DATASETS)
