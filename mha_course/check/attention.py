"""Checkers for scaled dot-product attention and a whole multi-head attention layer."""

from __future__ import annotations

import math

import torch

from .. import attention as _attention
from .. import heads as _heads
from .framework import Case, CheckResult, mistakes, run_check, tensor_generator

__all__ = ["scaled_dot_product_attention", "multi_head_attention"]


# ---------------------------------------------------------------------------------------------
# scaled_dot_product_attention(q, k, v, mask=None) -> (out, weights)


def _sdpa_variant(q, k, v, mask=None, *, scale=None, dim=-1, mask_mode="fill", fill=-math.inf, zero_empty=False):
    """Attention with one deliberate change; ``mask_mode``: fill, invert, ignore or after."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale  # (..., Lq, Lk)
    if mask is not None and mask_mode in ("fill", "invert"):
        scores = scores.masked_fill(mask if mask_mode == "invert" else ~mask, fill)
    weights = torch.softmax(scores, dim=dim)
    if mask is not None and mask_mode == "after":
        weights = weights * mask
    if mask is not None and zero_empty:
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return weights @ v, weights


def _mixed_mask(q_len, k_len, g):
    """Random bool (q_len, k_len) mask whose every row has an allowed and a blocked key,
    so that neither the mask nor its inverse has a fully masked row."""
    mask = torch.rand(q_len, k_len, generator=g) < 0.5
    rows = torch.arange(q_len)
    mask[rows, rows % k_len] = True
    mask[rows, (rows + 1) % k_len] = False
    return mask


def _sdpa_cases(fully_masked_rows: bool) -> list[Case]:
    g = tensor_generator()
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    lengths = torch.tensor([3, 5])
    padding = (torch.arange(6)[None, :] < lengths[:, None])[:, None, None, :]  # (2, 1, 1, 6)
    cases = [
        Case((r(4, 6), r(4, 6), r(4, 6)), description="2-D, no mask"),
        Case((r(2, 3, 5, 8), r(2, 3, 7, 8), r(2, 3, 7, 6)), description="batch dims, Lq≠Lk, d_k≠d_v"),
        Case((r(2, 5, 4), r(2, 6, 4), r(2, 6, 3), _mixed_mask(5, 6, g)), description="random mask"),
        Case((r(2, 2, 4, 8), r(2, 2, 6, 8), r(2, 2, 6, 5), padding), description="padding mask (B, 1, 1, Lk)"),
        Case((r(3, 1, 5), r(3, 9, 5), r(3, 9, 7)), description="one query, odd sizes"),
    ]
    if fully_masked_rows:
        mask = _mixed_mask(4, 5, g)
        mask[2] = False
        cases.append(Case((r(4, 6), r(5, 6), r(5, 3), mask), description="a fully masked row"))
    return cases


SCALED_DOT_PRODUCT_ATTENTION_MISTAKES = mistakes(
    "scaled_dot_product_attention",
    {
        "no scale": lambda q, k, v, m=None: _sdpa_variant(q, k, v, m, scale=1.0),
        "scaled by d_k": lambda q, k, v, m=None: _sdpa_variant(q, k, v, m, scale=1 / q.shape[-1]),
        "scaled by √d_v": lambda q, k, v, m=None: _sdpa_variant(q, k, v, m, scale=1 / math.sqrt(v.shape[-1])),
        "softmax dim -2": lambda q, k, v, m=None: _sdpa_variant(q, k, v, m, dim=-2),
        "swapped": lambda q, k, v, m=None: _sdpa_variant(q, k, v, m)[::-1],
        "no V": lambda q, k, v, m=None: (_sdpa_variant(q, k, v, m)[1],) * 2,
        "mask inverted": lambda q, k, v, m=None: _sdpa_variant(q, k, v, m, mask_mode="invert"),
        "mask ignored": lambda q, k, v, m=None: _sdpa_variant(q, k, v, m, mask_mode="ignore"),
        "mask after softmax": lambda q, k, v, m=None: _sdpa_variant(q, k, v, m, mask_mode="after"),
        "NaN on empty row": lambda q, k, v, m=None: _sdpa_variant(q, k, v, m),
        "uniform on empty row": lambda q, k, v, m=None: _sdpa_variant(q, k, v, m, fill=-1e9),
    },
)


def scaled_dot_product_attention(fn, *, fully_masked_rows: bool = False) -> CheckResult:
    """Check ``fn(q, k, v, mask=None) -> (out, weights)``.

    q (..., Lq, d_k), k (..., Lk, d_k), v (..., Lk, d_v); mask bool, True = may attend,
    broadcastable to (..., Lq, Lk) and passed as the 4th positional argument. Cases: 2-D, batch
    dims with Lq≠Lk and d_k≠d_v, a random (Lq, Lk) mask, a padding mask (B, 1, 1, Lk), one query.
    Any correct implementation passes (loops, einsum, ``F.scaled_dot_product_attention`` plus the
    weights, ``-inf`` or ``-1e9`` fills).

    Fully masked rows (a query with no allowed key) are left out by default: the common
    implementations give NaN (-inf fill) or uniform weights (-1e9 fill) there, and both are fine
    for a first implementation. With ``fully_masked_rows=True`` one more case has such a row and
    requires the course's convention — weights 0 and output 0 for that row — naming the fix if not.
    """
    return run_check(
        "scaled_dot_product_attention",
        fn,
        _sdpa_cases(fully_masked_rows),
        _attention.scaled_dot_product_attention,
        SCALED_DOT_PRODUCT_ATTENTION_MISTAKES,
        arg_names=("q", "k", "v", "mask"),
        output_names=("out", "weights"),
    )


# ---------------------------------------------------------------------------------------------
# multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads) -> out


def _mha_variant(
    x, w_q, w_k, w_v, w_o, h, *, split="ok", merge="ok", scale="head", dim=-1, out_proj=True, transposed=False
):
    """Multi-head attention (x @ w, head i owns column block i) with one deliberate change.

    split: ok | notranspose (view(B, h, L, d_head)) | interleaved (view(B, L, d_head, h)) | none (one head)
    merge: ok | notranspose | interleaved | reversed | block (head i into column block i, even after a
    strided split)
    scale: head (√d_head) | model (√d_model) | none
    """
    B, L, d = x.shape
    hd = d // h
    if transposed:
        w_q, w_k, w_v, w_o = w_q.T, w_k.T, w_v.T, w_o.T

    def split_(t):  # (B, L, d) -> (B, h, L, hd)
        if split == "none":
            return t[:, None]  # (B, 1, L, d)
        if split == "notranspose":
            return t.reshape(B, h, L, hd)
        if split == "interleaved":
            return t.reshape(B, L, hd, h).permute(0, 3, 1, 2)
        return t.reshape(B, L, h, hd).transpose(1, 2)

    q, k, v = split_(x @ w_q), split_(x @ w_k), split_(x @ w_v)
    s = {"head": 1 / math.sqrt(hd), "model": 1 / math.sqrt(d), "none": 1.0}[scale]
    weights = torch.softmax(q @ k.transpose(-2, -1) * s, dim=dim)  # (B, h, L, L)
    o = weights @ v  # (B, h, L, hd) or (B, 1, L, d)
    if split == "none":
        o = o[:, 0]
    elif merge == "notranspose":
        o = o.reshape(B, L, d)
    elif merge == "block":  # head i's output into column block i, whatever its split
        o = o.transpose(1, 2).reshape(B, L, d)
    elif merge == "interleaved" or (merge == "ok" and split == "interleaved"):
        o = o.permute(0, 2, 3, 1).reshape(B, L, d)
    elif merge == "reversed":
        o = o.flip(1).transpose(1, 2).reshape(B, L, d)
    else:
        o = o.transpose(1, 2).reshape(B, L, d)
    return o @ w_o if out_proj else o


def _mha_reference(x, w_q, w_k, w_v, w_o, num_heads):
    q, k, v = (_heads.split_heads(x @ w, num_heads) for w in (w_q, w_k, w_v))  # (B, h, L, d_head)
    out, _ = _attention.scaled_dot_product_attention(q, k, v)
    return _heads.merge_heads(out) @ w_o  # (B, L, d)


def _mha_cases() -> list[Case]:
    g = tensor_generator()

    def case(B, L, d, h, description):
        x = torch.randn(B, L, d, generator=g)
        ws = [torch.randn(d, d, generator=g) / math.sqrt(d) for _ in range(4)]
        return Case((x, *ws, h), description=description)

    return [
        case(2, 5, 12, 3, "B=2, L=5, d_model=12, 3 heads"),
        case(1, 7, 8, 2, "odd length, 2 heads"),
        case(3, 4, 10, 5, "5 heads of width 2"),
        case(2, 3, 6, 1, "one head"),
    ]


def _mv(**kw):
    return lambda *args: _mha_variant(*args, **kw)


MULTI_HEAD_ATTENTION_MISTAKES = mistakes(
    "multi_head_attention",
    {
        "no split, scale √d_model": _mv(split="none", scale="model"),
        "no split, scale √d_head": _mv(split="none"),
        "split without transpose": _mv(split="notranspose"),
        "split and merge without transpose": _mv(split="notranspose", merge="notranspose"),
        "merge without transpose": _mv(merge="notranspose"),
        "scale √d_model": _mv(scale="model"),
        "no scale": _mv(scale="none"),
        "softmax dim -2": _mv(dim=-2),
        "no W_O": _mv(out_proj=False),
        "merge reversed": _mv(merge="reversed"),
        "merge interleaved": _mv(merge="interleaved"),
        "split interleaved": _mv(split="interleaved"),
        "split strided": _mv(split="interleaved", merge="block"),
        "x @ w.T": _mv(transposed=True),
    },
)


def multi_head_attention(fn) -> CheckResult:
    """Check ``fn(x, w_q, w_k, w_v, w_o, num_heads) -> out``.

    x (B, L, d_model); w_* (d_model, d_model) used as ``x @ w`` (no biases); head i owns column
    block i of w_q/w_k/w_v (columns [i·d_head, (i+1)·d_head)) and row block i of w_o;
    self-attention without a mask; out (B, L, d_model). Loops over heads, einsum or
    view/transpose with ``F.scaled_dot_product_attention`` all pass.
    """
    return run_check(
        "multi_head_attention",
        fn,
        _mha_cases(),
        _mha_reference,
        MULTI_HEAD_ATTENTION_MISTAKES,
        arg_names=("x", "w_q", "w_k", "w_v", "w_o", "num_heads"),
        output_label="out",
    )
