"""Attention dropout in FlashAttention's tiled forward and backward: the mask is never stored.

With dropout on the weights (rate p, kept weights scaled by 1/(1 − p))::

    P = softmax(S)      P̃ = P ⊙ Z / (1 − p),  Z ~ Bernoulli(1 − p) per (query, key)      O = P̃ V

the backward needs Z again: dV = P̃ᵀ dO, dP = (dO Vᵀ) ⊙ Z / (1 − p), dS = P ⊙ (dP − D) with
D = rowsum(dO ⊙ O) as without dropout (Σ_j P_ij dP_ij = Σ_j P̃_ij (dO Vᵀ)_ij = rowsum(dO ⊙ O)).
Autograd stores Z, an (Lq, Lk) tensor per head. FlashAttention stores only the state of the random
number generator and, in the backward, draws each tile's Z again from that state (Dao et al., 2022,
arXiv:2205.14135, App. B.2, and Algorithms 2 and 4 of App. B, the forward and backward with dropout).

Here the state is one integer ``seed``; tile (i, j) draws its mask from a ``torch.Generator``
seeded with a number computed from (seed, i, j) (:func:`tile_keep`), which stands for the counter
(seed, offset) of the Philox generator that the CUDA kernels use. Any order of visiting the tiles
regenerates the same masks. :func:`dropout_keep` assembles the same tiles into the dense (Lq, Lk)
mask, for a reference through autograd.
"""

from __future__ import annotations

import math

import torch

from . import validation
from .tiled import NEG_INF

__all__ = ["tile_keep", "dropout_keep", "dense_dropout_attention", "FlashDropoutFunction", "flash_dropout_attention"]

_MIX = (1_000_003, 998_244_353)  # two primes: distinct tiles get distinct generator seeds


def tile_keep(seed: int, i: int, j: int, shape, p: float):
    """The keep mask Z (bool, True = kept) of the tile whose first query is i and first key is j:
    ``shape`` (..., bq, bk), each entry kept with probability 1 − p, drawn from a generator seeded
    by (seed, i, j) alone, so the forward and the backward draw the same tile."""
    g = torch.Generator().manual_seed(((seed * _MIX[0] + i) * _MIX[1] + j) % 2**63)  # manual_seed takes < 2⁶³
    return torch.rand(shape, generator=g, dtype=torch.float32) >= p  # (..., bq, bk)


def dropout_keep(seed: int, shape, p: float, *, block_size: int = 64):
    """The dense keep mask (..., Lq, Lk) that the tiled functions use with this seed and
    block_size: every tile drawn by :func:`tile_keep` and put in its place."""
    *batch, Lq, Lk = shape
    keep = torch.empty(shape, dtype=torch.bool)
    for i in range(0, Lq, block_size):
        for j in range(0, Lk, block_size):
            bq, bk = min(block_size, Lq - i), min(block_size, Lk - j)
            keep[..., i : i + bq, j : j + bk] = tile_keep(seed, i, j, (*batch, bq, bk), p)
    return keep


def _causal_tile(i, j, bq, bk, offset):
    """Query i + a may see key j + b when j + b <= i + a + offset (offset = Lk − Lq, aligned at the end)."""
    rows = torch.arange(i, i + bq).unsqueeze(-1)  # (bq, 1)
    cols = torch.arange(j, j + bk)  # (bk,)
    return cols <= rows + offset  # (bq, bk)


def dense_dropout_attention(q, k, v, keep, p: float, *, is_causal: bool = False, scale=None):
    """The reference: softmax(q kᵀ · scale), then dropout with the given keep mask (..., Lq, Lk)
    and 1/(1 − p), then @ v, all as ordinary tensor operations, so autograd stores what it needs
    (the weights and the mask). ``is_causal`` aligns the causal diagonal at the end of the keys."""
    Lq, Lk = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-2, -1) * scale  # (..., Lq, Lk)
    if is_causal:
        s = s.masked_fill(~_causal_tile(0, 0, Lq, Lk, Lk - Lq), NEG_INF)
    weights = torch.softmax(s, dim=-1)  # (..., Lq, Lk)
    return (weights * keep / (1.0 - p)) @ v  # (..., Lq, d_v)


def _forward(q, k, v, seed, p, is_causal, scale, block_size):
    """The tiled forward with dropout: (out (..., Lq, d_v), lse (..., Lq, 1)). The softmax's running
    max and sum are taken over the weights before dropout; only the product with V sees Z."""
    *batch, Lq, d_v = (*q.shape[:-1], v.shape[-1])
    Lk = k.shape[-2]
    out, lse = q.new_empty((*batch, Lq, d_v)), q.new_empty((*batch, Lq, 1))
    for i in range(0, Lq, block_size):
        qi = q[..., i : i + block_size, :]  # (..., bq, d_k)
        bq = qi.shape[-2]
        m = qi.new_full((*batch, bq, 1), NEG_INF)  # running max
        row_sum = qi.new_zeros((*batch, bq, 1))  # running sum of exp(s − m), before dropout
        acc = qi.new_zeros((*batch, bq, d_v))  # running Σ exp(s − m) · z/(1 − p) · v
        for j in range(0, Lk, block_size):
            kj, vj = k[..., j : j + block_size, :], v[..., j : j + block_size, :]
            bk = kj.shape[-2]
            s = qi @ kj.transpose(-2, -1) * scale  # (..., bq, bk)
            if is_causal:
                tile = _causal_tile(i, j, bq, bk, Lk - Lq)
                if not tile.any():
                    continue  # above the diagonal: no scores, no mask drawn
                s = s.masked_fill(~tile, NEG_INF)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            m_safe = m_new.masked_fill(m_new == NEG_INF, 0.0)
            alpha, e = torch.exp(m - m_safe), torch.exp(s - m_safe)  # (..., bq, 1), (..., bq, bk)
            z = tile_keep(seed, i, j, e.shape, p).to(e.dtype) / (1.0 - p)  # (..., bq, bk)
            m, row_sum, acc = m_new, alpha * row_sum + e.sum(dim=-1, keepdim=True), alpha * acc + (e * z) @ vj
        out[..., i : i + bq, :] = torch.where(row_sum > 0, acc / row_sum, 0.0)
        lse[..., i : i + bq, :] = torch.where(row_sum > 0, m + torch.log(row_sum), NEG_INF)
    return out, lse


