"""Checker for notebook 09's exercise: the online-softmax update at the heart of tiled attention."""

from __future__ import annotations

import torch

from ..tiled import online_softmax_update as _reference
from .framework import Case, Mistake, run_check, tensor_generator

__all__ = ["online_softmax_update"]

_INF = float("-inf")


def _variant(
    m,
    row_sum,
    acc,
    s,
    v,
    *,
    rescale_sum=True,
    rescale_acc=True,
    sign=1,
    block_max_only=False,
    subtract_max=True,
    guard=True,
    normalise=False,
):
    """The update with one deliberate change (the reference when every flag is at its default)."""
    m_new = s.amax(dim=-1, keepdim=True) if block_max_only else torch.maximum(m, s.amax(dim=-1, keepdim=True))
    ref = m_new.masked_fill(m_new == _INF, 0.0) if guard else m_new
    alpha = torch.exp(sign * (m - ref)) if subtract_max else torch.ones_like(m)
    p = torch.exp(s - ref) if subtract_max else torch.exp(s)
    l_new = (alpha * row_sum if rescale_sum else row_sum) + p.sum(dim=-1, keepdim=True)
    acc_new = (alpha * acc if rescale_acc else acc) + p @ v
    if normalise:
        acc_new = acc_new / l_new
    return m_new, l_new, acc_new


def _start(batch, lq, dv):
    return torch.full((*batch, lq, 1), _INF), torch.zeros((*batch, lq, 1)), torch.zeros((*batch, lq, dv))


def _after(batch, lq, dv, blocks):
    """The running state after folding in the earlier ``blocks`` [(scores, v), ...]."""
    state = _start(batch, lq, dv)
    for s, v in blocks:
        state = _reference(*state, s, v)
    return state


def _cases():
    g = tensor_generator()

    def randn(*shape, shift=0.0, spread=1.0):
        return torch.randn(*shape, generator=g) * spread + shift

    cases = [
        Case(
            (*_start((), 3, 5), randn(3, 4), randn(4, 5)),
            description="first block: row_max = -inf, row_sum = 0, acc = 0",
        )
    ]

    b, lq, bk, dv = (2,), 4, 3, 2  # the new block's scores all beat the running max
    state = _after(b, lq, dv, [(randn(*b, lq, 5), randn(*b, 5, dv))])
    cases.append(
        Case((*state, randn(*b, lq, bk, shift=4.0), randn(*b, bk, dv)), description="the new block raises the max")
    )

    b, lq, bk, dv = (2, 3), 5, 6, 4  # some rows' max rises, others' does not
    state = _after(b, lq, dv, [(randn(*b, lq, 6, spread=2.0), randn(*b, 6, dv)), (randn(*b, lq, 2), randn(*b, 2, dv))])
    cases.append(
        Case((*state, randn(*b, lq, bk, spread=2.0), randn(*b, bk, dv)), description="batch dims (2, 3), third block")
    )

    b, lq, bk, dv = (1,), 4, 5, 3  # -inf entries (masked keys) in the new block
    state = _after(b, lq, dv, [(randn(*b, lq, 3), randn(*b, 3, dv))])
    s = randn(*b, lq, bk).masked_fill(torch.rand(*b, lq, bk, generator=g) < 0.4, _INF)
    s[..., 0, :] = _INF  # one row masked in this whole block
    cases.append(Case((*state, s, randn(*b, bk, dv)), description="masked keys (-inf) in the block"))

    lq, bk, dv = 3, 4, 2  # row 0 has seen only -inf, row 1 sees its first allowed key now
    first = randn(lq, 2)
    first[:2] = _INF
    state = _after((), lq, dv, [(first, randn(2, dv))])
    s = randn(lq, bk)
    s[0] = _INF
    cases.append(Case((*state, s, randn(bk, dv)), description="a row with every key masked so far"))
    return cases


def online_softmax_update(fn):
    """Check ``fn(row_max, row_sum, acc, scores, v) -> (row_max, row_sum, acc)`` updated.

    row_max, row_sum: (..., Lq, 1) the running max m and the running sum ℓ of exp(score - m);
    acc: (..., Lq, d_v) the running sum of exp(score - m) · v; scores: (..., Lq, Bk) the new block
    (-inf where masked); v: (..., Bk, d_v). A row with only -inf so far must keep m = -inf,
    ℓ = 0, acc = 0 (no NaN).
    """
    mistakes = [
        Mistake(
            "acc not rescaled",
            lambda *a: _variant(*a, rescale_acc=False),
            "acc was not rescaled: multiply the old acc by exp(m - m_new) before adding this block's p @ v "
            "(it was summed relative to the old max)",
        ),
        Mistake(
            "row_sum not rescaled",
            lambda *a: _variant(*a, rescale_sum=False),
            "row_sum was not rescaled: multiply the old row_sum by exp(m - m_new) before adding this block's sum",
        ),
        Mistake(
            "nothing rescaled",
            lambda *a: _variant(*a, rescale_sum=False, rescale_acc=False),
            "neither row_sum nor acc was rescaled: both were summed relative to the old max, so multiply both "
            "by exp(m - m_new) when the max changes",
        ),
        Mistake(
            "inverted rescale",
            lambda *a: _variant(*a, sign=-1),
            "the rescaling factor is inverted: use exp(m - m_new) (≤ 1, it shrinks the old terms), not exp(m_new - m)",
        ),
        Mistake(
            "block max only",
            lambda *a: _variant(*a, block_max_only=True),
            "the new max must be the larger of the running max and this block's max "
            "(torch.maximum(row_max, scores.amax(-1, keepdim=True))), not this block's max alone",
        ),
        Mistake(
            "normalised",
            lambda *a: _variant(*a, normalise=True),
            "acc is divided by row_sum: keep acc unnormalised (a running sum) and divide by row_sum "
            "once, after the last block",
        ),
        Mistake(
            "no max subtracted",
            lambda *a: _variant(*a, subtract_max=False),
            "the scores were exponentiated without subtracting the max: use exp(scores - m_new), and "
            "rescale the old row_sum and acc by exp(m - m_new) — that is what keeps exp from overflowing",
        ),
        Mistake(
            "no -inf guard",
            lambda *a: _variant(*a, guard=False),
            "NaN for a row whose scores are all -inf so far: there m_new = -inf and exp(-inf - (-inf)) "
            "is NaN; subtract 0 instead of m_new in such rows (m_new.masked_fill(m_new == -inf, 0))",
        ),
    ]
    return run_check(
        "online_softmax_update",
        fn,
        _cases(),
        reference=_reference,
        mistakes=mistakes,
        arg_names=("row_max", "row_sum", "acc", "scores", "v"),
        output_names=("row_max", "row_sum", "acc"),
    )
