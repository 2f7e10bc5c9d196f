"""Splitting the model width into heads and merging it back (feature space, never tokens)."""

from __future__ import annotations

from . import validation


def split_heads(x, num_heads: int):
    """(B, L, h*d_head) -> (B, h, L, d_head): head i gets feature columns [i*d_head, (i+1)*d_head).

    Every head keeps all L positions; only the feature dim is divided. Equivalent to
    ``x.view(B, L, h, d_head).transpose(1, 2)`` — a ``view(B, h, L, d_head)`` without the
    transpose would instead deal consecutive *tokens* out to the heads.
    """
    validation.tensor("x", x, dims=3)
    validation.positive_int("num_heads", num_heads)
    B, L, D = x.shape
    d_head = validation.divisible(D, num_heads)
    return x.reshape(B, L, num_heads, d_head).transpose(1, 2)  # (B, L, h, d_head) -> (B, h, L, d_head)


def merge_heads(x):
    """(B, h, L, d_head) -> (B, L, h*d_head): the inverse of :func:`split_heads` (concatenate heads)."""
    validation.tensor("x", x, dims=4)
    B, h, L, d_head = x.shape
    return x.transpose(1, 2).reshape(B, L, h * d_head)  # (B, L, h, d_head) -> (B, L, h*d_head)
