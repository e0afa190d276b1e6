"""A transformer recipe's own optimizer, schedule and clipping, as a dpcompare workload.

The usual recipe: AdamW with weight decay on the matrices only (no decay on biases, LayerNorm weights or the
position table), a linear warm-up then a cosine decay per optimizer step, gradients clipped at a global norm
of 1.0. The workload brings all three (``build_optimizer``, ``build_scheduler``, ``clip_grad_norm``), so every
strategy steps exactly this way; ``dpcompare parity`` checks they still agree to the bit.

    mpirun -np 2 dpcompare train --strategy horovod --workload examples/transformer_recipe.py:workload --epochs 1
    dpcompare parity --np 2 --strategies ddp,horovod,zero,fsdp --workload examples/transformer_recipe.py:workload \\
        --steps 20 --no-single
    dpcompare compare --np 2 --strategies ddp,horovod --workload examples/transformer_recipe.py:workload --epochs 1
"""
import dataclasses

import torch
from torch.optim import lr_scheduler

from dpcompare.config import TrainConfig
from dpcompare.data.text import text_workload

WARMUP = 20


def optimizer(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    """AdamW: decay on 2-D weights except the position table; none on biases, norms or positions."""
    decay, rest = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 and "wpe" not in name else rest).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def schedule(opt: torch.optim.Optimizer, total_steps: int) -> lr_scheduler.LRScheduler:
    """Linear warm-up over WARMUP steps, then cosine down to a tenth of the peak, once per optimizer step."""
    peak = opt.param_groups[0]["lr"]
    warm = lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=WARMUP)
    cosine = lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, total_steps - WARMUP), eta_min=peak / 10)
    return lr_scheduler.SequentialLR(opt, [warm, cosine], milestones=[WARMUP])


def workload(cfg: TrainConfig):
    """gpt-tiny on the Python reference's bytes (--seq-len, --seed as given), with the recipe above."""
    base = text_workload(dataclasses.replace(cfg, model="gpt-tiny", dataset="pydoc"))
    info = {k: v for k, v in base.info.items() if k not in ("model", "dataset")}  # named by its own name
    return dataclasses.replace(base, name="gpt-tiny recipe", info=info, build_optimizer=optimizer,
                               build_scheduler=schedule, clip_grad_norm=1.0)
