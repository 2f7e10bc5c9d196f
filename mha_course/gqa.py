"""Grouped-query attention (GQA); its KV cache is :class:`~mha_course.kv_cache.KVCache`.

num_kv_heads == num_heads is ordinary multi-head attention (MHA); num_kv_heads == 1 is
multi-query attention (MQA); anything in between shares each K/V head among a group of
``num_heads // num_kv_heads`` query heads (query head i uses KV head i // n_rep).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import validation
from .attention import scaled_dot_product_attention
from .heads import merge_heads
from .kv_cache import KVCache
from .masks import causal_mask
from .multihead import MultiHeadAttention


def repeat_kv(x, n_rep: int):
    """(B, h_kv, L, d) -> (B, h_kv*n_rep, L, d): each KV head repeated for the n_rep query heads
    of its group, so query head i reads KV head i // n_rep.

    Equivalent to ``torch.repeat_interleave(x, n_rep, dim=1)`` (not ``x.repeat(1, n_rep, 1, 1)``,
    which would hand KV head i % h_kv to query head i).
    """
    validation.tensor("x", x, dims=4)
    validation.positive_int("n_rep", n_rep)
    if n_rep == 1:
        return x
    B, h_kv, L, d = x.shape
    return x[:, :, None].expand(B, h_kv, n_rep, L, d).reshape(B, h_kv * n_rep, L, d)  # (B, h, L, d)


class GroupedQueryAttention(nn.Module):
    """Self-attention with ``num_heads`` query heads sharing ``num_kv_heads`` K/V heads.

    Layers (named as in Llama checkpoints): q_proj (d_model -> h*head_dim),
    k_proj and v_proj (d_model -> h_kv*head_dim), o_proj (h*head_dim -> d_model).
    ``head_dim`` defaults to d_model // num_heads. ``sinks=True`` adds ``sinks`` (h,), one
    learned logit per query head that joins every softmax row and takes its share of the
    attention with it (gpt-oss's attention sinks, see :func:`scaled_dot_product_attention`);
    initialised to 0 (= one extra key with score 0 and value 0).

    ``forward(x, *, mask=None, cache=None, is_causal=False, need_weights=True, rope=None)``:
        x (B, L, d_model) — with a ``KVCache``, only the new positions; their K/V are appended
        to the cache and the queries attend to every cached position.
        rope: a :class:`~mha_course.positions.RotaryEmbedding` (or any ``rope(x, start)``): q and
        k are rotated at their absolute positions, starting at the cache length, *before* the
        keys are cached (the cache holds rotated keys, as in Llama).
        mask: bool, True = may attend, 2-D (L, L_total) or 4-D broadcastable to (B, h, L, L_total).
        is_causal: AND a bottom-right aligned :func:`causal_mask` (L, L_total) into the mask.
        Returns out (B, L, d_model) and weights (B, h, L, L_total) or None.
    With ``need_weights=False`` it runs ``F.scaled_dot_product_attention(..., enable_gqa=True)``
    (with sinks, which that kernel does not take, the course's attention and no weights).
    """

    def __init__(
        self, d_model: int, num_heads: int, num_kv_heads: int, *, head_dim=None, bias: bool = False, sinks=False
    ):
        super().__init__()
        validation.positive_int("num_kv_heads", num_kv_heads)  # required here (None is not MHA)
        _, self.head_dim = validation.head_shape(d_model, num_heads, num_kv_heads, head_dim)
        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
        self.n_rep = num_heads // num_kv_heads
        self.q_proj = nn.Linear(d_model, num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * self.head_dim, d_model, bias=bias)
        if not isinstance(sinks, bool):
            raise TypeError(f"sinks must be True or False, got {type(sinks).__name__}")
        self.sinks = nn.Parameter(torch.zeros(num_heads)) if sinks else None  # (h,) logits

    def forward(
        self,
        x,
        *,
        mask=None,
        cache: KVCache | None = None,
        is_causal: bool = False,
        need_weights: bool = True,
        rope=None,
    ):
        validation.layer_input(x, self.q_proj.weight, self.d_model, cache, KVCache)
        B, L, _ = x.shape
        q = self.q_proj(x).view(B, L, self.num_heads, self.head_dim).transpose(1, 2)  # (B, h, L, hd)
        k = self.k_proj(x).view(B, L, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, h_kv, L, hd)
        v = self.v_proj(x).view(B, L, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, h_kv, L, hd)
        if rope is not None:  # rotate at the absolute positions: the new rows follow the cached ones
            start = 0 if cache is None else cache.length
            q, k = rope(q, start), rope(k, start)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, h_kv, L_total, hd)
        L_total = k.shape[2]
        if mask is not None:
            validation.tensor("mask", mask)
            if mask.dim() not in (2, 4):
                raise ValueError(
                    f"mask must be 2-D (L, L_total) or 4-D (B, h, L, L_total), got shape {tuple(mask.shape)}"
                )
            validation.bool_mask(mask, (B, self.num_heads, L, L_total))
        if is_causal:
            causal = causal_mask(L, L_total, device=x.device)
            mask = causal if mask is None else mask & causal
        if need_weights or self.sinks is not None:
            out, weights = scaled_dot_product_attention(
                q, repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep), mask, sinks=self.sinks
            )  # (B, h, L, hd), (B, h, L, L_total)
            weights = weights if need_weights else None
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.n_rep > 1)
            weights = None
            if mask is not None:  # a query with no allowed key gives 0, not NaN
                out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
        return self.o_proj(merge_heads(out)), weights  # (B, L, d_model)

    @classmethod
    @torch.no_grad()
    def from_mha(cls, mha, num_kv_heads: int) -> GroupedQueryAttention:
        """Convert a :class:`~mha_course.MultiHeadAttention` (self-attention) to GQA by
        mean-pooling the K and V heads of each group (the GQA paper's uptraining start).
        With num_kv_heads == mha.num_heads the result computes exactly the same function."""
        if not isinstance(mha, MultiHeadAttention):
            raise TypeError(
                f"mha must be a mha_course.MultiHeadAttention, got {type(mha).__name__} "
                "(for torch.nn.MultiheadAttention use MultiHeadAttention.from_torch first)"
            )
        if mha.kdim != mha.d_model or mha.vdim != mha.d_model:
            raise ValueError(
                f"mha must be self-attention (kdim == vdim == d_model={mha.d_model}), "
                f"got kdim={mha.kdim}, vdim={mha.vdim}"
            )
        h, hd = mha.num_heads, mha.d_head
        bias = mha.q_proj.bias is not None
        new = cls(mha.d_model, h, num_kv_heads, bias=bias).to(mha.q_proj.weight)
        n_rep = new.n_rep

        def pool(t):  # (h*hd, ...) -> (h_kv*hd, ...): average the n_rep heads of each group
            return t.reshape(num_kv_heads, n_rep, hd, *t.shape[1:]).mean(dim=1).reshape(num_kv_heads * hd, *t.shape[1:])

        new.q_proj.load_state_dict(mha.q_proj.state_dict())
        new.o_proj.load_state_dict(mha.out_proj.state_dict())
        for src, dst in ((mha.k_proj, new.k_proj), (mha.v_proj, new.v_proj)):
            dst.weight.copy_(pool(src.weight))
            if bias:
                dst.bias.copy_(pool(src.bias))
        return new

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}"
            + (", sinks=True" if self.sinks is not None else "")
        )
