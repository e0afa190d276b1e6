"""The run configuration shared by ``train``, ``parity`` and ``compare``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainConfig:
    strategy: str = "single"
    model: str = "convnet"
    dataset: str = "digits"
    epochs: int = 5
    batch_size: int = 32  # per process
    lr: float = 0.05
    scale_lr: bool = False  # multiply lr by the world size (one policy, applied to every strategy)
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 0.0
    seed: int = 42
    out: str = "runs/latest"
    data_dir: str | None = None
    width: int = 256
    input_shape: tuple[int, ...] = (3, 32, 32)
    samples: int = 1024
    augment: bool = False  # random crop + flip of cifar10/imagefolder, seeded by (seed, epoch, index)
    device: str = "auto"
    threads: int = 0  # 0: cores / processes on this host
    sync_bn: bool = False
    checkpoint_every: int = 0
    save_final: bool = False
    resume: str | None = None
    init_from: str | None = None
    overwrite: bool = False
    max_steps: int = 0  # stop after this many optimizer steps (0: run all epochs)
    warmup_steps: int = 5  # excluded from timing
    record_step_loss: bool = False
    tensorboard: bool = True
    progress: str = "auto"
    iface: str | None = None
    timeout: float = 300.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["input_shape"] = list(self.input_shape)
        return d



# Settings whose change on resume is worth a line (others, like --out or --resume, are expected to differ).
RESUME_RELEVANT = ("strategy", "world_size", "model", "dataset", "batch_size", "lr", "scale_lr", "optimizer",
                   "momentum", "weight_decay", "seed", "width", "sync_bn", "device")
