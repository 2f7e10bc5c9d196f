"""Scaled dot-product attention: the single-head computation every other module builds on."""

from __future__ import annotations

import math

import torch

from . import validation


def scaled_dot_product_attention(q, k, v, mask=None, *, scale=None, sinks=None, softcap=None):
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V, returning the output and the weights.

    Shapes (any leading batch dims ``...`` that broadcast against each other):
        q:    (..., Lq, d_k)   one query vector per position that asks
        k:    (..., Lk, d_k)   one key vector per position that can be found
        v:    (..., Lk, d_v)   the content each key position hands over
        mask: bool, broadcastable to (..., Lq, Lk); True = this query may attend to this key
        scale: multiplies the scores; default 1/√d_k
        sinks: optional (h,) float, one learned logit per head (gpt-oss's "attention sink"):
               the heads are dim -3 of the scores (..., h, Lq, Lk). Each row's softmax runs
               over its Lk scores *and* that head's sink logit; the sink's share is dropped,
               so the weights over the real keys sum to less than 1 and a row may attend to
               (almost) nothing: softmax([s_1 .. s_Lk, sink])[:Lk].
        softcap: optional positive float c (Gemma 2's ``attn_logit_softcapping``): every scaled
               score s becomes c · tanh(s / c), a smooth clamp into (−c, c), *before* the mask;
               the order is scale, cap, mask, softmax, as in Gemma 2's eager attention.
    Returns:
        out:     (..., Lq, d_v)  weights @ v
        weights: (..., Lq, Lk)   each row sums to 1 (less with sinks; 0 for a fully masked row)

    A query row whose mask is all False attends to nothing: its weights and its output are 0,
    never NaN. Equivalent to ``torch.nn.functional.scaled_dot_product_attention`` (which returns
    only the output) on rows that have at least one allowed key.
    """
    scores_shape = validation.attention_inputs(q, k, v, mask)  # shapes, dtypes, mask, or an error
    if sinks is not None:
        validation.tensor("sinks", sinks, dims=1, floating=True)
        if len(scores_shape) < 3 or scores_shape[-3] != sinks.shape[0]:
            raise ValueError(
                f"sinks must hold one logit per head, the scores' dim -3: scores {scores_shape}, "
                f"got sinks {tuple(sinks.shape)}"
            )
    softcap = validation.softcap(softcap)
    weights = attention_weights(q, k, mask, scale=scale, sinks=sinks, softcap=softcap)  # (..., Lq, Lk)
    return weights @ v, weights  # (..., Lq, d_v), (..., Lq, Lk)


def attention_weights(q, k, mask=None, *, scale=None, sinks=None, softcap=None):
    """softmax(Q Kᵀ · scale) with the mask applied (the scores soft-capped and each head's sink logit
    joining the softmax, if given): the weights of
    :func:`scaled_dot_product_attention`, for inputs that were already checked (this function
    checks nothing: callers validate once, at their public boundary).

    q (..., Lq, d_k), k (..., Lk, d_k), mask bool broadcastable to (..., Lq, Lk), True = may
    attend. Returns (..., Lq, Lk); a row with no allowed key is all 0.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    q = q * scale  # (..., Lq, d_k): scaling q is scaling every score, with Lq·d_k multiplications
    scores = q @ k.transpose(-2, -1)  # (..., Lq, d_k) @ (..., d_k, Lk) -> (..., Lq, Lk)
    if softcap is not None:  # before the mask: tanh(-inf) would turn a blocked key into -c, allowed again
        scores = softcap * torch.tanh(scores / softcap)  # (..., Lq, Lk), each in (-softcap, softcap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # (..., Lq, Lk): a blocked key gets e^-inf = 0
    if sinks is None:
        weights = torch.softmax(scores, dim=-1)  # (..., Lq, Lk), each row sums to 1
    else:  # one extra logit per head joins every row's softmax, then leaves with its share
        sink = sinks.to(scores.dtype)[:, None, None].expand(*scores.shape[:-1], 1)  # (..., h, Lq, 1)
        with_sink = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)  # (..., Lq, Lk + 1)
        weights = with_sink[..., :-1]  # (..., Lq, Lk): each row sums to 1 − the sink's share
    if mask is not None:
        # a row with no allowed key is softmax(-inf, ..., -inf) = NaN: define it as "attend to nothing"
        attends_to_nothing = ~mask.any(dim=-1, keepdim=True)  # (..., Lq, 1)
        weights = weights.masked_fill(attends_to_nothing, 0.0)  # (..., Lq, Lk)
    return weights
