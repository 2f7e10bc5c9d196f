"""Checkers for notebook 13's exercises: the softmax's backward, one tile of FlashAttention-2's
backward, and the backward of repeat_kv (the gradient of a shared K/V head under GQA)."""

from __future__ import annotations

import math

import torch

from ..backward import backward_tile as _tile_reference
from ..backward import repeat_kv_backward as _repeat_kv_backward_reference
from ..backward import softmax_backward as _softmax_reference
from ..i18n import tr
from ..tiled import tiled_attention
from .framework import Case, CheckResult, mistakes, run_check, tensor_generator

__all__ = ["softmax_backward", "backward_tile", "repeat_kv_backward"]

_INF = float("-inf")

# ---------------------------------------------------------------------------------------------
# softmax_backward(weights, grad_weights) -> grad_scores


def _softmax_cases():
    g = tensor_generator()

    def weights(*shape, masked=0.0):
        s = torch.randn(*shape, generator=g) * 1.5
        if masked:
            s = s.masked_fill(torch.rand(*shape, generator=g) < masked, _INF)
            s[..., 0] = torch.where(torch.isinf(s[..., 0]), 0.0, s[..., 0])  # each row keeps a key
        return torch.softmax(s, dim=-1)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    p_dead = weights(2, 4, 6, masked=0.4)
    p_dead[1, 2] = 0.0  # a query with no allowed key: its weights are all 0
    return [
        Case((weights(4, 4), randn(4, 4)), description="4 × 4"),
        Case((weights(3, 7), randn(3, 7)), description="Lq = 3, Lk = 7"),
        Case((weights(2, 3, 5, 4), randn(2, 3, 5, 4)), description="batch dims (2, 3)"),
        Case((p_dead, randn(2, 4, 6)), description="masked keys (weight 0) and a row of zeros"),
    ]


SOFTMAX_BACKWARD_MISTAKES = mistakes(
    "softmax_backward",
    {
        "missing rowsum term": lambda p, dp: p * dp,
        "rowsum without the weights": lambda p, dp: p * (dp - dp.sum(dim=-1, keepdim=True)),
        "not multiplied by the weights": lambda p, dp: dp - (p * dp).sum(dim=-1, keepdim=True),
        "rowsum over the wrong axis": lambda p, dp: p * (dp - (p * dp).sum(dim=-2, keepdim=True)),
        "Jacobian diagonal only": lambda p, dp: p * (1 - p) * dp,
        # right values, wrong method: told apart by the size of what the function builds, not by its output
        "builds the Jacobian": _softmax_reference,
    },
)

_PROBE_LQ, _PROBE_LK = 2, 64  # one row's Jacobian is 64 × 64 = 4,096 numbers, the whole input 128


def _largest_tensor(fn, *args) -> int:
    """The most numbers in any one tensor that ``fn(*args)`` creates (every aten op's outputs,
    autograd's included), under ``torch.no_grad()`` like the learner's checked calls."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class _Largest(TorchDispatchMode):
        most = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            sizes = [t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            self.most = max([self.most, *sizes])
            return out

    with torch.random.fork_rng(devices=[]), torch.no_grad(), _Largest() as mode:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - the cases already ran it; a probe never raises
            return 0
    return mode.most


def _builds_a_jacobian(fn) -> CheckResult | None:
    """A failed result if ``fn`` makes a tensor of an Lk × Lk matrix's size or more (8 × its input)."""
    g = tensor_generator()
    p = torch.softmax(torch.randn(_PROBE_LQ, _PROBE_LK, generator=g), dim=-1)
    most = _largest_tensor(fn, p, torch.randn(_PROBE_LQ, _PROBE_LK, generator=g))
    if most < 8 * p.numel():
        return None
    words = next(m.diagnosis for m in SOFTMAX_BACKWARD_MISTAKES if m.name == "builds the Jacobian")
    details = tr(
        "for weights of {lq} × {lk} your function made a tensor of {most:,} numbers; "
        "the input holds {numel:,}, one row's Jacobian {jacobian:,}",
        "check softmax_backward",
        lq=_PROBE_LQ,
        lk=_PROBE_LK,
        most=most,
        numel=p.numel(),
        jacobian=_PROBE_LK**2,
    )
    return CheckResult(False, f"softmax_backward: likely mistake — {words}", details)


