"""Checkers for the boolean attention masks (True = may attend)."""

from __future__ import annotations

import torch

from .. import masks as _masks
from .framework import Case, CheckResult, Mistake, run_check

__all__ = ["causal_mask", "padding_mask"]


def _ones(q_len, k_len):
    return torch.ones(q_len, q_len if k_len is None else k_len, dtype=torch.bool)


CAUSAL_MASK_MISTAKES = [
    Mistake(
        "inverted",
        lambda q, k=None: ~_masks.causal_mask(q, k),
        "polarity inverted: True means 'may attend', so the past and the diagonal are True and the future "
        "is False (you marked the blocked positions)",
    ),
    Mistake(
        "no diagonal",
        lambda q, k=None: _masks.causal_mask(q, k).tril(-1 + (0 if k is None else k - q)),
        "the diagonal is excluded: a query must see its own position (use tril() with the diagonal included)",
    ),
    Mistake(
        "future",
        lambda q, k=None: _ones(q, k).triu(0 if k is None else k - q),
        "the mask lets each query see the future instead of the past: True belongs on and below the diagonal",
    ),
    Mistake(
        "top-left",
        lambda q, k=None: _ones(q, k).tril(),
        "top-left alignment when k_len > q_len: the queries are the LAST q_len positions, so query i sees "
        "keys j <= i + (k_len - q_len) — shift the diagonal by k_len - q_len",
    ),
]


def causal_mask(fn) -> CheckResult:
    """Check ``fn(q_len, k_len=None)`` -> bool (q_len, k_len), True = may attend.

    ``k_len`` defaults to ``q_len``. With k_len > q_len the queries are the last q_len of the
    k_len positions (bottom-right aligned, as when decoding with a KV cache): query i sees keys
    j <= i + (k_len - q_len). The result must be a bool tensor.
    """
    cases = [
        Case((4,), description="4×4"),
        Case((1,), description="1×1"),
        Case((5, 5), description="5×5, k_len given"),
        Case((3, 5), description="Lq < Lk (bottom-right)"),
        Case((1, 6), description="one new query, 6 keys"),
    ]
    return run_check(
        "causal_mask",
        fn,
        cases,
        _masks.causal_mask,
        CAUSAL_MASK_MISTAKES,
        arg_names=("q_len", "k_len"),
        output_label="mask",
    )


def _real(lengths, max_len, *, op="lt"):
    positions = torch.arange(max_len)[None, :]  # (1, max_len)
    return positions < lengths[:, None] if op == "lt" else positions <= lengths[:, None]  # (B, max_len)


PADDING_MASK_MISTAKES = [
    Mistake(
        "inverted",
        lambda lengths, n: ~_real(lengths, n)[:, None, None, :],
        "polarity inverted: True marks the real tokens (positions < length), False the padding",
    ),
    Mistake(
        "off by one",
        lambda lengths, n: _real(lengths, n, op="le")[:, None, None, :],
        "off by one: position j is a real token when j < length (positions count from 0), not j <= length",
    ),
    Mistake(
        "no broadcast dims",
        lambda lengths, n: _real(lengths, n),
        "returned (B, max_len): add the two broadcast dims, mask[:, None, None, :] → (B, 1, 1, max_len), "
        "so the mask lines up with scores (B, h, Lq, Lk)",
    ),
    Mistake(
        "wrong broadcast dim",
        lambda lengths, n: _real(lengths, n)[:, None, :, None],
        "returned (B, 1, max_len, 1), which masks query positions: padding hides KEYS, so the last dim "
        "must be max_len — (B, 1, 1, max_len)",
    ),
]


def padding_mask(fn) -> CheckResult:
    """Check ``fn(lengths, max_len)`` -> bool (B, 1, 1, max_len), True = a real token.

    ``lengths`` is a 1-D integer tensor (the real length of each sequence, 0..max_len); the two
    size-1 dims let the mask broadcast over heads and query positions.
    """
    cases = [
        Case((torch.tensor([3, 5, 1]), 5), description="3 sequences"),
        Case((torch.tensor([2]), 6), description="one sequence"),
        Case((torch.tensor([4, 4]), 4), description="no padding"),
        Case((torch.tensor([0, 2, 7]), 7), description="an empty sequence"),
    ]

    return run_check(
        "padding_mask",
        fn,
        cases,
        _masks.padding_mask,
        PADDING_MASK_MISTAKES,
        arg_names=("lengths", "max_len"),
        output_label="mask",
    )
