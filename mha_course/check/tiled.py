"""Checkers for notebook 09's exercises: the online-softmax update at the heart of tiled attention,
and the tiled attention loop itself (equal to the reference, and never holding the L × L scores)."""

from __future__ import annotations

import math

import torch

from .. import validation
from ..attention import scaled_dot_product_attention as _full_attention
from ..i18n import tr, verdict
from ..kit.memory import peak_memory
from ..tiled import online_softmax_update as _reference
from ..tiled import tiled_attention as _tiled_reference
from .framework import VERDICTS, Case, CheckResult, mistakes, run_check, tensor_generator

__all__ = ["online_softmax_update", "tiled_attention"]

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


ONLINE_SOFTMAX_UPDATE_MISTAKES = mistakes(
    "online_softmax_update",
    {
        "acc not rescaled": lambda *a: _variant(*a, rescale_acc=False),
        "row_sum not rescaled": lambda *a: _variant(*a, rescale_sum=False),
        "nothing rescaled": lambda *a: _variant(*a, rescale_sum=False, rescale_acc=False),
        "inverted rescale": lambda *a: _variant(*a, sign=-1),
        "block max only": lambda *a: _variant(*a, block_max_only=True),
        "normalised": lambda *a: _variant(*a, normalise=True),
        "no max subtracted": lambda *a: _variant(*a, subtract_max=False),
        "no -inf guard": lambda *a: _variant(*a, guard=False),
    },
)


def online_softmax_update(fn):
    """Check ``fn(row_max, row_sum, acc, scores, v) -> (row_max, row_sum, acc)`` updated.

    row_max, row_sum: (..., Lq, 1) the running max m and the running sum ℓ of exp(score - m);
    acc: (..., Lq, d_v) the running sum of exp(score - m) · v; scores: (..., Lq, Bk) the new block
    (-inf where masked); v: (..., Bk, d_v). A row with only -inf so far must keep m = -inf,
    ℓ = 0, acc = 0 (no NaN).
    """
    return run_check(
        "online_softmax_update",
        fn,
        _cases(),
        reference=_reference,
        mistakes=ONLINE_SOFTMAX_UPDATE_MISTAKES,
        arg_names=("row_max", "row_sum", "acc", "scores", "v"),
        output_names=("row_max", "row_sum", "acc"),
    )


# ---------------------------------------------------------------------------------------------
# tiled_attention(q, k, v, mask=None, *, block_size=64) -> out


#: the flags of :func:`_tiled_variant` and their values in the correct loop
_CORRECT_LOOP = {"scaled": True, "drop_last": "", "mask_mode": "allowed", "guard": True, "per_tile_softmax": False}


def _tiled_variant(q, k, v, mask=None, *, block_size=64, **change):
    """The tiled loop with one deliberate ``change`` of the flags in ``_CORRECT_LOOP`` (none: the reference)."""
    flags = {**_CORRECT_LOOP, **change}
    scaled, drop_last, mask_mode, guard, per_tile_softmax = (flags[name] for name in _CORRECT_LOOP)
    *batch, Lq, Lk = validation.attention_inputs(q, k, v, mask)  # the shape of the scores
    scale = 1.0 / math.sqrt(q.shape[-1]) if scaled else 1.0
    if mask is not None:
        mask = torch.broadcast_to(mask, (*batch, Lq, Lk))
    q, k, v = (t.expand(*batch, *t.shape[-2:]) for t in (q, k, v))
    out = q.new_zeros((*batch, Lq, v.shape[-1]))
    q_stop = Lq // block_size * block_size if drop_last in ("queries", "both") else Lq
    k_stop = Lk // block_size * block_size if drop_last in ("keys", "both") else Lk
    for i in range(0, q_stop, block_size):
        qi = q[..., i : i + block_size, :] * scale
        state = (
            qi.new_full((*qi.shape[:-1], 1), _INF),
            qi.new_zeros((*qi.shape[:-1], 1)),
            qi.new_zeros((*qi.shape[:-1], v.shape[-1])),
        )
        direct = qi.new_zeros((*qi.shape[:-1], v.shape[-1]))
        for j in range(0, k_stop, block_size):
            s = qi @ k[..., j : j + block_size, :].transpose(-2, -1)
            if mask is not None and mask_mode != "ignored":
                tile = mask[..., i : i + block_size, j : j + block_size]
                s = s.masked_fill(tile if mask_mode == "inverted" else ~tile, _INF)
            if per_tile_softmax:
                direct = direct + torch.softmax(s, dim=-1).nan_to_num(0.0) @ v[..., j : j + block_size, :]
            else:
                state = _reference(*state, s, v[..., j : j + block_size, :])
        _, row_sum, acc = state
        if per_tile_softmax:
            out[..., i : i + block_size, :] = direct
        elif guard:
            out[..., i : i + block_size, :] = torch.where(row_sum > 0, acc / row_sum, 0.0)
        else:
            out[..., i : i + block_size, :] = acc / row_sum
    return out


