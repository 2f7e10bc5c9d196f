"""Checker for notebook 08's exercise: the previous-token score of attention maps."""

from __future__ import annotations

import torch

from ..lessons.pretrained import next_token_score
from ..lessons.pretrained import previous_token_score as _reference
from .framework import Case, Mistake, run_check, tensor_generator

__all__ = ["previous_token_score"]


def _maps(*shape, generator, sharp=2.0):
    """Random attention maps (..., L, L): softmax of scaled Gaussian scores, rows sum to 1."""
    return torch.softmax(sharp * torch.randn(*shape, generator=generator), dim=-1)


def _argmax_hits(attn):
    """Fraction of queries whose most-attended key is the previous token (another score)."""
    L = attn.shape[-1]
    hits = attn[..., 1:, :].argmax(dim=-1) == torch.arange(L - 1)  # query i+1 -> key i
    return hits.to(attn.dtype).mean(dim=-1)


PREVIOUS_TOKEN_SCORE_MISTAKES = [
    Mistake(
        "diagonal",
        lambda a: a.diagonal(dim1=-2, dim2=-1).mean(dim=-1),
        "you read the diagonal attn[i, i] (the token itself); the previous token of query i is "
        "key i-1, just below the diagonal: diagonal(offset=-1)",
    ),
    Mistake(
        "next token",
        next_token_score,
        "you measured the next token attn[i, i+1] (above the diagonal); rows are queries and "
        "columns keys, so the previous token is attn[i, i-1]: diagonal(offset=-1)",
    ),
    Mistake(
        "divide by L",
        lambda a: a.diagonal(offset=-1, dim1=-2, dim2=-1).sum(dim=-1) / a.shape[-1],
        "you divided by L; only the L-1 queries i = 1..L-1 have a previous token ([CLS] at "
        "position 0 has none), so average over those L-1",
    ),
    Mistake(
        "sum",
        lambda a: a.diagonal(offset=-1, dim1=-2, dim2=-1).sum(dim=-1),
        "you summed the L-1 weights; take their mean, so that 1 means a perfect previous-token head",
    ),
    Mistake(
        "argmax",
        _argmax_hits,
        "you counted how often the previous token gets the most attention; this score is the "
        "average attention weight on it (attn[i, i-1] averaged over i)",
    ),
    Mistake(
        "default dims",
        lambda a: a.diagonal(offset=-1).mean(dim=-1),
        "diagonal() takes the diagonal of dims 0 and 1 by default, which mixes layers and heads "
        "when there are batch dims: use attn.diagonal(offset=-1, dim1=-2, dim2=-1)",
    ),
    Mistake(
        "whole map",
        lambda a: a.mean(dim=(-2, -1)),
        "you averaged the whole map (that is always 1/L); keep only the entries attn[i, i-1]",
    ),
]


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
        output_label="score",
    )
