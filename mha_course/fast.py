"""Multi-head attention tuned for speed: the same function as :class:`mha_course.MultiHeadAttention`,
with the optimisations that make an inference forward pass on a CPU cheaper.

:class:`MultiHeadAttention` is written to be read; this module is written to be fast, and notebook 09
measures what each change buys. The changes:

1. **one fused QKV matmul** — W_Q, W_K and W_V are stored stacked as one (3·d_model, d_model)
   weight, so self-attention projects with one matrix product instead of three;
2. **the scale folded into W_Q** — the rows of W_Q (and b_Q) are stored already multiplied by
   1/√d_head, once, when the weights are loaded, so no call spends B·L·d_model (or d_model²)
   multiplications on the scale;
3. **masking and softmax in place** — without autograd the mask is written into the score buffer
   (a mask shared by the batch or the heads, such as a causal (L, L) one, is added as 0 / −∞: on
   the AVX-512 CPU profiled for this course a broadcast add ran about 3× faster than a fill)
   and the softmax overwrites it, so the (B, h, Lq, Lk) scores are allocated once per call;
4. **no second L×L buffer** — the weights *are* that buffer (a fully masked row is zeroed in place);
5. **heads laid out once** — the fused projection's output is copied once into head-major
   (3, B, h, L, d_head) order, so both batched matmuls read contiguous heads instead of each
   gathering its own copy.

With autograd on, the in-place steps fall back to their out-of-place forms (the softmax's
backward needs its output, the scores are not overwritten); the result is the same.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import validation
from .multihead import MultiHeadAttention

__all__ = ["FastMultiHeadAttention"]


class FastMultiHeadAttention(nn.Module):
    """Batched multi-head self- or cross-attention (d_model-wide keys and values), fast.

    Args as :class:`mha_course.MultiHeadAttention` (without kdim/vdim): ``d_model``, ``num_heads``,
    ``bias``, ``dropout`` (on the weights, while training).

    Parameters: ``qkv_proj`` (d_model → 3·d_model), whose output is [q · 1/√d_head, k, v] — the
    query rows are stored pre-scaled — and ``out_proj`` (d_model → d_model).
    ``forward(query, key=None, value=None, *, mask=None, need_weights=True) -> (out, weights)``
    with the shapes, mask convention (bool, True = may attend, 2-D (Lq, Lk) or 4-D broadcastable to
    (B, h, Lq, Lk)) and errors of ``MultiHeadAttention.forward``.
    Convert with :meth:`from_module` and :meth:`to_module`.
    """

    def __init__(self, d_model: int, num_heads: int, *, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        reference = MultiHeadAttention(d_model, num_heads, bias=bias, dropout=dropout)  # checks the arguments
        self.d_model, self.num_heads, self.d_head = d_model, num_heads, reference.d_head
        self.kdim = self.vdim = d_model
        self.dropout = reference.dropout
        self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias)  # [W_Q / √d_head; W_K; W_V]
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.load_from(reference)

    @classmethod
    def from_module(cls, mha: MultiHeadAttention) -> FastMultiHeadAttention:
        """The same function as ``mha`` (a :class:`MultiHeadAttention` whose kdim = vdim = d_model)."""
        if not isinstance(mha, MultiHeadAttention):
            raise TypeError(f"mha must be a mha_course.MultiHeadAttention, got {type(mha).__name__}")
        if mha.kdim != mha.d_model or mha.vdim != mha.d_model:
            raise ValueError(
                f"FastMultiHeadAttention needs kdim = vdim = d_model, got kdim={mha.kdim}, vdim={mha.vdim} "
                f"and d_model={mha.d_model}"
            )
        bias = mha.q_proj.bias is not None
        fast = cls(mha.d_model, mha.num_heads, bias=bias, dropout=mha.dropout).to(mha.out_proj.weight)
        fast.load_from(mha)
        return fast.train(mha.training)

    @torch.no_grad()
    def load_from(self, mha: MultiHeadAttention) -> None:
        """Copy ``mha``'s weights: stack W_Q·(1/√d_head), W_K, W_V into ``qkv_proj`` (the scale
        is folded in here, once)."""
        scale = 1.0 / math.sqrt(self.d_head)
        self.qkv_proj.weight.copy_(torch.cat([mha.q_proj.weight * scale, mha.k_proj.weight, mha.v_proj.weight]))
        if self.qkv_proj.bias is not None:
            self.qkv_proj.bias.copy_(torch.cat([mha.q_proj.bias * scale, mha.k_proj.bias, mha.v_proj.bias]))
        self.out_proj.load_state_dict(mha.out_proj.state_dict())

    @torch.no_grad()
    def to_module(self) -> MultiHeadAttention:
        """The readable :class:`MultiHeadAttention` computing the same function."""
        bias = self.qkv_proj.bias is not None
        mha = MultiHeadAttention(self.d_model, self.num_heads, bias=bias, dropout=self.dropout)
        mha.to(self.out_proj.weight)
        projections, scales = (mha.q_proj, mha.k_proj, mha.v_proj), (math.sqrt(self.d_head), 1.0, 1.0)
        for i, (proj, s) in enumerate(zip(projections, scales, strict=True)):
            rows = slice(i * self.d_model, (i + 1) * self.d_model)
            proj.weight.copy_(self.qkv_proj.weight[rows] * s)  # undo the folded scale on W_Q
            if bias:
                proj.bias.copy_(self.qkv_proj.bias[rows] * s)
        mha.out_proj.load_state_dict(self.out_proj.state_dict())
        return mha.train(self.training)

    def _project(self, query, key, value):
        """q (already scaled), k, v, each (B, h, L, d_head): one matmul for self-attention, two
        when key is value, three otherwise."""
        w, b, d, h = self.qkv_proj.weight, self.qkv_proj.bias, self.d_model, self.num_heads
        if query is key and key is value:
            qkv = F.linear(query, w, b)  # (B, L, 3·d_model)
            B, L, _ = qkv.shape
            heads = qkv.view(B, L, 3, h, self.d_head).permute(2, 0, 3, 1, 4)  # (3, B, h, L, d_head), a view
            return heads.contiguous().unbind(0)  # one copy into head-major order: 3 × (B, h, L, d_head)
        b_q, b_kv = (None, None) if b is None else (b[:d], b[d:])
        q = F.linear(query, w[:d], b_q)  # (B, Lq, d_model)
        if key is value:
            k, v = F.linear(key, w[d:], b_kv).chunk(2, dim=-1)  # 2 × (B, Lk, d_model)
        else:
            k = F.linear(key, w[d : 2 * d], None if b is None else b[d : 2 * d])
            v = F.linear(value, w[2 * d :], None if b is None else b[2 * d :])
        return tuple(t.view(t.shape[0], t.shape[1], h, self.d_head).transpose(1, 2) for t in (q, k, v))

    def forward(self, query, key=None, value=None, *, mask=None, need_weights=True):
        key, value = validation.mha_inputs(self, query, key, value)  # the checks of MultiHeadAttention
        B, Lq, Lk, h = query.shape[0], query.shape[1], key.shape[1], self.num_heads
        mask = validation.mha_mask(mask, B, h, Lq, Lk)
        q, k, v = self._project(query, key, value)  # (B, h, L, d_head), q already × 1/√d_head
        p = self.dropout if self.training else 0.0
        if not need_weights:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=1.0)
            if mask is not None:
                out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
            return self.out_proj(out.transpose(1, 2).reshape(B, Lq, self.d_model)), None
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        scores = q @ k.transpose(-2, -1)  # (B, h, Lq, Lk), already scaled
        if mask is not None:
            blocked = ~mask
            # in place: the matmul's backward never reads its output
            if mask.numel() < scores.numel():  # shared by batch or heads: add it as 0 / −∞, a fast broadcast
                scores.add_(
                    torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device).masked_fill_(blocked, -math.inf)
                )
            else:  # as large as the scores: fill in place, no second buffer of that size
                scores.masked_fill_(blocked, -math.inf)
        weights = torch.softmax(scores, dim=-1) if grad else torch.softmax(scores, dim=-1, out=scores)
        if mask is not None:
            dead = blocked.all(dim=-1, keepdim=True)  # (…, Lq, 1): rows with no allowed key are NaN
            if dead.is_meta or dead.any():  # a data-dependent test; on the meta device, just fill
                weights = weights.masked_fill(dead, 0.0) if grad else weights.masked_fill_(dead, 0.0)
        out = (F.dropout(weights, p) if p else weights) @ v  # (B, h, Lq, d_head)
        return self.out_proj(out.transpose(1, 2).reshape(B, Lq, self.d_model)), weights

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, d_head={self.d_head}"
