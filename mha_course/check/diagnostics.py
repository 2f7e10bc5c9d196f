"""Checker for per-head attention entropy (the diagnostic of notebook 17, §1)."""

from __future__ import annotations

import math

import torch

from .framework import Case, CheckResult, mistakes, run_check, tensor_generator

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


ATTENTION_ENTROPY_MISTAKES = mistakes(
    "attention_entropy",
    {
        "0·log 0": lambda w: -(w * torch.log(w)).sum(dim=-1).mean(dim=(0, 2)),
        "log2": lambda w: _reference(w) / math.log(2),
        "sign": lambda w: -_reference(w),
        "normalised": lambda w: _reference(w) / math.log(w.shape[-1]),
        "query axis": lambda w: -_plogp(w).sum(dim=-2).mean(dim=(0, 2)),
        "sum over queries": lambda w: -_plogp(w).sum(dim=-1).sum(dim=2).mean(dim=0),
        "kept batch": lambda w: -_plogp(w).sum(dim=-1).mean(dim=2),
        "over heads": lambda w: _reference(w).mean(),
    },
)


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
