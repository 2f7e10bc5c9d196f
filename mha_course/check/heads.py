"""Checkers for splitting the model width into heads and merging the heads back."""

from __future__ import annotations

import torch

from .. import heads as _heads
from .framework import Case, CheckResult, Mistake, run_check, tensor_generator

__all__ = ["split_heads", "merge_heads"]

_SPLIT_SHAPES = [  # (B, L, h, d_head) — L never equals h, so a missing transpose shows in the shape
    (2, 5, 3, 4, "B=2, L=5, 3 heads of width 4"),
    (1, 7, 2, 3, "odd sizes"),
    (3, 2, 4, 1, "heads of width 1"),
    (2, 3, 1, 6, "one head"),
]


def _split_variant(x, num_heads, how):
    B, L, D = x.shape
    hd = D // num_heads
    if how == "notranspose":
        return x.reshape(B, num_heads, L, hd)
    if how == "interleaved":
        return x.reshape(B, L, hd, num_heads).permute(0, 3, 1, 2)
    return x.reshape(B, L, num_heads, hd)  # "forgot transpose": (B, L, h, d_head)


SPLIT_HEADS_MISTAKES = [
    Mistake(
        "no transpose",
        lambda x, h: _split_variant(x, h, "notranspose"),
        "reshape without transpose: view(B, num_heads, L, d_head) deals consecutive tokens out to the heads — "
        "view as (B, L, num_heads, d_head), then transpose(1, 2)",
    ),
    Mistake(
        "interleaved",
        lambda x, h: _split_variant(x, h, "interleaved"),
        "interleaved heads: view(B, L, d_head, num_heads) deals the features out round-robin; head i owns "
        "the contiguous columns [i·d_head, (i+1)·d_head) — view as (B, L, num_heads, d_head)",
    ),
    Mistake(
        "forgot transpose",
        lambda x, h: _split_variant(x, h, "forgot"),
        "returned (B, L, num_heads, d_head): transpose(1, 2) to put the heads before the positions",
    ),
]


def split_heads(fn) -> CheckResult:
    """Check ``fn(x, num_heads)``: (B, L, h·d_head) -> (B, h, L, d_head), head i taking feature
    columns [i·d_head, (i+1)·d_head) at every position."""
    g = tensor_generator()
    cases = [Case((torch.randn(B, L, h * hd, generator=g), h), description=text) for B, L, h, hd, text in _SPLIT_SHAPES]
    return run_check(
        "split_heads",
        fn,
        cases,
        _heads.split_heads,
        SPLIT_HEADS_MISTAKES,
        arg_names=("x", "num_heads"),
        output_label="output",
    )


def _merge_variant(x, how):
    B, h, L, hd = x.shape
    if how == "notranspose":
        return x.reshape(B, L, h * hd)
    if how == "wrong dims":
        return x.transpose(2, 3).reshape(B, L, h * hd)
    if how == "interleaved":
        return x.permute(0, 2, 3, 1).reshape(B, L, h * hd)
    return x.transpose(1, 2)  # "not flattened": (B, L, h, d_head)


MERGE_HEADS_MISTAKES = [
    Mistake(
        "no transpose",
        lambda x: _merge_variant(x, "notranspose"),
        "reshape without transpose: reshaping (B, num_heads, L, d_head) straight to (B, L, d_model) mixes "
        "tokens and heads — transpose(1, 2) to (B, L, num_heads, d_head) first",
    ),
    Mistake(
        "wrong dims",
        lambda x: _merge_variant(x, "wrong dims"),
        "transposed the wrong dims: swap the head and position dims (transpose(1, 2)), not L and d_head",
    ),
    Mistake(
        "interleaved",
        lambda x: _merge_variant(x, "interleaved"),
        "the heads are interleaved feature by feature (heads moved last): head i's features belong in the "
        "contiguous columns [i·d_head, (i+1)·d_head) — transpose(1, 2), then reshape",
    ),
    Mistake(
        "not flattened",
        lambda x: _merge_variant(x, "not flattened"),
        "returned (B, L, num_heads, d_head): reshape to (B, L, num_heads·d_head) to concatenate the heads",
    ),
]


def merge_heads(fn) -> CheckResult:
    """Check ``fn(x)``: (B, h, L, d_head) -> (B, L, h·d_head), the inverse of split_heads
    (head i's features land in columns [i·d_head, (i+1)·d_head))."""
    g = tensor_generator()
    cases = [Case((torch.randn(B, h, L, hd, generator=g),), description=text) for B, L, h, hd, text in _SPLIT_SHAPES]
    return run_check(
        "merge_heads", fn, cases, _heads.merge_heads, MERGE_HEADS_MISTAKES, arg_names=("x",), output_label="output"
    )
