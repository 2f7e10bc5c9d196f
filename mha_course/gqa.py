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
from .masks import causal_mask, sliding_window_mask
from .multihead import MultiHeadAttention
from .norm import RMSNorm


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

    The additions of today's open models, each off by default:
        qk_norm: ``q_norm`` and ``k_norm``, an :class:`~mha_course.RMSNorm` over each head's
            head_dim coordinates, applied to q and k before RoPE (Qwen3, OLMo 2, Gemma 3); ``norm_eps``
            is its eps.
        output_gate: q_proj grows to d_model -> h*2*head_dim; each head's slice holds its query
            then its gate, [q_head | g_head] (Qwen3-Next's layout), and the attention output of
            every head is multiplied elementwise by sigmoid(gate) before o_proj.
        softcap: every score s becomes softcap · tanh(s / softcap) before the mask (Gemma 2).
        scale: multiplies the scores; default head_dim ** -0.5 (Gemma 2: query_pre_attn_scalar ** -0.5).
        window: a sliding window: each query attends to at most ``window`` keys, its own
            included (causal), on every call (Gemma 2's and gpt-oss's sliding layers).
        rope: a :class:`~mha_course.positions.RotaryEmbedding` used when ``forward`` gets none.

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
    (with sinks or a softcap, which that kernel does not take, the course's attention and no weights).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_kv_heads: int,
        *,
        head_dim=None,
        bias: bool = False,
        sinks=False,
        qk_norm: bool = False,
        output_gate: bool = False,
        softcap=None,
        scale=None,
        window=None,
        rope=None,
        norm_eps: float = 1e-6,
    ):
        super().__init__()
        validation.positive_int("num_kv_heads", num_kv_heads)  # required here (None is not MHA)
        _, self.head_dim = validation.head_shape(d_model, num_heads, num_kv_heads, head_dim)
        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
        self.n_rep = num_heads // num_kv_heads
        for name, flag in (("sinks", sinks), ("qk_norm", qk_norm), ("output_gate", output_gate)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {type(flag).__name__}")
        self.output_gate = output_gate
        q_width = num_heads * self.head_dim * (2 if output_gate else 1)  # [query | gate] per head
        self.q_proj = nn.Linear(d_model, q_width, bias=bias)
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * self.head_dim, d_model, bias=bias)
        self.sinks = nn.Parameter(torch.zeros(num_heads)) if sinks else None  # (h,) logits
        self.q_norm = RMSNorm(self.head_dim, norm_eps) if qk_norm else None  # over each head's coordinates
        self.k_norm = RMSNorm(self.head_dim, norm_eps) if qk_norm else None
        self.softcap = validation.softcap(softcap)
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0):
            raise ValueError(f"scale must be None or a positive float, got scale={scale!r}")
        self.scale = float(scale) if scale is not None else self.head_dim**-0.5
        self.window = None if window is None else validation.positive_int("window", window)
        self.rope = rope

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
        h, h_kv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.q_proj(x)  # (B, L, h*hd), or (B, L, h*2*hd) with the gate
        if self.output_gate:
            q, gate = q.view(B, L, h, 2 * hd).chunk(2, dim=-1)  # (B, L, h, hd) each: [query | gate] per head
        q = q.reshape(B, L, h, hd)  # (B, L, h, hd)
        k = self.k_proj(x).view(B, L, h_kv, hd)  # (B, L, h_kv, hd)
        if self.q_norm is not None:  # QK-norm: each head's query and key scaled to RMS 1 (times a weight)
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, h, L, hd), (B, h_kv, L, hd)
        v = self.v_proj(x).view(B, L, h_kv, hd).transpose(1, 2)  # (B, h_kv, L, hd)
        rope = self.rope if rope is None else rope
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
        if self.window is not None:
            window = sliding_window_mask(L, self.window, L_total, device=x.device)
            mask = window if mask is None else mask & window
        if need_weights or self.sinks is not None or self.softcap is not None:
            out, weights = scaled_dot_product_attention(
                q,
                repeat_kv(k, self.n_rep),
                repeat_kv(v, self.n_rep),
                mask,
                scale=self.scale,
                sinks=self.sinks,
                softcap=self.softcap,
            )  # (B, h, L, hd), (B, h, L, L_total)
            weights = weights if need_weights else None
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=self.n_rep > 1)
            weights = None
            if mask is not None:  # a query with no allowed key gives 0, not NaN
                out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
        out = merge_heads(out)  # (B, L, h*hd)
        if self.output_gate:  # each head's output times its own sigmoid gate, before the heads are mixed
            out = out * torch.sigmoid(gate.reshape(B, L, h * hd))  # (B, L, h*hd)
        return self.o_proj(out), weights  # (B, L, d_model)

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
        extras = [
            name
            for name, on in (
                ("sinks=True", self.sinks is not None),
                ("qk_norm=True", self.q_norm is not None),
                ("output_gate=True", self.output_gate),
                (f"softcap={self.softcap:g}" if self.softcap else "", self.softcap is not None),
                (f"window={self.window}", self.window is not None),
                (f"scale={self.scale:.4g}", abs(self.scale - self.head_dim**-0.5) > 1e-12),
            )
            if on
        ]
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}" + "".join(", " + e for e in extras)
        )
