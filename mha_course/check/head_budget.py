"""Checker for notebook 03's FLOPs exercise: split one MHA layer's FLOPs into projections and scores."""

from __future__ import annotations

from ..lessons.head_budget import flops_split
from .framework import Case, Mistake, run_check

__all__ = ["attention_flops_split"]


def _split(b, n, d, h):
    return flops_split(b, n, d, h)


ATTENTION_FLOPS_SPLIT_MISTAKES = [
    Mistake(
        "swapped",
        lambda b, n, d, h: _split(b, n, d, h)[::-1],
        "the two numbers are swapped: return (projections, scores)",
    ),
    Mistake(
        "multiply-adds",
        lambda b, n, d, h: tuple(x // 2 for x in _split(b, n, d, h)),
        "you counted multiply-adds: each multiply-add is 2 FLOPs (one multiply, one add)",
    ),
    Mistake(
        "no W_O",
        lambda b, n, d, h: (6 * b * n * d * d, _split(b, n, d, h)[1]),
        "the projections miss one matrix: count W_Q, W_K, W_V *and* the output projection W_O "
        "(4 of d×d, 2·B·L·d² FLOPs each)",
    ),
    Mistake(
        "only QK^T",
        lambda b, n, d, h: (_split(b, n, d, h)[0], 2 * b * n * n * d),
        "the scores count only Q Kᵀ: the weights @ V product costs as much again (2·B·L²·d each)",
    ),
    Mistake(
        "times h",
        lambda b, n, d, h: (_split(b, n, d, h)[0], h * _split(b, n, d, h)[1]),
        "you multiplied by h as if every head were d_model wide: each head is d_head = d/h wide, "
        "so the h heads together cost the same as one d-wide head",
    ),
    Mistake(
        "projections times h",
        lambda b, n, d, h: (h * _split(b, n, d, h)[0], _split(b, n, d, h)[1]),
        "you multiplied the projections by h: all heads' W_Q together are one d×d matrix "
        "(h blocks of d×d_head), so the projections do not depend on h",
    ),
    Mistake(
        "one head",
        lambda b, n, d, h: (_split(b, n, d, h)[0], 4 * b * n * n * (d // h)),
        "the scores are those of one head (4·B·L²·d_head): add up all h heads (h·d_head = d)",
    ),
    Mistake(
        "L not squared",
        lambda b, n, d, h: (_split(b, n, d, h)[0], 4 * b * n * d),
        "the scores grow with L², not L: each head's score matrix is L×L (every query meets every key)",
    ),
    Mistake(
        "no batch",
        lambda b, n, d, h: _split(1, n, d, h),
        "you left out the batch: every one of the B sequences costs the same again",
    ),
]


def attention_flops_split(fn):
    """Check ``fn(batch, seq_len, d_model, num_heads) -> (projection_flops, score_flops)``.

    Forward FLOPs of one multi-head self-attention layer (d_head = d_model / num_heads, a
    multiply-add = 2 FLOPs, softmax and biases not counted): projections X W_Q, X W_K, X W_V and
    the output projection; scores Q Kᵀ and weights @ V. Both must be Python ints.
    """
    cases = [
        Case((1, 10, 64, 4), description="B=1, L=10, d=64, h=4"),
        Case((3, 7, 48, 3), description="B=3, odd sizes"),
        Case((2, 200, 32, 8), description="L > 2·d: scores dominate"),
        Case((1, 1, 512, 8), description="a single token"),
        Case((2, 16, 96, 1), description="one wide head"),
    ]
    return run_check(
        "attention_flops_split",
        fn,
        cases,
        reference=_split,
        mistakes=ATTENTION_FLOPS_SPLIT_MISTAKES,
        arg_names=("batch", "seq_len", "d_model", "num_heads"),
        output_names=("projections", "scores"),
    )
