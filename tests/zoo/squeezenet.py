"""torchvision's SqueezeNet 1.1 by name (not a ResNet: fire modules, dropout before its convolutional classifier),
with 5 classes, on small synthetic images, as a user writes a plug-in.

    dpcompare parity --np 2 --strategies ddp,horovod,zero,fsdp --workload tests/zoo/squeezenet.py:workload
"""

import torch
import torch.nn.functional as F
import torchvision

from dpcompare.data.workload import Metric, Workload

CLASSES, SIDE = 5, 32


def images(n: int, seed: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    x = torch.randn(n, 3, SIDE, SIDE, generator=g) * 0.5 + y.view(-1, 1, 1, 1) * 0.2  # brighter for higher classes
    return torch.utils.data.TensorDataset(x, y)


def accuracy(logits, y):
    return float((logits.argmax(1) == y).sum()), len(y)


def workload() -> Workload:
    return Workload("squeezenet1_1", build_model=lambda: torchvision.models.squeezenet1_1(num_classes=CLASSES),
                    build_data=lambda: (images(256, 0), images(64, 1)), loss=F.cross_entropy,
                    metrics=(Metric("accuracy", True, accuracy, unit="%"),))
