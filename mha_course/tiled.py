"""Tiled attention with an online softmax: the idea of FlashAttention's forward pass, in plain PyTorch.

Ordinary attention builds the whole (Lq, Lk) score matrix, softmaxes it and multiplies by V, so its
memory grows with Lq·Lk. Tiled attention walks over the keys in blocks and keeps, per query, only a
running maximum ``m``, a running sum ``ℓ`` and a running, unnormalised output ``acc``
(:func:`online_softmax_update`); the only scores in memory are one (block × block) tile. The result
is the same function, exactly — not an approximation.

References: Milakov & Gimelshein, "Online normalizer calculation for softmax" (2018,
arXiv:1805.02867); Rabe & Staats, "Self-attention does not need O(n²) memory" (2021,
arXiv:2112.05682); Dao et al., "FlashAttention" (NeurIPS 2022, arXiv:2205.14135), which also fuses
the loop into one GPU kernel so the tiles never leave on-chip memory; Dao, "FlashAttention-2" (2023,
arXiv:2307.08691), whose loop order this is (query blocks outer, key/value blocks inner, one division
at the end). Here the loop is Python, so it saves memory, not time.
"""

from __future__ import annotations

import math

import torch

from . import validation

NEG_INF = float("-inf")


def online_softmax_update(row_max, row_sum, acc, scores, v):
    """Fold one block of keys into the running softmax state of each query row.

    Shapes (``...`` = batch dims, e.g. (B, h)):
        row_max: (..., Lq, 1)   m, the max of the scores seen so far (-inf before the first block)
        row_sum: (..., Lq, 1)   ℓ, the sum of exp(score - m) over those scores
        acc:     (..., Lq, d_v) the sum of exp(score - m) · v_j over those keys (not divided by ℓ)
        scores:  (..., Lq, Bk)  this block's scores, already scaled; -inf where masked
        v:       (..., Bk, d_v) this block's values
    Returns ``(row_max, row_sum, acc)`` updated, same shapes. After the last block,
    ``acc / row_sum`` is softmax(all scores) @ V. A row whose scores are all -inf so far keeps
    m = -inf, ℓ = 0 and acc = 0 (never NaN).
    """
    m_new = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))  # (..., Lq, 1)
    # a row that has seen only -inf has m_new = -inf, and exp(-inf - (-inf)) is NaN: subtract 0 there
    m_safe = m_new.masked_fill(m_new == NEG_INF, 0.0)
    alpha = torch.exp(row_max - m_safe)  # rescales the old state to the new max (0 before the first block)
    p = torch.exp(scores - m_safe)  # (..., Lq, Bk) this block's unnormalised weights
    return m_new, alpha * row_sum + p.sum(dim=-1, keepdim=True), alpha * acc + p @ v


def merge_partials(out_a, lse_a, out_b, lse_b):
    """Merge two partial attention results for the same queries over disjoint sets of keys.

    A partial result is what attention over only some keys gives: ``out`` = softmax over those
    keys @ their values, and ``lse`` = log Σ exp(score) over those keys (FlashAttention returns
    both). Shapes: out_a, out_b (..., Lq, d_v); lse_a, lse_b (..., Lq), -inf (and out 0) for a
    query that had no allowed key in that set. Returns ``(out, lse)`` over the union of the keys.

    It is one more :func:`online_softmax_update`: each partial acts as a single key whose score is
    its ``lse`` and whose value is its ``out`` (each query is its own batch entry, so one "key" per
    query). Ring attention merges the blocks that reach a rank this way.
    """
    lse_a, lse_b = lse_a[..., None, None], lse_b[..., None, None]  # (..., Lq, 1, 1): one key per query
    row_sum = (lse_a > NEG_INF).to(out_a.dtype)  # the state after partial a, with m = lse_a: ℓ = 1 (0 if no key)
    acc = out_a[..., None, :] * row_sum  # (..., Lq, 1, d_v)
    m, total, acc = online_softmax_update(lse_a, row_sum, acc, lse_b, out_b[..., None, :])
    out = torch.where(total > 0, acc / total, 0.0)[..., 0, :]  # (..., Lq, d_v)
    return out, (m + torch.log(total))[..., 0, 0]  # lse (..., Lq): -inf where neither saw a key


