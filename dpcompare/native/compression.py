"""Horovod's gradient compression: what goes on the wire, and how it comes back.

``Compression.fp16`` casts floating tensors to float16 before the all-reduce and back to their own dtype after it,
so the sum and the averaging happen in float16 (DDP's ``fp16_compress_hook`` divides before the sum instead).
"""

from __future__ import annotations

from typing import Any

import torch


class Compressor:
    """Interface: ``compress(tensor) -> (wire tensor, context)``, ``decompress(wire tensor, context) -> tensor``."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """The tensor as it is."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Floating tensors travel as float16; others as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        wire = tensor.to(torch.float16) if tensor.dtype.is_floating_point else tensor
        return wire, tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor.to(ctx) if ctx.is_floating_point else tensor


class Compression:
    """``hvd.Compression.none`` (the default) and ``hvd.Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
