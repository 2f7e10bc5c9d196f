"""Checker for splitting heads, attending in every head at once and merging them back
(``attend_in_heads``): the split and the merge are checked together, as the pair a layer uses.

The learner's function gets the three projections q (B, Lq, h·d_head), k and v (B, Lk, h·d_head)
and must return the concatenated heads' outputs (B, Lq, h·d_head). A wrong split paired with its
own inverse merge has every shape right and still computes another function, so the cases use
L ≠ h, Lq ≠ Lk and heads of width 1, and the known wrong pairs are told apart by their values.
"""

from __future__ import annotations

import math

import torch

from ..attention import scaled_dot_product_attention
from ..heads import merge_heads, split_heads
from ..i18n import tr
from .framework import Case, CheckResult, mistakes, run_check, tensor_generator

__all__ = ["attend_in_heads"]

_SHAPES = [  # (B, Lq, Lk, h, d_head, description): L never equals h
    (2, 5, 5, 3, 4, "B=2, L=5, 3 heads of width 4"),
    (1, 3, 7, 2, 3, "Lq=3 queries, Lk=7 keys"),
    (3, 4, 2, 4, 1, "heads of width 1, Lq > Lk"),
    (2, 6, 6, 1, 5, "one head"),
]


def _reference(q, k, v, num_heads):
    """split -> scaled dot-product attention per head -> merge."""
    qh, kh, vh = (split_heads(t, num_heads) for t in (q, k, v))  # (B, h, L, d_head)
    out, _ = scaled_dot_product_attention(qh, kh, vh)  # (B, h, Lq, d_head)
    return merge_heads(out)  # (B, Lq, h*d_head)


def _variant(q, k, v, num_heads, *, split="right", merge="right", scale=None):
    B, Lq, D = q.shape
    hd = D // num_heads

    def cut(t):  # (B, L, D) -> (B, h, L, d_head), rightly or wrongly
        L = t.shape[1]
        if split == "no transpose":
            return t.reshape(B, num_heads, L, hd)
        if split == "interleaved":
            return t.reshape(B, L, hd, num_heads).permute(0, 3, 1, 2)
        return split_heads(t, num_heads)

    qh, kh, vh = cut(q), cut(k), cut(v)
    out, _ = scaled_dot_product_attention(qh, kh, vh, scale=scale)  # (B, h, Lq, d_head)
    if merge == "no transpose":  # split right, merged without the transpose back
        return out.reshape(B, Lq, D)
    if merge == "wrong dims":
        return out.transpose(2, 3).reshape(B, Lq, D)
    if split == "no transpose":  # the exact inverse of the wrong split
        return out.reshape(B, Lq, D)
    if split == "interleaved":
        return out.permute(0, 2, 3, 1).reshape(B, Lq, D)
    return merge_heads(out)


#: a split of k and v that uses the queries' length: view cannot fit Lk positions into Lq, and raises
WRONG_LENGTH = (
    "the split of k and v uses the queries' length: k and v have Lk positions, which may differ from Lq — "
    "take each tensor's own length (or let view infer it with -1)"
)

ATTEND_IN_HEADS_MISTAKES = mistakes(
    "attend_in_heads",
    {
        "no transpose": lambda q, k, v, h: _variant(q, k, v, h, split="no transpose"),
        "merge no transpose": lambda q, k, v, h: _variant(q, k, v, h, merge="no transpose"),
        "merge wrong dims": lambda q, k, v, h: _variant(q, k, v, h, merge="wrong dims"),
        "interleaved": lambda q, k, v, h: _variant(q, k, v, h, split="interleaved"),
        "scale d_model": lambda q, k, v, h: _variant(q, k, v, h, scale=1 / math.sqrt(q.shape[-1])),
        "no scale": lambda q, k, v, h: _variant(q, k, v, h, scale=1.0),
    },
)


def attend_in_heads(fn) -> CheckResult:
    """Check ``fn(q, k, v, num_heads)``: q (B, Lq, h·d_head), k and v (B, Lk, h·d_head) ->
    (B, Lq, h·d_head), head i attending with feature columns [i·d_head, (i+1)·d_head) of q, k
    and v (softmax(q kᵀ / √d_head) v) and its output placed back in those columns."""
    g = tensor_generator()
    cases = []
    for B, Lq, Lk, h, hd, text in _SHAPES:
        q, k, v = (torch.randn(B, L, h * hd, generator=g) for L in (Lq, Lk, Lk))
        cases.append(Case((q, k, v, h), description=text))
    result = run_check(
        "attend_in_heads",
        fn,
        cases,
        _reference,
        ATTEND_IN_HEADS_MISTAKES,
        arg_names=("q", "k", "v", "num_heads"),
        output_label="output",
    )
    wrong_length = "raised RuntimeError" in result.message and "invalid for input of size" in result.message
    if wrong_length and ("Lk=" in result.message or "Lq > Lk" in result.message):
        diagnosis = tr(
            "the split of k and v uses the queries' length: k and v have Lk positions, which may differ from Lq — "
            "take each tensor's own length (or let view infer it with -1)",
            "diagnosis attend_in_heads wrong length",
        )
        return CheckResult(False, f"attend_in_heads: likely mistake — {diagnosis}", result.details)
    return result