def softmax_backward(fn) -> CheckResult:
    """Check ``fn(weights, grad_weights) -> grad_scores``: weights (..., Lq, Lk) = softmax(scores)
    along the last dim, grad_weights (..., Lq, Lk) = ∂loss/∂weights; returns ∂loss/∂scores,
    the same shape. A row of weights that is all 0 (no allowed key) must give 0. Right values from
    a built Jacobian (a tensor of Lk × Lk numbers per query) fail: the exercise is to avoid it."""
    result = run_check(
        "softmax_backward",
        fn,
        _softmax_cases(),
        reference=_softmax_reference,
        mistakes=SOFTMAX_BACKWARD_MISTAKES,
        arg_names=("weights", "grad_weights"),
        output_label="grad_scores",
    )
    jacobian = _builds_a_jacobian(fn) if result.passed else None  # a CheckResult is falsy when failed
    return result if jacobian is None else jacobian


# ---------------------------------------------------------------------------------------------
# backward_tile(q_i, k_j, v_j, grad_out_i, lse_i, delta_i, *, scale, mask=None) -> (dq_i, dk_j, dv_j)


def _tile_variant(q_i, k_j, v_j, do_i, lse_i, delta_i, *, scale, mask=None, **change):
    """One tile's gradients with one deliberate ``change`` (none: the reference)."""
    s = q_i @ k_j.transpose(-2, -1) * scale
    if mask is not None:
        s = s.masked_fill(~mask, _INF)
    if change.get("unscaled_scores"):
        s = s / scale
    lse = lse_i if change.get("nan_row") else lse_i.masked_fill(lse_i == _INF, math.inf)
    if change.get("p") == "tile softmax":
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    elif change.get("p") == "exp":
        p = torch.exp(s)
    else:
        p = torch.exp(s - lse)
    dv = p @ do_i if change.get("dv_transpose") else p.transpose(-2, -1) @ do_i
    dp = do_i @ v_j.transpose(-2, -1)
    if change.get("tile_delta"):
        delta_i = (p * dp).sum(dim=-1, keepdim=True)  # over this tile's keys only
    ds = p * dp if change.get("no_delta") else p * (dp - delta_i)
    c = 1.0 if change.get("no_scale") else scale
    dq = ds @ k_j * c
    dk = ds @ q_i * c if change.get("dk_transpose") else ds.transpose(-2, -1) @ q_i * c
    return dq, dk, dv


def _tile_case(g, batch, Lq, Lk, d_k, d_v, rows, cols, *, mask=None, scale=None, description=""):
    """A tile (rows × cols) of a full attention problem, with lse and D from the full forward."""

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    q, k, v, do = randn(*batch, Lq, d_k), randn(*batch, Lk, d_k), randn(*batch, Lk, d_v), randn(*batch, Lq, d_v)
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    with torch.no_grad():
        out, lse = tiled_attention(q, k, v, mask, scale=scale, return_lse=True)
    delta = (do * out).sum(dim=-1, keepdim=True)
    tile = None if mask is None else torch.broadcast_to(mask, (*batch, Lq, Lk))[..., rows, cols]
    args = (q[..., rows, :], k[..., cols, :], v[..., cols, :], do[..., rows, :], lse[..., rows, :], delta[..., rows, :])
    kwargs = {"scale": scale} if tile is None else {"scale": scale, "mask": tile}
    return Case(args, kwargs, description=description)


def _tile_cases():
    g = tensor_generator()
    causal = torch.ones(12, 12, dtype=torch.bool).tril()
    dead = torch.rand(2, 8, 10, generator=g) < 0.6
    dead[..., 0] = True
    dead[1, 5] = False  # query 5 of sequence 1 sees no key at all: lse = -inf there
    return [
        _tile_case(g, (), 8, 12, 4, 4, slice(4, 8), slice(4, 8), description="square 4 × 4 tile of 8 × 12"),
        _tile_case(
            g, (2, 3), 10, 9, 4, 6, slice(5, 10), slice(0, 3), description="batch (2, 3), 5 × 3 tile, d_k ≠ d_v"
        ),
        _tile_case(g, (2,), 12, 12, 8, 3, slice(4, 8), slice(0, 8), mask=causal, description="causal mask"),
        _tile_case(
            g, (2,), 8, 10, 4, 2, slice(4, 8), slice(0, 5), mask=dead, description="a query with no allowed key"
        ),
        _tile_case(g, (), 6, 7, 4, 5, slice(0, 6), slice(2, 7), scale=0.3, description="scale = 0.3"),
    ]


