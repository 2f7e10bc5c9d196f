"""Checkers for notebook 12's learned sinks and StreamingLLM positions: the softmax with one sink
logit per head, and the positions a rolling cache hands to RoPE."""

from __future__ import annotations

import torch

from .. import cache_schemes as _cs
from ..i18n import tr
from .framework import Case, CheckResult, mistakes, run_check, tensor_generator

__all__ = ["sink_softmax", "cache_positions"]


# ---------------------------------------------------------------------------------------------
# the softmax with a learned sink


def _with_sink(scores, sinks):
    """scores (B, h, Lq, Lk) and sinks broadcastable to (B, h, Lq, 1) -> (B, h, Lq, Lk + 1) softmax."""
    sink = sinks.to(scores.dtype).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)


def _without_max(scores, sinks):
    """exp of the raw scores: exact for small scores, inf/inf = NaN once a score passes ~88 in float32."""
    e, e_sink = torch.exp(scores), torch.exp(sinks.to(scores.dtype))[:, None, None]
    return e / (e.sum(dim=-1, keepdim=True) + e_sink)


def _reference(scores, sinks):
    return _with_sink(scores, sinks[:, None, None])[..., :-1]


SINK_SOFTMAX_MISTAKES = mistakes(
    "sink_softmax",
    {
        "sink ignored": lambda scores, sinks: torch.softmax(scores, dim=-1),
        "wrong column dropped": lambda scores, sinks: _with_sink(scores, sinks[:, None, None])[..., 1:],
        "sink per query": lambda scores, sinks: _with_sink(scores, sinks[:, None])[..., :-1],
        "one sink for all heads": lambda scores, sinks: _with_sink(scores, sinks[0])[..., :-1],
        "no max subtracted": _without_max,
    },
)


def sink_softmax(fn) -> CheckResult:
    """Check ``fn(scores, sinks) -> weights``: scores (B, h, Lq, Lk) float with −inf at blocked
    keys, sinks (h,) one logit per head; the weights (B, h, Lq, Lk) of a softmax over each row's
    scores and its head's sink, with the sink's share dropped (rows sum to less than 1)."""
    g = tensor_generator()

    def scores(B, h, Lq, Lk, spread=2.0, causal=False):
        s = spread * torch.randn(B, h, Lq, Lk, generator=g)
        if causal:
            allowed = torch.ones(Lq, Lk, dtype=torch.bool).tril(diagonal=Lk - Lq)
            s = s.masked_fill(~allowed, float("-inf"))
        return s

    specs = [  # (scores, sinks, description)
        (scores(1, 3, 3, 4), torch.tensor([0.5, -1.0, 2.0]), "3 heads, 3 queries, 4 keys"),
        (scores(2, 2, 4, 6, causal=True), torch.tensor([1.0, -0.5]), "causal, −inf at blocked keys"),
        (
            scores(1, 4, 2, 5),
            torch.tensor([-20.0, 0.0, 3.0, 8.0]),
            "a sink that takes almost nothing, one that takes almost all",
        ),
        (scores(2, 2, 5, 5, spread=8.0, causal=True), torch.tensor([2.5, 0.0]), "large scores"),
        (scores(1, 2, 1, 7, causal=True), torch.tensor([0.0, 1.0]), "one query (decoding)"),
        (
            100.0 + scores(1, 2, 3, 4),
            torch.tensor([99.0, 101.0]),
            "scores and sinks near 100, as a trained model's can be",
        ),
    ]
    cases = [Case((s, k), description=text) for s, k, text in specs]
    return run_check(
        "sink_softmax",
        fn,
        cases,
        _reference,
        SINK_SOFTMAX_MISTAKES,
        arg_names=("scores", "sinks"),
        output_label="weights",
    )


# ---------------------------------------------------------------------------------------------
# StreamingLLM: positions within the cache


def _slot_order(positions):
    kept = positions >= 0
    return torch.where(kept, kept.long().cumsum(0) - 1, -1)  # ranks by slot, not by age


CACHE_POSITIONS_MISTAKES = mistakes(
    "cache_positions",
    {
        "text positions": lambda positions: positions.clone(),
        "slot order": _slot_order,
        "empty slots counted": lambda positions: torch.where(positions >= 0, positions.argsort().argsort(), -1),
        "empty not marked": lambda positions: _cs.cache_positions(positions).clamp(min=0),
        "counts from 1": lambda positions: torch.where(positions >= 0, _cs.cache_positions(positions) + 1, -1),
    },
)


def cache_positions(fn) -> CheckResult:
    """Check ``fn(positions) -> (slots,)``: positions (slots,) long, the text position each slot of
    a window-plus-sinks cache holds (−1 = empty); return each slot's position within the cache —
    0 for the oldest kept token, 1 for the next, … — and −1 for an empty slot."""
    specs = [  # (positions, description)
        ([0, 1, 2, 3, 8, 9, 6, 7], "tokens 0–3, 6–9 in a rolling layout"),
        ([0, 1, 10, 11, 12, 9], "2 sinks; the window wrapped around"),
        ([0, -1, 2, -1], "empty slots between kept ones"),
        ([5, 3, -1, 0], "an empty slot, kept tokens out of order"),
        ([14, 12, 13], "no sinks, a full window"),
        ([-1, 4], "one kept token"),
    ]
    cases = [Case((torch.tensor(p),), description=text) for p, text in specs]
    return run_check(
        "cache_positions",
        fn,
        cases,
        _cs.cache_positions,
        CACHE_POSITIONS_MISTAKES,
        arg_names=("positions",),
        output_label=tr("positions within the cache", "label"),
    )
