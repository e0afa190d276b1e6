"""Every dataset by name, with one line for ``--help``, without importing torch or numpy.

:mod:`dpcompare.data.datasets` looks each loader up by the function name given here.
"""

from __future__ import annotations

#: name → (its loader in dpcompare/data.py, one line for --help)
DATASETS: dict[str, tuple[str, str]] = {
    "digits": ("_digits", "scikit-learn's bundled 8x8 digits (1437 train / 360 test), offline"),
    "synthetic": ("_synthetic", "fixed random tensors of --input-shape, like Horovod's synthetic benchmark"),
    "mnist": ("_mnist", "MNIST from --data-dir/MNIST/raw (torchvision's layout, uncompressed idx files)"),
    "cifar10": ("_cifar10", "CIFAR-10 from --data-dir/cifar-10-batches-py (torchvision's layout)"),
    "imagefolder": ("_imagefolder", "your images in --data-dir/train/<class>/ and val/<class>/ (or test/), "
                                    "resized to --input-shape H,W"),
}


#: text datasets for the language models (gpt-*, hf:NAME): name → (its loader in dpcompare/data/text.py, one line)
TEXT_DATASETS: dict[str, tuple[str, str]] = {
    "pydoc": ("pydoc_corpus", "the Python reference's help texts that ship with CPython (pydoc_data/topics.py, "
                              "79 topics, ~0.47 M bytes of English), bytes as tokens, the last tenth of each "
                              "topic for test; offline"),
    "tokens": ("random_tokens", "--samples fixed random byte sequences of --seq-len, for throughput"),
}
