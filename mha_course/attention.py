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
    weights = attention_weights(q, k, mask, scale=scale)  # (..., Lq, Lk)
    return weights @ v, weights  # (..., Lq, d_v), (..., Lq, Lk)


def attention_weights(q, k, mask=None, *, scale=None):
    """softmax(Q Kᵀ · scale) with the mask applied: the weights of
    :func:`scaled_dot_product_attention`, for inputs that were already checked (this function
    checks nothing: callers validate once, at their public boundary).

    q (..., Lq, d_k), k (..., Lk, d_k), mask bool broadcastable to (..., Lq, Lk), True = may
    attend. Returns (..., Lq, Lk); a row with no allowed key is all 0.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    q = q * scale  # (..., Lq, d_k): scaling q is scaling every score, with Lq·d_k multiplications
    scores = q @ k.transpose(-2, -1)  # (..., Lq, d_k) @ (..., d_k, Lk) -> (..., Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # (..., Lq, Lk): a blocked key gets e^-inf = 0
    weights = torch.softmax(scores, dim=-1)  # (..., Lq, Lk), each row sums to 1
    if mask is not None:
        # a row with no allowed key is softmax(-inf, ..., -inf) = NaN: define it as "attend to nothing"
        attends_to_nothing = ~mask.any(dim=-1, keepdim=True)  # (..., Lq, 1)
        weights = weights.masked_fill(attends_to_nothing, 0.0)  # (..., Lq, Lk)
    return weights