def tiled_attention(q, k, v, mask=None, *, scale=None, block_size: int = 64, return_lse: bool = False):
    """softmax(Q Kᵀ · scale) V computed tile by tile, never holding more than one
    (..., block_size, block_size) tile of scores.

    Shapes as :func:`mha_course.scaled_dot_product_attention`: q (..., Lq, d_k), k (..., Lk, d_k),
    v (..., Lk, d_v), leading dims broadcast; mask bool broadcastable to (..., Lq, Lk),
    True = may attend; scale defaults to 1/√d_k. Returns out (..., Lq, d_v) — the weights are
    never formed. A tile whose mask is all False (above a causal diagonal, outside a sliding
    window) is skipped. A query row with no allowed key gives 0, as in the reference.

    ``return_lse=True`` returns ``(out, lse)`` instead, with lse (..., Lq, 1) = log Σ_j exp(s_ij),
    the log-sum-exp of each query's scaled scores (-inf for a row with no allowed key): all that
    FlashAttention's backward keeps of the softmax (:mod:`mha_course.backward`).
    """
    batch, Lq, Lk = _check(q, k, v, mask)
    validation.positive_int("block_size", block_size)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if mask is not None:
        mask = torch.broadcast_to(mask, (*batch, Lq, Lk))  # a view with stride 0: no memory
    q, k, v = (t.expand(*batch, *t.shape[-2:]) for t in (q, k, v))
    out = q.new_empty((*batch, Lq, v.shape[-1]))
    lse = q.new_empty((*batch, Lq, 1)) if return_lse else None
    for i in range(0, Lq, block_size):
        qi = q[..., i : i + block_size, :] * scale  # (..., bq, d_k)
        row_max = qi.new_full((*qi.shape[:-1], 1), NEG_INF)  # (..., bq, 1)
        row_sum = qi.new_zeros((*qi.shape[:-1], 1))  # (..., bq, 1)
        acc = qi.new_zeros((*qi.shape[:-1], v.shape[-1]))  # (..., bq, d_v)
        for j in range(0, Lk, block_size):
            tile = None if mask is None else mask[..., i : i + block_size, j : j + block_size]
            if tile is not None and not tile.is_meta and not tile.any():
                continue  # nothing to attend to in this tile: skip its work entirely, scores included
            s = qi @ k[..., j : j + block_size, :].transpose(-2, -1)  # (..., bq, bk): the only scores held
            if tile is not None:
                s = s.masked_fill(~tile, NEG_INF)
            row_max, row_sum, acc = online_softmax_update(row_max, row_sum, acc, s, v[..., j : j + block_size, :])
        # row_sum = 0 only in a row with no allowed key (else its max adds e⁰ = 1): output 0 there
        out[..., i : i + block_size, :] = torch.where(row_sum > 0, acc / row_sum, 0.0)
        if return_lse:  # log Σ exp(s) = m + log ℓ; ℓ = 0 (no allowed key) gives log 0 = -inf
            lse[..., i : i + block_size, :] = row_max.masked_fill(row_sum == 0, 0.0) + torch.log(row_sum)
    return (out, lse) if return_lse else out


def tile_counts(mask, block_size: int) -> tuple[int, int, int]:
    """How :func:`tiled_attention` treats the tiles of a (Lq, Lk) mask: returns
    ``(computed, skipped, total)``; a tile is skipped when its mask is all False."""
    states = tile_states(mask, block_size)
    computed = int((states > 0).sum())
    return computed, states.numel() - computed, states.numel()


def tile_states(mask, block_size: int) -> torch.Tensor:
    """int64 (⌈Lq/b⌉, ⌈Lk/b⌉): 0 = tile skipped (all masked), 1 = partly masked, 2 = fully allowed."""
    validation.tensor("mask", mask, dims=2)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be bool (True = may attend), got {mask.dtype}")
    validation.positive_int("block_size", block_size)
    rows = range(0, mask.shape[0], block_size)
    cols = range(0, mask.shape[1], block_size)
    states = torch.zeros(len(rows), len(cols), dtype=torch.long)
    for a, i in enumerate(rows):
        for b, j in enumerate(cols):
            tile = mask[i : i + block_size, j : j + block_size]
            states[a, b] = 2 if tile.all() else int(bool(tile.any()))
    return states


def _check(q, k, v, mask):
    """Validate like :func:`mha_course.scaled_dot_product_attention`; return (batch, Lq, Lk)."""
    *batch, Lq, Lk = validation.attention_inputs(q, k, v, mask)
    return tuple(batch), Lq, Lk
