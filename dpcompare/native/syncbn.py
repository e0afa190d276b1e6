"""``hvd.SyncBatchNorm``: batch statistics over every rank's batch, on torch's own synchronised batch norm.

Like Horovod's, it takes GPU input only (torch's kernels for it exist for CUDA) and refuses CPU input even in
evaluation mode, so a script fails alike under both.
"""

from __future__ import annotations

import torch


class SyncBatchNorm(torch.nn.SyncBatchNorm):
    """Horovod's constructor (``num_features, eps, momentum, affine, track_running_stats``) on
    ``torch.nn.SyncBatchNorm``, for any input with at least two dimensions."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not input.is_cuda:
            raise ValueError("SyncBatchNorm expected input tensor to be on GPU")
        return super().forward(input)
