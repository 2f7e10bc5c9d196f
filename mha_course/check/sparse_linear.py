"""Checkers for notebook 16: the top-k mask of sparse attention and one step of the gated delta rule."""

from __future__ import annotations

import torch

from ..i18n import tr
from ..sparse import topk_mask as _topk_mask
from .framework import Case, CheckResult, mistakes, run_check, tensor_generator

__all__ = ["topk_mask", "delta_rule_update"]


# ---------------------------------------------------------------------------------------------
# the top-k mask


def _select(scores, top_k, dim=-1, largest=True):
    k = min(top_k, scores.shape[dim])
    return torch.zeros(scores.shape, dtype=torch.bool).scatter(
        dim, scores.topk(k, dim=dim, largest=largest).indices, True
    )


def _masked(scores, mask):
    return scores if mask is None else scores.masked_fill(~mask, float("-inf"))


def _and(selected, mask):
    return selected if mask is None else selected & mask


TOPK_MASK_MISTAKES = mistakes(
    "topk_mask",
    {
        "top-k before the mask": lambda s, k, mask=None: _and(_select(s, k), mask),
        "mask ignored": lambda s, k, mask=None: _select(s, k),
        "wrong axis": lambda s, k, mask=None: _and(_select(_masked(s, mask), k, dim=-2), mask),
        "lowest scores": lambda s, k, mask=None: _and(_select(-_masked(-s, mask), k, largest=False), mask),
        "blocked keys kept": lambda s, k, mask=None: _select(_masked(s, mask), k),
    },
)  # fmt: skip


def topk_mask(fn) -> CheckResult:
    """Check ``fn(index_scores, top_k, mask=None) -> bool (B, Lq, Lk)``: True at each query's
    top_k highest-scoring allowed keys (all allowed ones when fewer), False elsewhere."""
    g = tensor_generator()

    def causal(Lq, Lk):
        return torch.ones(Lq, Lk, dtype=torch.bool).tril(diagonal=Lk - Lq)[None]

    def padding(B, Lq, Lk, lengths):
        return (torch.arange(Lk)[None, None, :] < torch.tensor(lengths)[:, None, None]).expand(B, Lq, Lk)

    specs = [  # (scores, top_k, mask, description)
        (torch.randn(1, 6, 8, generator=g), 3, causal(6, 8), "causal, Lq=6 < Lk=8, top 3"),
        (torch.randn(2, 5, 7, generator=g), 2, None, "no mask, top 2"),
        (torch.randn(2, 4, 9, generator=g), 4, padding(2, 4, 9, [9, 5]), "padding mask, one row of 5 real keys"),
        (torch.randn(1, 5, 5, generator=g), 2, causal(5, 5), "square causal: the first row has one key"),
        (torch.randn(1, 3, 6, generator=g), 10, causal(3, 6), "top_k larger than Lk"),
    ]
    cases = [Case((s, k, m), description=text) for s, k, m, text in specs]
    return run_check(
        "topk_mask",
        fn,
        cases,
        _topk_mask,
        TOPK_MASK_MISTAKES,
        arg_names=("index_scores", "top_k", "mask"),
        output_label=tr("selection", "label"),
    )


# ---------------------------------------------------------------------------------------------
# one step of the gated delta rule


def _update(state, k, v, g, beta, *, decay_first=True, use_beta=True, transposed=False, delta=True, factor=torch.exp):
    alpha = factor(g)[..., None, None]  # (B, h, 1, 1): the fading of the old state
    faded = state * alpha if decay_first else state
    if transposed:  # the state taken as (d_v, d_k): reads S k, writes (v − S k) kᵀ (needs d_k = d_v)
        predicted = torch.einsum("bhij,bhj->bhi", faded, k)
    else:
        predicted = torch.einsum("bhkv,bhk->bhv", faded, k)
    b = beta[..., None] if use_beta else 1.0
    correction = b * (v - predicted) if delta else b * v
    if transposed:
        write = torch.einsum("bhi,bhj->bhij", correction, k)
    else:
        write = torch.einsum("bhk,bhv->bhkv", k, correction)
    new = faded + write
    return new if decay_first else new * alpha


def _reference(state, k, v, g, beta):
    return _update(state, k, v, g, beta)


DELTA_RULE_UPDATE_MISTAKES = mistakes(
    "delta_rule_update",
    {
        "decay after the update": lambda *a: _update(*a, decay_first=False),
        "beta missing": lambda *a: _update(*a, use_beta=False),
        "outer product transposed": lambda *a: _update(*a, transposed=True),
        "no delta": lambda *a: _update(*a, delta=False),
        "g as the factor": lambda *a: _update(*a, factor=lambda g: g),
        "no decay": lambda *a: _update(*a, factor=torch.ones_like),
    },
)


def delta_rule_update(fn) -> CheckResult:
    """Check ``fn(state, k, v, g, beta) -> new state``: state (B, h, d_k, d_v), k (B, h, d_k) of unit
    length, v (B, h, d_v), g (B, h) ≤ 0, beta (B, h) in (0, 1); S ← e^g S, then
    S ← S + β k (v − Sᵀ k)ᵀ."""
    gen = tensor_generator()

    def inputs(B, h, d_k, d_v):
        state = torch.randn(B, h, d_k, d_v, generator=gen)
        k = torch.nn.functional.normalize(torch.randn(B, h, d_k, generator=gen), dim=-1)
        v = torch.randn(B, h, d_v, generator=gen)
        g = -torch.rand(B, h, generator=gen) - 0.2  # in (−1.2, −0.2]: a visible decay
        beta = 0.2 + 0.6 * torch.rand(B, h, generator=gen)
        return state, k, v, g, beta

    specs = [  # square cases first, so that a transposed outer product is told apart
        (inputs(1, 2, 4, 4), "d_k = d_v = 4, 2 heads"),
        (inputs(2, 3, 5, 5), "batch of 2, 3 heads"),
        (inputs(1, 1, 3, 3), "one head"),
        (inputs(2, 2, 6, 3), "d_k = 6 ≠ d_v = 3"),
    ]
    cases = [Case(args, description=text) for args, text in specs]
    return run_check(
        "delta_rule_update",
        fn,
        cases,
        _reference,
        DELTA_RULE_UPDATE_MISTAKES,
        arg_names=("state", "k", "v", "g", "beta"),
        output_label=tr("new state", "label"),
    )
