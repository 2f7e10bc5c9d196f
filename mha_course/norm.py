"""RMSNorm: the normalisation of Llama-style decoders, and of queries and keys per head (QK-norm)."""

from __future__ import annotations

import torch
from torch import nn

from . import validation as _validate


class RMSNorm(nn.Module):
    """Root-mean-square normalisation (Zhang & Sennrich 2019): x / sqrt(mean(x²) + eps) · weight.

    Unlike LayerNorm there is no mean subtraction and no bias. x (..., d) -> (..., d).
    ``compute_dtype``: the dtype of the normalisation itself; float32 (default) as in Llama's
    reference code (``self._norm(x.float()).type_as(x)``), which keeps bf16 models accurate;
    None computes in x's own dtype (equal to ``torch.nn.RMSNorm``).
    """

    def __init__(self, d: int, eps: float = 1e-6, *, compute_dtype: torch.dtype | None = torch.float32):
        super().__init__()
        _validate.positive_int("d", d)
        self.eps, self.compute_dtype = eps, compute_dtype
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x if self.compute_dtype is None else x.to(self.compute_dtype)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)  # (..., d)
        return self.weight * x.to(dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
