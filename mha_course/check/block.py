"""Checker of notebook 10's exercise: a pre-norm decoder block (Llama's layout) from its parts.

``fn(x, parts, mask=None) -> (B, L, d_model)``, with ``parts`` an ``nn.ModuleDict``: ``"attn"``
(an ``mc.MultiHeadAttention``, called as ``attn(h, mask=mask)`` -> ``(out, weights)``), ``"norm1"``
and ``"norm2"`` (``nn.RMSNorm``), and the SwiGLU feed-forward's ``"gate"``, ``"up"`` and ``"down"``
(``nn.Linear`` without bias). The reference: x + attn(norm1(x)), then + down(silu(gate(h)) · up(h))
with h = norm2 of the stream. The parts have random norm weights, so norm1 and norm2 differ.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..masks import causal_mask, padding_mask
from ..multihead import MultiHeadAttention
from .framework import Case, CheckResult, mistakes, run_check, tensor_generator

__all__ = ["pre_norm_block"]


def _attn(parts, h, mask):
    return parts["attn"](h, mask=mask)[0]  # (B, L, d_model)


def _swiglu(parts, h):
    return parts["down"](F.silu(parts["gate"](h)) * parts["up"](h))  # (B, L, d_model)


def _reference(x, parts, mask=None):
    x = x + _attn(parts, parts["norm1"](x), mask)
    return x + _swiglu(parts, parts["norm2"](x))


def _post_norm(x, parts, mask=None):
    x = parts["norm1"](x + _attn(parts, x, mask))
    return parts["norm2"](x + _swiglu(parts, x))


def _stream_normalised(x, parts, mask=None):
    x = parts["norm1"](x)
    x = x + _attn(parts, x, mask)
    x = parts["norm2"](x)
    return x + _swiglu(parts, x)


def _one_norm(x, parts, mask=None):
    x = x + _attn(parts, parts["norm1"](x), mask)
    return x + _swiglu(parts, parts["norm1"](x))


def _silu_on_up(x, parts, mask=None):
    x = x + _attn(parts, parts["norm1"](x), mask)
    h = parts["norm2"](x)
    return x + parts["down"](parts["gate"](h) * F.silu(parts["up"](h)))


def _no_gate(x, parts, mask=None):
    x = x + _attn(parts, parts["norm1"](x), mask)
    return x + parts["down"](F.silu(parts["up"](parts["norm2"](x))))


def _no_residual(x, parts, mask=None):
    x = x + _attn(parts, parts["norm1"](x), mask)
    return _swiglu(parts, parts["norm2"](x))


def _mask_ignored(x, parts, mask=None):
    return _reference(x, parts, None)


PRE_NORM_BLOCK_MISTAKES = mistakes(
    "pre_norm_block",
    {
        "post-norm": _post_norm,
        "stream normalised": _stream_normalised,
        "one norm for both": _one_norm,
        "silu on up": _silu_on_up,
        "no gate": _no_gate,
        "no residual": _no_residual,
        "mask ignored": _mask_ignored,
    },
)


def make_parts(d_model: int, num_heads: int, d_ff: int, generator: torch.Generator) -> nn.ModuleDict:
    """Random parts of a Llama-style block (the norms' weights away from 1, so each norm matters)."""
    parts = nn.ModuleDict(
        {
            "attn": MultiHeadAttention(d_model, num_heads, bias=False),
            "norm1": nn.RMSNorm(d_model, eps=1e-6),
            "norm2": nn.RMSNorm(d_model, eps=1e-6),
            "gate": nn.Linear(d_model, d_ff, bias=False),
            "up": nn.Linear(d_model, d_ff, bias=False),
            "down": nn.Linear(d_ff, d_model, bias=False),
        }
    )
    with torch.no_grad():
        for p in parts.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=generator) / p.shape[1] ** 0.5)
            else:  # a norm's weight
                p.copy_(0.5 + torch.rand(p.shape, generator=generator))
    return parts.eval()


def pre_norm_block(fn) -> CheckResult:
    """Check ``fn(x, parts, mask=None) -> (B, L, d_model)``: a pre-norm block with RMSNorm and a
    SwiGLU feed-forward, as Llama's decoder layer, built from ``parts`` (see the module docstring)."""
    g = tensor_generator()
    specs = [  # (B, L, d_model, h, d_ff, mask kind, description)
        (2, 5, 16, 4, 32, "causal", "causal mask, B=2, L=5"),
        (3, 6, 12, 3, 20, "padding", "padding mask, three lengths"),
        (1, 4, 8, 2, 24, None, "no mask"),
        (2, 7, 16, 2, 40, "both", "causal and padding"),
    ]
    cases = []
    for B, L, d, h, d_ff, kind, text in specs:
        x = 3.0 * torch.randn(B, L, d, generator=g)  # far from unit RMS, so a missing norm shows
        parts = make_parts(d, h, d_ff, g)
        lengths = [L - (i % 3) for i in range(B)]
        mask = {
            None: None,
            "causal": causal_mask(L),
            "padding": padding_mask(lengths, L),
            "both": causal_mask(L) & padding_mask(lengths, L),
        }[kind]
        cases.append(Case((x, parts, mask), description=text))
    with torch.no_grad():
        return run_check(
            "pre_norm_block",
            fn,
            cases,
            _reference,
            PRE_NORM_BLOCK_MISTAKES,
            arg_names=("x", "parts", "mask"),
            output_label="output",
        )
