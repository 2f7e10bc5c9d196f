"""Checker for notebook 00's demonstration of how checkers work (no exercise of the course uses it).

``normalize_rows(x)``: scale each row of a positive matrix so that it sums to 1 — what a softmax's
output looks like, without the softmax. Small enough to read in one line, with slips worth naming.
"""

from __future__ import annotations

import torch

from .framework import Case, mistakes, run_check, tensor_generator

__all__ = ["normalize_rows"]


def _reference(x):
    return x / x.sum(dim=-1, keepdim=True)  # (n, m): each row divided by its own sum


#: the slips the checker recognises (the instructor guide reads this list)
NORMALIZE_ROWS_MISTAKES = mistakes(
    "normalize_rows",
    {
        "columns": lambda x: x / x.sum(dim=0, keepdim=True),
        "grand total": lambda x: x / x.sum(),
        "softmax": lambda x: torch.softmax(x, dim=-1),
        "no keepdim": lambda x: x / x.sum(dim=-1),
    },
)


def normalize_rows(fn):
    """Check ``fn(x) -> y``: x a positive float tensor (n, m); y (n, m) with each row of x divided by
    that row's sum, so that every row of y sums to 1."""
    g = tensor_generator()
    cases = [
        Case((torch.rand(3, 3, generator=g) + 0.1,), description="3×3"),
        Case((torch.rand(2, 5, generator=g) + 0.1,), description="2×5"),
        Case((torch.rand(1, 4, generator=g) + 0.1,), description="one row"),
        Case((torch.rand(6, 1, generator=g) + 0.1,), description="one column"),
    ]
    return run_check(
        "normalize_rows", fn, cases, reference=_reference, mistakes=NORMALIZE_ROWS_MISTAKES, arg_names=("x",)
    )
