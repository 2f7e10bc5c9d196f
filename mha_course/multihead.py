"""Multi-head attention, twice: as h separate heads in a loop, and as the batched module
real code uses. Both compute the same function; ``LoopedMultiHeadAttention.to_fused`` proves it.

Weight convention (as ``torch.nn.Linear``): a projection computes ``x @ W.T + b`` with W of
shape (out_features, in_features); head i owns rows [i*d_head, (i+1)*d_head) of W_Q, W_K, W_V,
i.e. columns of the math-convention matrix ``x @ W_Q``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import validation
from .attention import attention_weights, scaled_dot_product_attention
from .heads import merge_heads, split_heads

#: the argument checks LoopedMultiHeadAttention.forward runs first (as MultiHeadAttention.forward)
_check_inputs = validation.mha_inputs
_check_mask = validation.mha_mask


class LoopedMultiHeadAttention(nn.Module):
    """Multi-head attention written the way the formula reads: h independent heads, each with
    its own W_Q, W_K, W_V of shape (d_head, d_model), run one after another on the whole
    sequence, their outputs concatenated and mixed by W_O (d_model, d_model).

    ``forward(query, key=None, value=None, *, mask=None, need_weights=True) -> (out, weights)``
    has the same signature and result as :class:`MultiHeadAttention`; ``to_fused()`` converts.
    """

    def __init__(self, d_model: int, num_heads: int, *, bias: bool = True):
        super().__init__()
        validation.positive_int("d_model", d_model)
        validation.positive_int("num_heads", num_heads)
        self.d_model, self.num_heads = d_model, num_heads
        self.kdim = self.vdim = d_model
        self.d_head = validation.divisible(d_model, num_heads)
        self.heads = nn.ModuleList(
            nn.ModuleDict(
                {
                    "q": nn.Linear(d_model, self.d_head, bias=bias),
                    "k": nn.Linear(d_model, self.d_head, bias=bias),
                    "v": nn.Linear(d_model, self.d_head, bias=bias),
                }
            )
            for _ in range(num_heads)
        )
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query, key=None, value=None, *, mask=None, need_weights=True):
        key, value = _check_inputs(self, query, key, value)
        B, Lq, Lk = query.shape[0], query.shape[1], key.shape[1]
        mask = _check_mask(mask, B, self.num_heads, Lq, Lk)
        outs, weights = [], []
        for i, head in enumerate(self.heads):
            head_mask = None
            if mask is not None:  # pick head i's slice (or the shared one) of a 4-D mask
                head_mask = mask if mask.dim() == 2 else mask[:, i if mask.shape[1] > 1 else 0]
            out_i, w_i = scaled_dot_product_attention(
                head["q"](query), head["k"](key), head["v"](value), head_mask
            )  # (B, Lq, d_head), (B, Lq, Lk): every head sees all Lk positions
            outs.append(out_i)
            weights.append(w_i)
        out = self.out_proj(torch.cat(outs, dim=-1))  # concat heads: (B, Lq, h*d_head) -> W_O
        return out, (torch.stack(weights, dim=1) if need_weights else None)  # (B, h, Lq, Lk)

    @torch.no_grad()
    def to_fused(self) -> MultiHeadAttention:
        """The same function as one :class:`MultiHeadAttention`: stack the h per-head matrices
        of W_Q (and W_K, W_V) as row blocks of one (d_model, d_model) matrix."""
        bias = self.out_proj.bias is not None
        fused = MultiHeadAttention(self.d_model, self.num_heads, bias=bias)
        fused.to(self.out_proj.weight)
        for name, proj in (("q", fused.q_proj), ("k", fused.k_proj), ("v", fused.v_proj)):
            proj.weight.copy_(torch.cat([h[name].weight for h in self.heads], dim=0))
            if bias:
                proj.bias.copy_(torch.cat([h[name].bias for h in self.heads], dim=0))
        fused.out_proj.load_state_dict(self.out_proj.state_dict())
        return fused


class MultiHeadAttention(nn.Module):
    """Batched multi-head attention: one projection per Q/K/V for all heads, then a head dim.

    Args:
        d_model: model width; must be divisible by ``num_heads`` (d_head = d_model // h).
        num_heads: h, the number of heads.
        bias: add biases to the four projections (as ``nn.MultiheadAttention``).
        kdim, vdim: widths of the key and value inputs (cross-attention); default d_model.
        dropout: dropout on the attention weights while training.

    ``forward(query, key=None, value=None, *, mask=None, need_weights=True)``:
        query (B, Lq, d_model); key (B, Lk, kdim); value (B, Lk, vdim). key/value default to
        query (self-attention). mask: bool, True = may attend, 2-D (Lq, Lk) or 4-D
        broadcastable to (B, h, Lq, Lk) (e.g. :func:`padding_mask`'s (B, 1, 1, Lk)).
        Returns out (B, Lq, d_model) and per-head weights (B, h, Lq, Lk), or None when
        ``need_weights=False`` — then it runs PyTorch's fused
        ``F.scaled_dot_product_attention`` and never materialises the weights.
    Fully masked query rows give output 0 from the attention (then only the W_O bias).
    Equivalent to ``torch.nn.MultiheadAttention(batch_first=True)`` with
    ``average_attn_weights=False`` and its boolean mask inverted (see ``from_torch``).

    ``forward`` is written as the steps of the formula — project, split heads, attend, merge
    heads, output projection — not for speed; :class:`mha_course.fast.FastMultiHeadAttention`
    computes the same function with the usual inference optimisations.
    """

    def __init__(self, d_model: int, num_heads: int, *, bias: bool = True, kdim=None, vdim=None, dropout=0.0):
        super().__init__()
        validation.positive_int("d_model", d_model)
        validation.positive_int("num_heads", num_heads)
        self.kdim = d_model if kdim is None else validation.positive_int("kdim", kdim)
        self.vdim = d_model if vdim is None else validation.positive_int("vdim", vdim)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
            raise TypeError(f"dropout must be a float in [0, 1), got {type(dropout).__name__} ({dropout!r})")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got dropout={dropout}")
        self.d_model, self.num_heads, self.dropout = d_model, num_heads, float(dropout)
        self.d_head = validation.divisible(d_model, num_heads)
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)  # all heads' W_Q as row blocks
        self.k_proj = nn.Linear(self.kdim, d_model, bias=bias)
        self.v_proj = nn.Linear(self.vdim, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query, key=None, value=None, *, mask=None, need_weights=True):
        key, value = validation.mha_inputs(self, query, key, value)  # key, value default to query
        B, Lq, Lk, h = query.shape[0], query.shape[1], key.shape[1], self.num_heads
        mask = validation.mha_mask(mask, B, h, Lq, Lk)  # checked once here, used as it is below
        q = split_heads(self.q_proj(query), h)  # (B, Lq, d_model) -> (B, h, Lq, d_head)
        k = split_heads(self.k_proj(key), h)  # (B, Lk, kdim) -> (B, h, Lk, d_head)
        v = split_heads(self.v_proj(value), h)  # (B, Lk, vdim) -> (B, h, Lk, d_head)
        p = self.dropout if self.training else 0.0
        if need_weights:
            weights = attention_weights(q, k, mask)  # (B, h, Lq, Lk), scaled by 1/√d_head
            out = F.dropout(weights, p) @ v if p else weights @ v  # (B, h, Lq, d_head)
        else:  # PyTorch's fused kernel: the (Lq, Lk) weights are never materialised
            out, weights = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p), None
            if mask is not None:  # SDPA may return NaN for a query with no allowed key: make it 0
                out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # (B, h, Lq, d_head)
        return self.out_proj(merge_heads(out)), weights  # (B, h, Lq, d_head) -> (B, Lq, d_model)

    @classmethod
    @torch.no_grad()
    def from_torch(cls, m: nn.MultiheadAttention) -> MultiHeadAttention:
        """Copy the weights of a ``torch.nn.MultiheadAttention`` (either ``batch_first``, with or
        without kdim/vdim). The result computes the same function, batch-first, with the mask
        convention inverted (ours True = attend, theirs True = blocked)."""
        if not isinstance(m, nn.MultiheadAttention):
            raise TypeError(f"m must be a torch.nn.MultiheadAttention, got {type(m).__name__}")
        if m.bias_k is not None or m.add_zero_attn:
            raise ValueError("m uses add_bias_kv or add_zero_attn, which MultiHeadAttention does not model")
        bias = m.in_proj_bias is not None
        new = cls(m.embed_dim, m.num_heads, bias=bias, kdim=m.kdim, vdim=m.vdim, dropout=m.dropout)
        new.to(m.out_proj.weight)
        if m._qkv_same_embed_dim:
            weights = m.in_proj_weight.chunk(3)  # stacked [W_Q; W_K; W_V], each (d_model, d_model)
        else:
            weights = (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)
        biases = m.in_proj_bias.chunk(3) if bias else (None,) * 3
        for proj, w, b in zip((new.q_proj, new.k_proj, new.v_proj), weights, biases, strict=True):
            proj.weight.copy_(w)
            if b is not None:
                proj.bias.copy_(b)
        new.out_proj.weight.copy_(m.out_proj.weight)
        if bias:
            new.out_proj.bias.copy_(m.out_proj.bias)
        return new

    @torch.no_grad()
    def to_torch(self) -> nn.MultiheadAttention:
        """A ``torch.nn.MultiheadAttention(batch_first=True)`` computing the same function
        (pass it ``attn_mask=~mask`` and ``average_attn_weights=False`` to compare weights)."""
        bias = self.q_proj.bias is not None
        m = nn.MultiheadAttention(
            self.d_model,
            self.num_heads,
            dropout=self.dropout,
            bias=bias,
            kdim=self.kdim,
            vdim=self.vdim,
            batch_first=True,
        ).to(self.out_proj.weight)
        if m._qkv_same_embed_dim:
            m.in_proj_weight.copy_(torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]))
        else:
            m.q_proj_weight.copy_(self.q_proj.weight)
            m.k_proj_weight.copy_(self.k_proj.weight)
            m.v_proj_weight.copy_(self.v_proj.weight)
        if bias:
            m.in_proj_bias.copy_(torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]))
            m.out_proj.bias.copy_(self.out_proj.bias)
        m.out_proj.weight.copy_(self.out_proj.weight)
        return m

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, d_head={self.d_head}"
