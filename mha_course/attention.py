"""Scaled dot-product attention: the single-head computation every other module builds on."""

from __future__ import annotations

import math

import torch

from . import _validate


def scaled_dot_product_attention(q, k, v, mask=None, *, scale=None):
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V, returning the output and the weights.

    Shapes (any leading batch dims ``...`` that broadcast against each other):
        q:    (..., Lq, d_k)   one query vector per position that asks
        k:    (..., Lk, d_k)   one key vector per position that can be found
        v:    (..., Lk, d_v)   the content each key position hands over
        mask: bool, broadcastable to (..., Lq, Lk); True = this query may attend to this key
        scale: multiplies the scores; default 1/√d_k
    Returns:
        out:     (..., Lq, d_v)  weights @ v
        weights: (..., Lq, Lk)   each row sums to 1 (0 for a fully masked row)

    A query row whose mask is all False attends to nothing: its weights and its output are 0,
    never NaN. Equivalent to ``torch.nn.functional.scaled_dot_product_attention`` (which returns
    only the output) on rows that have at least one allowed key.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _validate.tensor(name, t, floating=True)
        if t.dim() < 2:
            raise ValueError(f"{name} must be at least 2-D (..., L, d), got shape {tuple(t.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same last dim d_k, got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same length Lk (dim -2), got k {tuple(k.shape)} and v {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    try:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"batch dims of q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not broadcast"
        ) from None
    scores_shape = (*batch, q.shape[-2], k.shape[-2])
    if mask is not None:
        _validate.bool_mask(mask, scores_shape)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])

    scores = (q * scale) @ k.transpose(-2, -1)  # (..., Lq, Lk); scale folded into q: Lq·d_k mults
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (..., Lq, Lk)
    if mask is not None:
        # a row with no allowed key is softmax(-inf, ..., -inf) = NaN: define it as "attend to nothing"
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return weights @ v, weights  # (..., Lq, d_v), (..., Lq, Lk)