BACKWARD_TILE_MISTAKES = mistakes(
    "backward_tile",
    {
        "missing rowsum term": lambda *a, **kw: _tile_variant(*a, **kw, no_delta=True),
        "dv transpose": lambda *a, **kw: _tile_variant(*a, **kw, dv_transpose=True),
        "dk transpose": lambda *a, **kw: _tile_variant(*a, **kw, dk_transpose=True),
        "tile softmax instead of lse": lambda *a, **kw: _tile_variant(*a, **kw, p="tile softmax"),
        "exp without lse": lambda *a, **kw: _tile_variant(*a, **kw, p="exp"),
        "no scale": lambda *a, **kw: _tile_variant(*a, **kw, no_scale=True),
        "scores not scaled": lambda *a, **kw: _tile_variant(*a, **kw, unscaled_scores=True),
        "scale left off everywhere": lambda *a, **kw: _tile_variant(*a, **kw, unscaled_scores=True, no_scale=True),
        "D from the tile": lambda *a, **kw: _tile_variant(*a, **kw, tile_delta=True),
        "NaN for a row with no allowed key": lambda *a, **kw: _tile_variant(*a, **kw, nan_row=True),
    },
)


def backward_tile(fn) -> CheckResult:
    """Check ``fn(q_i, k_j, v_j, grad_out_i, lse_i, delta_i, *, scale, mask=None) -> (dq_i, dk_j, dv_j)``:
    one tile's share of the gradients (query block i against key block j), from the forward's
    log-sum-exp lse_i (..., bq, 1) over ALL keys and D_i = delta_i (..., bq, 1) = rowsum(dO_i ⊙ O_i).
    q_i (..., bq, d_k), k_j (..., bk, d_k), v_j (..., bk, d_v), grad_out_i (..., bq, d_v); mask
    (..., bq, bk) bool, True = may attend. Returns (..., bq, d_k), (..., bk, d_k), (..., bk, d_v).
    """
    return run_check(
        "backward_tile",
        fn,
        _tile_cases(),
        reference=_tile_reference,
        mistakes=BACKWARD_TILE_MISTAKES,
        arg_names=("q_i", "k_j", "v_j", "grad_out_i", "lse_i", "delta_i"),
        output_names=("dq_i", "dk_j", "dv_j"),
    )


# ---------------------------------------------------------------------------------------------
# repeat_kv_backward(grad, n_rep) -> (B, h_kv, L, d)


def _repeat_cases():
    g = tensor_generator()

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    return [
        Case((randn(2, 6, 4, 3), 3), description="6 query heads, 2 K/V heads"),
        Case((randn(1, 8, 5, 2), 2), description="8 query heads, 4 K/V heads"),
        Case((randn(2, 4, 3, 4), 4), description="MQA: 4 query heads, 1 K/V head"),
        Case((randn(2, 3, 3, 2), 1), description="MHA: n_rep = 1"),
    ]


def _grouped_as_repeat(grad, n_rep):
    B, h, L, d = grad.shape
    return grad.reshape(B, n_rep, h // n_rep, L, d).sum(dim=1)


REPEAT_KV_BACKWARD_MISTAKES = mistakes(
    "repeat_kv_backward",
    {
        "wrong grouping": _grouped_as_repeat,
        "mean instead of sum": lambda grad, n_rep: _repeat_kv_backward_reference(grad, n_rep) / n_rep,
        "one head per group": lambda grad, n_rep: grad[:, ::n_rep],
        "summed over the batch": lambda grad, n_rep: (
            _repeat_kv_backward_reference(grad, n_rep).sum(dim=0, keepdim=True).expand(grad.shape[0], -1, -1, -1)
        ),
    },
)


def repeat_kv_backward(fn) -> CheckResult:
    """Check ``fn(grad, n_rep) -> grad_kv``: grad (B, h_kv*n_rep, L, d) is the gradient of the
    output of ``mc.repeat_kv(x, n_rep)`` (query head i read K/V head i // n_rep); grad_kv
    (B, h_kv, L, d) is the gradient of x."""
    return run_check(
        "repeat_kv_backward",
        fn,
        _repeat_cases(),
        reference=_repeat_kv_backward_reference,
        mistakes=REPEAT_KV_BACKWARD_MISTAKES,
        arg_names=("grad", "n_rep"),
        output_label="grad_kv",
    )