def _tiled_cases():
    g = tensor_generator()

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    lengths = torch.tensor([9, 0])  # the second sequence is all padding: its rows attend to nothing
    padding = (torch.arange(9)[None, :] < lengths[:, None])[:, None, None, :]  # (2, 1, 1, 9)
    causal = torch.ones(12, 12, dtype=torch.bool).tril()
    return [
        Case((randn(8, 4), randn(8, 4), randn(8, 3)), {"block_size": 4}, description="8 × 8, blocks of 4"),
        Case((randn(10, 4), randn(10, 4), randn(10, 2)), {"block_size": 4}, description="L = 10, blocks of 4"),
        Case((randn(12, 8), randn(12, 8), randn(12, 8), causal), {"block_size": 4}, description="causal mask"),
        Case(
            (randn(2, 3, 5, 4), randn(2, 3, 9, 4), randn(2, 3, 9, 6), padding),
            {"block_size": 3},
            description="batch (2, 3), Lq = 5, Lk = 9, padding mask, a fully padded sequence",
        ),
        Case((randn(2, 6, 4), randn(2, 6, 4), randn(2, 6, 4)), {"block_size": 64}, description="block > L"),
    ]


TILED_ATTENTION_MISTAKES = mistakes(
    "tiled_attention",
    {
        "no scale": lambda *a, **kw: _tiled_variant(*a, **kw, scaled=False),
        "last block dropped": lambda *a, **kw: _tiled_variant(*a, **kw, drop_last="both"),
        "last key block dropped": lambda *a, **kw: _tiled_variant(*a, **kw, drop_last="keys"),
        "last query block dropped": lambda *a, **kw: _tiled_variant(*a, **kw, drop_last="queries"),
        "mask ignored": lambda *a, **kw: _tiled_variant(*a, **kw, mask_mode="ignored"),
        "mask inverted": lambda *a, **kw: _tiled_variant(*a, **kw, mask_mode="inverted"),
        "per-tile softmax": lambda *a, **kw: _tiled_variant(*a, **kw, per_tile_softmax=True),
        "NaN for a row with no allowed key": lambda *a, **kw: _tiled_variant(*a, **kw, guard=False),
        "materialises the score matrix": lambda q, k, v, mask=None, **kw: _full_attention(q, k, v, mask)[0],
    },
)

#: the memory probe: one sequence long enough that its score matrix dwarfs a tile
_PROBE_L, _PROBE_BLOCK, _PROBE_D = 256, 32, 8


def _holds_score_matrix(fn) -> tuple[bool, int, int]:
    """Run ``fn`` once on a (256, 8) q, k, v with blocks of 32 and measure its peak memory:
    ``(too_much, peak_bytes, one_score_matrix_bytes)``; too much is 3/4 of one score matrix or more."""
    g = tensor_generator()
    q, k, v = (torch.randn(_PROBE_L, _PROBE_D, generator=g) for _ in range(3))
    with torch.no_grad():
        peak = peak_memory(lambda: fn(q, k, v, block_size=_PROBE_BLOCK))
    scores = _PROBE_L * _PROBE_L * 4
    return peak >= scores * 3 // 4, peak, scores


def tiled_attention(fn) -> CheckResult:
    """Check ``fn(q, k, v, mask=None, *, block_size=64) -> out``: softmax(q kᵀ/√d_k) v computed one
    (block_size × block_size) tile of scores at a time.

    q (..., Lq, d_k), k (..., Lk, d_k), v (..., Lk, d_v), leading dims broadcast; mask bool,
    broadcastable to (..., Lq, Lk), True = may attend; out (..., Lq, d_v), 0 for a query with no
    allowed key. Besides the values, one call at L = 256 (blocks of 32) is measured: its peak
    memory must stay below three quarters of one 256 × 256 score matrix.
    """
    result = run_check(
        "tiled_attention",
        fn,
        _tiled_cases(),
        reference=_tiled_reference,
        mistakes=TILED_ATTENTION_MISTAKES,
        arg_names=("q", "k", "v", "mask"),
        output_label="out",
    )
    if not result.passed:
        return result
    try:
        too_much, peak, scores = _holds_score_matrix(fn)
    except Exception as exc:  # noqa: BLE001 - report, never raise
        return CheckResult(
            False,
            tr(
                "tiled_attention: raised {error} at L = {L}: {exc}",
                "check tiled_attention",
                error=type(exc).__name__,
                L=_PROBE_L,
                exc=exc,
            ),
        )
    if too_much:
        diagnosis = next(m.diagnosis for m in TILED_ATTENTION_MISTAKES if m.name == "materialises the score matrix")
        return CheckResult(
            False,
            f"tiled_attention: likely mistake — {diagnosis}",
            tr(
                "L = {L}, block_size = {block}: peak {peak:,.0f} KiB, one score matrix {scores:,.0f} KiB",
                "check tiled_attention",
                L=_PROBE_L,
                block=_PROBE_BLOCK,
                peak=peak / 2**10,
                scores=scores / 2**10,
            ),
        )
    return CheckResult(
        True,
        tr(
            "{verdict}; at L = {L} it never held the {L} × {L} scores",
            "check tiled_attention",
            verdict=verdict(result.message, VERDICTS),
            L=_PROBE_L,
        ),
    )