def _backward(q, k, v, out, lse, grad_out, seed, p, is_causal, scale, block_size):
    """FlashAttention-2's loop order (key blocks outer), each tile's P recomputed from lse and its
    keep mask redrawn from (seed, i, j). Returns (dq, dk, dv)."""
    Lq, Lk = q.shape[-2], k.shape[-2]
    delta = (grad_out * out).sum(dim=-1, keepdim=True)  # (..., Lq, 1): D = rowsum(dO ⊙ O)
    safe_lse = lse.masked_fill(lse == NEG_INF, math.inf)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for j in range(0, Lk, block_size):
        kj, vj = k[..., j : j + block_size, :], v[..., j : j + block_size, :]
        for i in range(0, Lq, block_size):
            qi, doi = q[..., i : i + block_size, :], grad_out[..., i : i + block_size, :]
            bq, bk = qi.shape[-2], kj.shape[-2]
            s = qi @ kj.transpose(-2, -1) * scale  # (..., bq, bk)
            if is_causal:
                tile = _causal_tile(i, j, bq, bk, Lk - Lq)
                if not tile.any():
                    continue
                s = s.masked_fill(~tile, NEG_INF)
            prob = torch.exp(s - safe_lse[..., i : i + bq, :])  # (..., bq, bk): P, before dropout
            z = tile_keep(seed, i, j, prob.shape, p).to(prob.dtype) / (1.0 - p)  # the same mask, redrawn
            dv[..., j : j + bk, :] += (prob * z).transpose(-2, -1) @ doi  # (..., bk, d_v): P̃ᵀ dO
            dp = (doi @ vj.transpose(-2, -1)) * z  # (..., bq, bk)
            ds = prob * (dp - delta[..., i : i + bq, :])  # (..., bq, bk)
            dq[..., i : i + bq, :] += ds @ kj * scale  # (..., bq, d_k)
            dk[..., j : j + bk, :] += ds.transpose(-2, -1) @ qi * scale  # (..., bk, d_k)
    return dq, dk, dv


class FlashDropoutFunction(torch.autograd.Function):
    """Tiled attention with dropout on the weights whose forward saves q, k, v, the output and the
    log-sum-exp (..., Lq, 1) — no (Lq, Lk) tensor, neither weights nor mask — and the integer
    seed as a plain attribute; the backward redraws every tile's keep mask from the seed.

    ``FlashDropoutFunction.apply(q, k, v, seed, p, is_causal, scale, block_size)``, inputs with the
    same batch dims, validated by :func:`flash_dropout_attention`. Not twice differentiable.
    """

    @staticmethod
    def forward(ctx, q, k, v, seed, p, is_causal, scale, block_size):
        out, lse = _forward(q, k, v, seed, p, is_causal, scale, block_size)
        ctx.save_for_backward(q, k, v, out, lse)  # O(L·d) numbers; the mask is not among them
        ctx.args = (seed, p, is_causal, scale, block_size)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, out, lse, grad_out.contiguous(), *ctx.args)
        return dq, dk, dv, None, None, None, None, None


def flash_dropout_attention(q, k, v, *, p: float, seed: int, is_causal: bool = False, scale=None, block_size: int = 64):
    """Dropout(softmax(q kᵀ · scale), p) v with FlashAttention's memory: differentiable through
    :class:`FlashDropoutFunction`. q (..., Lq, d_k), k (..., Lk, d_k), v (..., Lk, d_v), leading dims
    broadcast; p in [0, 1); seed an int (the same seed gives the same mask); ``is_causal`` aligns the
    diagonal at the end of the keys, as ``F.scaled_dot_product_attention`` does for Lq = Lk. Equal
    to :func:`dense_dropout_attention` with ``dropout_keep(seed, scores_shape, p, block_size=...)``.
    """
    validation.attention_inputs(q, k, v, None)
    validation.positive_int("block_size", block_size)
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p < 1.0:
        raise ValueError(f"p must be a dropout rate in [0, 1), got {p!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise TypeError(f"seed must be a non-negative int, got {seed!r}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    qe, ke, ve = (t.expand(*batch, *t.shape[-2:]) for t in (q, k, v))  # views; autograd sums broadcast dims
    return FlashDropoutFunction.apply(qe, ke, ve, seed, float(p), bool(is_causal), scale, block_size)
