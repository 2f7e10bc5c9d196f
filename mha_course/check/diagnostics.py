"""Checker for notebook 10's exercise: per-head attention entropy."""

from __future__ import annotations

import math

import torch

from .framework import Case, CheckResult, Mistake, run_check, tensor_generator

__all__ = ["attention_entropy"]


def _plogp(w: torch.Tensor) -> torch.Tensor:
    return torch.where(w > 0, w * torch.log(w.clamp_min(1e-30)), torch.zeros_like(w))


def _reference(weights: torch.Tensor) -> torch.Tensor:
    row = -_plogp(weights).sum(dim=-1)  # (B, h, Lq): one entropy per query row, in nats
    return row.mean(dim=(0, 2))  # (h,)


def _cases() -> list[Case]:
    g = tensor_generator()

    def softmax(B, h, Lq, Lk, *, causal=False):
        scores = 2 * torch.randn(B, h, Lq, Lk, generator=g)
        if causal:  # blocked keys get weight exactly 0
            allowed = torch.ones(Lq, Lk, dtype=torch.bool).tril(diagonal=Lk - Lq)
            scores = scores.masked_fill(~allowed, float("-inf"))
        return scores.softmax(dim=-1)

    extremes = torch.zeros(1, 2, 3, 4)
    extremes[0, 0] = 0.25  # head 0: uniform over 4 keys, entropy ln 4
    extremes[0, 1, torch.arange(3), torch.tensor([0, 2, 3])] = 1.0  # head 1: one-hot rows, entropy 0
    return [
        Case((softmax(2, 3, 4, 5),), description="B=2, 3 heads, Lq=4, Lk=5"),
        Case((softmax(1, 2, 6, 6, causal=True),), description="causal weights (exact zeros)"),
        Case((softmax(3, 4, 2, 7),), description="4 heads, Lq=2, Lk=7"),
        Case((extremes,), description="a uniform head (ln 4) and a one-hot head (0)"),
    ]


ATTENTION_ENTROPY_MISTAKES = [
    Mistake(
        "0·log 0",
        lambda w: -(w * torch.log(w)).sum(dim=-1).mean(dim=(0, 2)),
        "a weight of exactly 0 gives 0·log 0 = 0·(−inf) = NaN: define that term as 0 "
        "(torch.where(w > 0, ...), or torch.special.xlogy(w, w))",
    ),
    Mistake(
        "log2",
        lambda w: _reference(w) / math.log(2),
        "entropy in bits (log base 2): use the natural log, so a uniform row over n keys gives ln n",
    ),
    Mistake("sign", lambda w: -_reference(w), "the minus sign is missing: entropy is −Σ p log p, never negative"),
    Mistake(
        "normalised",
        lambda w: _reference(w) / math.log(w.shape[-1]),
        "divided by ln Lk: the exercise asks for the plain entropy in nats, not the normalised one",
    ),
    Mistake(
        "query axis",
        lambda w: -_plogp(w).sum(dim=-2).mean(dim=(0, 2)),
        "summed over the queries (dim −2): each query's row over the keys (dim −1) is one distribution",
    ),
    Mistake(
        "sum over queries",
        lambda w: -_plogp(w).sum(dim=-1).sum(dim=2).mean(dim=0),
        "summed the rows' entropies over the queries: take the mean over batch and queries",
    ),
    Mistake(
        "kept batch",
        lambda w: -_plogp(w).sum(dim=-1).mean(dim=2),
        "one value per (batch, head): average over the batch dim too, to get one value per head (h,)",
    ),
    Mistake(
        "over heads",
        lambda w: _reference(w).mean(),
        "averaged over the heads as well: return one entropy per head, shape (h,)",
    ),
]


def attention_entropy(fn) -> CheckResult:
    """Check ``fn(weights) -> (h,)``: the mean entropy of each head's attention rows, in nats.

    weights (B, h, Lq, Lk), every row a distribution over the keys (it may hold exact zeros,
    where keys were masked). Row entropy −Σ_j p_j ln p_j with 0·ln 0 = 0; mean over batch and
    query rows.
    """
    return run_check(
        "attention_entropy",
        fn,
        _cases(),
        _reference,
        ATTENTION_ENTROPY_MISTAKES,
        arg_names=("weights",),
        output_label="entropy",
    )
