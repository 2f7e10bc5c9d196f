"""Checker for notebook 08's exercise: the previous-token score of attention maps."""

from __future__ import annotations

import torch

from ..i18n import tr
from ..lessons.pretrained import next_token_score
from ..lessons.pretrained import previous_token_score as _reference
from .framework import Case, mistakes, run_check, tensor_generator

__all__ = ["previous_token_score"]


def _maps(*shape, generator, sharp=2.0):
    """Random attention maps (..., L, L): softmax of scaled Gaussian scores, rows sum to 1."""
    return torch.softmax(sharp * torch.randn(*shape, generator=generator), dim=-1)


def _argmax_hits(attn):
    """Fraction of queries whose most-attended key is the previous token (another score)."""
    L = attn.shape[-1]
    hits = attn[..., 1:, :].argmax(dim=-1) == torch.arange(L - 1)  # query i+1 -> key i
    return hits.to(attn.dtype).mean(dim=-1)


PREVIOUS_TOKEN_SCORE_MISTAKES = mistakes(
    "previous_token_score",
    {
        "diagonal": lambda a: a.diagonal(dim1=-2, dim2=-1).mean(dim=-1),
        "next token": next_token_score,
        "divide by L": lambda a: a.diagonal(offset=-1, dim1=-2, dim2=-1).sum(dim=-1) / a.shape[-1],
        "sum": lambda a: a.diagonal(offset=-1, dim1=-2, dim2=-1).sum(dim=-1),
        "argmax": _argmax_hits,
        "default dims": lambda a: a.diagonal(offset=-1).mean(dim=-1),
        "whole map": lambda a: a.mean(dim=(-2, -1)),
    },
)


def previous_token_score(fn):
    """Check ``fn(attn) -> score``: attn (..., L, L) attention maps (rows = queries, columns =
    keys); score (...) = the average, over the L-1 queries i = 1..L-1, of attn[..., i, i-1]."""
    g = tensor_generator()
    cases = [
        Case((_maps(6, 6, generator=g),), description="one map, L=6"),
        Case((_maps(3, 4, 9, 9, generator=g),), description="3 layers × 4 heads, L=9"),
        Case((_maps(2, 5, 5, generator=g, sharp=4.0),), description="peaked maps"),
        Case((_maps(2, 3, 2, 2, generator=g),), description="L=2: one query has a previous token"),
        Case((_maps(6, 12, 16, 16, generator=g),), description="6 layers × 12 heads, L=16 (MiniLM's shape)"),
    ]
    return run_check(
        "previous_token_score",
        fn,
        cases,
        reference=_reference,
        mistakes=PREVIOUS_TOKEN_SCORE_MISTAKES,
        arg_names=("attn",),
        output_label=tr("score", "label"),
    )
