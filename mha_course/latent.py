"""Multi-head latent attention (MLA), as in DeepSeek-V2 and V3.

Instead of caching K and V for every head, MLA caches per token one small **latent**
c_KV (``kv_lora_rank`` numbers) plus one **decoupled RoPE key** k_R (``qk_rope_head_dim``
numbers) shared by all heads. Keys and values are rebuilt from the latent by up-projections:

    c_KV = RMSNorm(x W_DKV)                      (B, L, r)         cached
    k_R  = RoPE(x W_KR)                          (B, L, d_R)       cached, shared by all heads
    k_i  = [c_KV W_UK,i ; k_R]                   (B, L, d_nope + d_R)   for head i
    v_i  = c_KV W_UV,i                           (B, L, d_v)
    q_i  = [x W_Q,i^nope ; RoPE(x W_Q,i^rope)]   scores q_i·k_i / √(d_nope + d_R)

Layer names follow the checkpoints (and ``transformers``' ``DeepseekV2Attention``, with
``q_lora_rank=None`` as in DeepSeek-V2-Lite): ``q_proj``, ``kv_a_proj_with_mqa`` (W_DKV and
W_KR together), ``kv_a_layernorm``, ``kv_b_proj`` (W_UK and W_UV together), ``o_proj``.

The **absorbed** form never builds k_i or v_i: q_i W_UK,iᵀ is a query in latent space, so the
scores read c_KV directly; and the weighted sum of latents goes through W_UV,i and W_O, which fold
into one matrix. Decoding then reads only the cache — it is multi-query attention with one
shared "head" of width r + d_R for keys and r for values.

RoPE here rotates interleaved pairs (x[2i], x[2i+1]) by position · θ^(−2i/d_R), the layout of
DeepSeek's checkpoints.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from . import validation
from .accounting import tensor_bytes
from .attention import scaled_dot_product_attention
from .heads import merge_heads
from .masks import causal_mask
from .positions import apply_rope

__all__ = ["MultiHeadLatentAttention", "LatentCache", "mla_cache_bytes", "decode_intensity"]


def mla_cache_bytes(num_layers, kv_lora_rank, qk_rope_head_dim, seq_len, *, batch=1, bytes_per_element=2) -> int:
    """Bytes of an MLA cache: layers · (kv_lora_rank + qk_rope_head_dim) · seq_len · batch · bytes.

    One latent and one shared RoPE key per token and layer — no factor 2 (the latent serves
    keys and values) and no head count (both are shared by all heads).
    """
    for name, value in (
        ("num_layers", num_layers),
        ("kv_lora_rank", kv_lora_rank),
        ("qk_rope_head_dim", qk_rope_head_dim),
        ("seq_len", seq_len),
        ("batch", batch),
        ("bytes_per_element", bytes_per_element),
    ):
        validation.positive_int(name, value, allow_zero=name in ("seq_len", "qk_rope_head_dim"))
    return num_layers * (kv_lora_rank + qk_rope_head_dim) * seq_len * batch * bytes_per_element


def decode_intensity(
    num_heads,
    *,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    q_len=1,
    absorbed=True,
    bytes_per_element=2,
) -> float:
    """Arithmetic intensity of MLA's attention in one decode step: FLOPs per byte read from memory
    (both grow with the number of cached tokens, so their ratio does not depend on it).

    absorbed: h·q_len queries of width r + d_R score against the cached [c_KV ; k_R] and sum the
    latents c_KV (width r): 2·h·q_len·(2r + d_R) FLOPs per cached token, for (r + d_R) numbers
    read — the intensity grows with the heads (≈ 2·h·q_len·(2r + d_R) / ((r + d_R) · bytes)).
    explicit: per-head K (d_nope + d_R) and V (d_v) read for every head: 2·h·q_len·(d_nope + d_R
    + d_v) FLOPs for h·(d_nope + d_R + d_v) numbers — q_len · 2 / bytes, whatever the heads.
    """
    for name, value in (
        ("num_heads", num_heads),
        ("kv_lora_rank", kv_lora_rank),
        ("qk_nope_head_dim", qk_nope_head_dim),
        ("v_head_dim", v_head_dim),
        ("q_len", q_len),
        ("bytes_per_element", bytes_per_element),
    ):
        validation.positive_int(name, value)
    validation.positive_int("qk_rope_head_dim", qk_rope_head_dim, allow_zero=True)
    r, rope = kv_lora_rank, qk_rope_head_dim
    if absorbed:
        flops = 2 * num_heads * q_len * ((r + rope) + r)  # scores over r + d_R, then a sum of latents
        numbers = r + rope  # the cache itself, shared by all heads
    else:
        width = qk_nope_head_dim + rope + v_head_dim  # one head's key and value
        flops = 2 * num_heads * q_len * width
        numbers = num_heads * width
    return flops / (numbers * bytes_per_element)


class LatentCache:
    """What an MLA layer keeps per token: the latent c_KV (B, L, r) and the RoPE key k_R (B, L, d_R).

    ``update(c_kv, k_rope)`` appends the new positions and returns the whole cache. Inspect
    ``length``, ``nbytes`` (bytes of both tensors), ``latents`` and ``rope_keys``.
    """

    def __init__(self):
        self.latents: torch.Tensor | None = None
        self.rope_keys: torch.Tensor | None = None

    def update(self, c_kv, k_rope):
        validation.tensor("c_kv", c_kv, dims=3)
        validation.tensor("k_rope", k_rope, dims=3)
        if c_kv.shape[:2] != k_rope.shape[:2]:
            raise ValueError(
                f"c_kv and k_rope must share (B, L_new), got {tuple(c_kv.shape)} and {tuple(k_rope.shape)}"
            )
        if self.latents is not None and (
            c_kv.shape[::2] != self.latents.shape[::2] or k_rope.shape[::2] != self.rope_keys.shape[::2]
        ):
            raise ValueError(
                f"new (B, L, r) {tuple(c_kv.shape)} / {tuple(k_rope.shape)} do not match the cached "
                f"{tuple(self.latents.shape)} / {tuple(self.rope_keys.shape)}"
            )
        self.latents = c_kv if self.latents is None else torch.cat([self.latents, c_kv], dim=1)  # (B, L, r)
        self.rope_keys = k_rope if self.rope_keys is None else torch.cat([self.rope_keys, k_rope], dim=1)
        return self.latents, self.rope_keys

    @property
    def length(self) -> int:
        return 0 if self.latents is None else self.latents.shape[1]

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.latents, self.rope_keys)

    def __repr__(self) -> str:
        shapes = None if self.latents is None else (tuple(self.latents.shape), tuple(self.rope_keys.shape))
        return f"LatentCache(length={self.length}, latents/rope_keys shape={shapes}, nbytes={self.nbytes})"


class MultiHeadLatentAttention(nn.Module):
    """Causal self-attention with a latent KV cache (DeepSeek-V2's MLA, without a query latent).

    ``MultiHeadLatentAttention(d_model, num_heads, *, kv_lora_rank, qk_nope_head_dim,
    qk_rope_head_dim, v_head_dim, rope_theta=10000.0)``

    ``forward(x, *, cache=None, absorb=False)``: x (B, L, d_model) — with a :class:`LatentCache`,
    only the new positions (their positions continue from ``cache.length``). Returns
    out (B, L, d_model) and weights (B, h, L, L_total). ``absorb=True`` computes the same with
    the absorbed matrices (:meth:`absorbed_weights`), reading only the latent and the RoPE key.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        rope_theta: float = 10000.0,
    ):
        super().__init__()
        for name, value in (
            ("d_model", d_model),
            ("num_heads", num_heads),
            ("kv_lora_rank", kv_lora_rank),
            ("qk_nope_head_dim", qk_nope_head_dim),
            ("qk_rope_head_dim", qk_rope_head_dim),
            ("v_head_dim", v_head_dim),
        ):
            validation.positive_int(name, value)
        if qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even (RoPE rotates pairs), got {qk_rope_head_dim}")
        self.d_model, self.num_heads, self.kv_lora_rank = d_model, num_heads, kv_lora_rank
        self.nope, self.rope = qk_nope_head_dim, qk_rope_head_dim  # widths of a query/key's two parts
        self.v_head_dim, self.rope_theta = v_head_dim, rope_theta
        h = num_heads
        self.q_proj = nn.Linear(d_model, h * (qk_nope_head_dim + qk_rope_head_dim), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d_model, kv_lora_rank + qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = nn.RMSNorm(kv_lora_rank, eps=1e-6)
        self.kv_b_proj = nn.Linear(kv_lora_rank, h * (qk_nope_head_dim + v_head_dim), bias=False)
        self.o_proj = nn.Linear(h * v_head_dim, d_model, bias=False)

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.nope + self.rope)

    def compress(self, x, start: int = 0):
        """x (B, L, d_model) -> what the cache keeps: c_KV (B, L, r), k_R (B, L, d_R) at positions start.."""
        both = self.kv_a_proj_with_mqa(x)  # (B, L, r + d_R)
        c_kv, k_rope = both.split([self.kv_lora_rank, self.rope], dim=-1)  # (B, L, r), (B, L, d_R)
        positions = torch.arange(start, start + x.shape[1], device=x.device)
        return self.kv_a_layernorm(c_kv), apply_rope(k_rope, positions, theta=self.rope_theta, layout="interleaved")

    def queries(self, x, start: int = 0):
        """x (B, L, d_model) -> q_nope (B, h, L, d_nope), q_rope (B, h, L, d_R) (rotated)."""
        B, L, _ = x.shape
        q = self.q_proj(x).view(B, L, self.num_heads, self.nope + self.rope).transpose(1, 2)  # (B, h, L, d_qk)
        q_nope, q_rope = q.split([self.nope, self.rope], dim=-1)
        positions = torch.arange(start, start + L, device=x.device)
        return q_nope, apply_rope(q_rope, positions, theta=self.rope_theta, layout="interleaved")

    def up_weights(self):
        """W_UK (h, d_nope, r) and W_UV (h, d_v, r): the two halves of kv_b_proj, per head."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope + self.v_head_dim, self.kv_lora_rank)
        return w.split([self.nope, self.v_head_dim], dim=1)

    def absorbed_weights(self):
        """W_UK (h, d_nope, r), applied to the query side; W_OUV (d_model, h, r) = W_O · W_UV per head,
        which maps each head's weighted latent straight to the output."""
        w_uk, w_uv = self.up_weights()
        w_o = self.o_proj.weight.view(self.d_model, self.num_heads, self.v_head_dim)  # (d, h, d_v)
        return w_uk, torch.einsum("dhv,hvr->dhr", w_o, w_uv)  # (d, h, r)

    def explicit_attention(self, q_nope, q_rope, c_kv, k_rope, mask):
        """Rebuild every head's K and V from the cache, then ordinary multi-head attention."""
        B, Lk, _ = c_kv.shape
        h = self.num_heads
        kv = self.kv_b_proj(c_kv).view(B, Lk, h, self.nope + self.v_head_dim).transpose(1, 2)  # (B, h, Lk, d_nope+d_v)
        k_nope, v = kv.split([self.nope, self.v_head_dim], dim=-1)  # (B, h, Lk, d_nope), (B, h, Lk, d_v)
        k = torch.cat([k_nope, k_rope[:, None].expand(B, h, Lk, self.rope)], dim=-1)  # (B, h, Lk, d_nope+d_R)
        q = torch.cat([q_nope, q_rope], dim=-1)  # (B, h, Lq, d_nope+d_R)
        out, weights = scaled_dot_product_attention(q, k, v, mask, scale=self.scale)  # (B, h, Lq, d_v)
        return self.o_proj(merge_heads(out)), weights  # (B, Lq, d_model)

    def absorbed_attention(self, q_nope, q_rope, c_kv, k_rope, mask):
        """Attend in latent space: one shared key [c_KV ; k_R] and value c_KV for all heads (MQA-like)."""
        w_uk, w_ouv = self.absorbed_weights()
        q_latent = torch.einsum("bhlc,hcr->bhlr", q_nope, w_uk)  # (B, h, Lq, r): W_UK folded into the query
        q = torch.cat([q_latent, q_rope], dim=-1)  # (B, h, Lq, r + d_R)
        k = torch.cat([c_kv, k_rope], dim=-1)[:, None]  # (B, 1, Lk, r + d_R): one head, shared
        ctx, weights = scaled_dot_product_attention(q, k, c_kv[:, None], mask, scale=self.scale)  # (B, h, Lq, r)
        return torch.einsum("bhlr,dhr->bld", ctx, w_ouv), weights  # (B, Lq, d_model)

    def forward(self, x, *, cache: LatentCache | None = None, absorb: bool = False):
        validation.layer_input(x, self.q_proj.weight, self.d_model, cache, LatentCache)
        start = 0 if cache is None else cache.length
        q_nope, q_rope = self.queries(x, start)  # (B, h, L, d_nope), (B, h, L, d_R)
        c_kv, k_rope = self.compress(x, start)  # (B, L, r), (B, L, d_R)
        if cache is not None:
            c_kv, k_rope = cache.update(c_kv, k_rope)  # (B, L_total, r), (B, L_total, d_R)
        mask = causal_mask(x.shape[1], c_kv.shape[1], device=x.device)  # bottom-right aligned
        attend = self.absorbed_attention if absorb else self.explicit_attention
        return attend(q_nope, q_rope, c_kv, k_rope, mask)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, kv_lora_rank={self.kv_lora_rank}, "
            f"qk_nope_head_dim={self.nope}, qk_rope_head_dim={self.rope}, v_head_dim={self.v_head_dim}"
        )
