"""Scaled dot-product attention: the single-head computation every other module builds on."""

from __future__ import annotations

import math

import torch

from . import validation


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
    validation.attention_inputs(q, k, v, mask)  # shapes, dtypes and the mask, or a clear error
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])

    # (..., Lq, Lk); the scale is folded into q (Lq·d_k mults, not Lq·Lk), skipped when it is 1
    scores = (q if scale == 1.0 else q * scale) @ k.transpose(-2, -1)
    # The L×L buffer dominates the cost: fill and normalise it in place where that is safe.
    if mask is not None:
        if torch.broadcast_shapes(mask.shape, scores.shape) == scores.shape:
            scores.masked_fill_(~mask, float("-inf"))  # a fresh tensor; matmul's backward never needs it
        else:  # v's batch dims (and the mask's) are wider than q's and k's
            scores = scores.masked_fill(~mask, float("-inf"))
    if scores.requires_grad:
        weights = torch.softmax(scores, dim=-1)  # (..., Lq, Lk)
    else:  # no autograd: overwrite the scores rather than allocate a second L×L tensor
        weights = torch.softmax(scores, dim=-1, out=scores)
    if mask is not None:
        # a row with no allowed key is softmax(-inf, ..., -inf) = NaN: define it as "attend to nothing"
        dead = ~mask.any(dim=-1, keepdim=True)
        if dead.is_meta or dead.any():  # (a meta tensor has no values to test)
            weights = weights.masked_fill(dead, 0.0)
    return weights @ v, weights  # (..., Lq, d_v), (..., Lq, Lk)
