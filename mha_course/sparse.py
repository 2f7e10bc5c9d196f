"""Top-k sparse attention (DeepSeek-V3.2's DeepSeek Sparse Attention): a small indexer scores every
query–key pair, and each query attends only to the ``top_k`` keys it scores highest.

    index_scores = indexer_scores(q_index, k_index, head_weights)          # (B, Lq, Lk)
    out, weights = topk_sparse_attention(q, k, v, index_scores, top_k, mask)

The indexer is cheap (few heads, one shared key per position, ReLU instead of softmax); the
attention it steers reads only ``top_k`` keys per query instead of all of them.
"""

from __future__ import annotations

import torch

from . import validation
from .attention import scaled_dot_product_attention
from .gqa import repeat_kv


def indexer_scores(q_index, k_index, head_weights, *, scale=None):
    """The lightning indexer's score of every query–key pair, shared by all attention heads:

        score[b, s, t] = Σ_j head_weights[b, s, j] · ReLU(scale · q_index[b, s, j] · k_index[b, t])

    q_index (B, Lq, H_I, d_I): H_I small indexer heads per query; k_index (B, Lk, d_I): one key
    per position, shared by the indexer heads; head_weights (B, Lq, H_I): each query's weight on
    each indexer head; scale defaults to 1/√d_I. Returns (B, Lq, Lk). Equal to the scores that
    transformers' ``DeepseekV32Indexer`` ranks (it folds 1/√H_I into head_weights and skips the
    Hadamard rotation and FP8 rounding of the reference kernel, which keep dot products).
    """
    validation.tensor("q_index", q_index, dims=4, floating=True)
    validation.tensor("k_index", k_index, dims=3, floating=True)
    validation.tensor("head_weights", head_weights, dims=3, floating=True)
    B, Lq, H, d = q_index.shape
    if k_index.shape[0] != B or k_index.shape[-1] != d:
        raise ValueError(f"k_index must be (B={B}, Lk, d_I={d}), got {tuple(k_index.shape)}")
    if tuple(head_weights.shape) != (B, Lq, H):
        raise ValueError(f"head_weights must be (B, Lq, H_I) = {(B, Lq, H)}, got {tuple(head_weights.shape)}")
    scale = d**-0.5 if scale is None else scale
    per_head = torch.relu(torch.einsum("bshd,btd->bsht", q_index, k_index) * scale)  # (B, Lq, H_I, Lk)
    return torch.einsum("bsh,bsht->bst", head_weights, per_head)  # (B, Lq, Lk)


def topk_mask(index_scores, top_k: int, mask=None):
    """bool (B, Lq, Lk): True at each query's ``top_k`` highest-scoring keys among those ``mask``
    allows (True = may attend; the mask is applied *before* the top-k, so a blocked key is never
    chosen and a row with fewer than ``top_k`` allowed keys keeps all of them)."""
    scores = index_scores if mask is None else index_scores.masked_fill(~mask, float("-inf"))  # (B, Lq, Lk)
    k = min(top_k, scores.shape[-1])
    chosen = scores.topk(k, dim=-1).indices  # (B, Lq, k)
    selected = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device).scatter_(-1, chosen, True)
    return selected if mask is None else selected & mask.expand_as(selected)  # (B, Lq, Lk)


def topk_sparse_attention(q, k, v, index_scores, top_k: int, mask=None):
    """Attention in which each query reads only its ``top_k`` best keys by ``index_scores``.

    q (B, h, Lq, d), k and v (B, h_kv, Lk, d) with h a multiple of h_kv (query head i reads KV
    head i // (h / h_kv), as :func:`~mha_course.repeat_kv`); index_scores (B, Lq, Lk): one score
    per query–key pair, the same for every head (as the indexer gives it); mask: bool,
    broadcastable to (B, Lq, Lk), True = may attend, applied before the top-k.
    Returns out (B, h, Lq, d_v) and weights (B, h, Lq, Lk), zero outside the selected keys.
    With top_k ≥ Lk it is :func:`~mha_course.scaled_dot_product_attention` with ``mask``.
    """
    validation.positive_int("top_k", top_k)
    for name, t in (("q", q), ("k", k), ("v", v)):
        validation.tensor(name, t, dims=4, floating=True)
    B, h, Lq, _ = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"q, k, v must share the batch size B, got {q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
    h_kv, Lk = k.shape[1], k.shape[2]
    if v.shape[1] != h_kv:
        raise ValueError(f"k and v must have the same number of heads h_kv, got {h_kv} and {v.shape[1]}")
    validation.kv_heads(h, h_kv)
    validation.tensor("index_scores", index_scores, dims=3, floating=True)
    if tuple(index_scores.shape) != (B, Lq, Lk):
        raise ValueError(f"index_scores must be (B, Lq, Lk) = {(B, Lq, Lk)}, got {tuple(index_scores.shape)}")
    if mask is not None:
        validation.bool_mask(mask, (B, Lq, Lk))
    selected = topk_mask(index_scores, top_k, mask)  # (B, Lq, Lk)
    n_rep = h // h_kv
    return scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), selected[:, None])
