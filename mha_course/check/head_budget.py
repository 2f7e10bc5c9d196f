"""Checker for notebook 03's FLOPs exercise: one attention layer's forward FLOPs, split into
projections and scores, for queries and keys of different lengths and any head width."""

from __future__ import annotations

from .framework import Case, mistakes, run_check

__all__ = ["attention_flops_split"]


def _split(b, lq, lk, d, h, hd):
    """(projections, scores): a (m×k) @ (k×n) product costs 2·m·n·k FLOPs."""
    inner = h * hd  # width of all heads together
    projections = 2 * b * lq * d * inner + 2 * (2 * b * lk * d * inner) + 2 * b * lq * inner * d  # W_Q; W_K, W_V; W_O
    scores = h * (2 * b * lq * lk * hd + 2 * b * lq * lk * hd)  # per head: Q Kᵀ and weights @ V
    return projections, scores


#: the slips the checker recognises (the instructor guide reads this list)
ATTENTION_FLOPS_SPLIT_MISTAKES = mistakes(
    "attention_flops_split",
    {
        "swapped": lambda b, lq, lk, d, h, hd: _split(b, lq, lk, d, h, hd)[::-1],
        "multiply-adds": lambda b, lq, lk, d, h, hd: tuple(x // 2 for x in _split(b, lq, lk, d, h, hd)),
        "K, V on the queries": lambda b, lq, lk, d, h, hd: (8 * b * lq * d * h * hd, _split(b, lq, lk, d, h, hd)[1]),
        "width d_model": lambda b, lq, lk, d, h, hd: (4 * b * d * d * (lq + lk), 4 * b * lq * lk * d),
        "no W_O": lambda b, lq, lk, d, h, hd: (
            _split(b, lq, lk, d, h, hd)[0] - 2 * b * lq * h * hd * d,
            _split(b, lq, lk, d, h, hd)[1],
        ),
        "only QK^T": lambda b, lq, lk, d, h, hd: (_split(b, lq, lk, d, h, hd)[0], 2 * b * h * lq * lk * hd),
        "L squared": lambda b, lq, lk, d, h, hd: (_split(b, lq, lk, d, h, hd)[0], 4 * b * h * lq * lq * hd),
        "one head": lambda b, lq, lk, d, h, hd: (_split(b, lq, lk, d, h, hd)[0], 4 * b * lq * lk * hd),
        "no batch": lambda b, lq, lk, d, h, hd: _split(1, lq, lk, d, h, hd),
    },
)


def attention_flops_split(fn):
    """Check ``fn(batch, q_len, kv_len, d_model, num_heads, head_dim) -> (projection_flops, score_flops)``.

    Forward FLOPs of one attention layer (a multiply-add = 2 FLOPs; softmax, scaling and biases not
    counted) whose queries come from q_len tokens and keys/values from kv_len tokens, each of width
    d_model, with num_heads heads of width head_dim: projections W_Q, W_K, W_V (d_model →
    num_heads·head_dim) and W_O (back to d_model); scores Q Kᵀ and weights @ V of every head.
    Both must be Python ints.
    """
    cases = [
        Case((2, 3, 7, 16, 4, 8), description="B=2, 3 queries, 7 keys, h·head_dim=32 ≠ d=16"),
        Case((1, 5, 5, 32, 4, 8), description="self-attention, h·head_dim = d"),
        Case((3, 1, 40, 24, 2, 16), description="one query reading 40 keys"),
        Case((1, 10, 6, 12, 3, 4), description="more queries than keys"),
        Case((2, 4, 9, 8, 1, 8), description="one head"),
    ]
    return run_check(
        "attention_flops_split",
        fn,
        cases,
        reference=_split,
        mistakes=ATTENTION_FLOPS_SPLIT_MISTAKES,
        arg_names=("batch", "q_len", "kv_len", "d_model", "num_heads", "head_dim"),
        output_names=("projections", "scores"),
    )
