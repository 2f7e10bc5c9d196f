"""Notebook 13's checkers: correct approaches pass, each listed mistake is named, nothing raises.

The learner functions here are written independently of the checkers' own wrong variants.
"""

from __future__ import annotations

import pytest
import torch

import mha_course as mc
from mha_course.check import backward as checks


def assert_passes(result):
    assert result.passed and result.status == "passed", repr(result)


def assert_diagnosed(result, mistakes, name):
    assert not result.passed and result.status == "failed", repr(result)
    diagnosis = next(m.diagnosis for m in mistakes if m.name == name)
    assert diagnosis in result.message, f"expected {name!r}, got {result.message!r}"


# ---------------------------------------------------------------------------------------------
# softmax_backward


def softmax_jacobian(p, dp):  # build each row's Jacobian diag(p) - p pᵀ and multiply
    jac = torch.diag_embed(p) - p[..., :, None] * p[..., None, :]  # (..., Lq, Lk, Lk)
    return (jac @ dp[..., :, None])[..., 0]


def softmax_autograd(p, dp):  # let autograd do it: softmax of log p gives p back
    with torch.enable_grad():
        s = p.clamp_min(1e-30).log().requires_grad_()
        torch.softmax(s, dim=-1).backward(dp)
    return torch.where(p > 0, s.grad, 0.0)


def softmax_functional_jacobian(p, dp):  # autograd builds each row's Jacobian, then the product
    rows = [torch.autograd.functional.jacobian(lambda s: torch.softmax(s, -1), r.log()).T @ g for r, g in
            zip(p.reshape(-1, p.shape[-1]), dp.reshape(-1, p.shape[-1]), strict=True)]  # fmt: skip
    return torch.where(p > 0, torch.stack(rows).reshape(p.shape), 0.0)


def softmax_einsum(p, dp):
    return p * dp - p * torch.einsum("...k,...k->...", p, dp)[..., None]


def softmax_row_loop(p, dp):  # one row at a time, a dot product per row: no Jacobian
    flat_p, flat_dp = p.reshape(-1, p.shape[-1]), dp.reshape(-1, p.shape[-1])
    rows = [r * (g - torch.dot(r, g)) for r, g in zip(flat_p, flat_dp, strict=True)]
    return torch.stack(rows).reshape(p.shape)


@pytest.mark.parametrize("fn", [softmax_autograd, softmax_einsum, softmax_row_loop])
def test_softmax_backward_accepts(fn):
    assert_passes(mc.check.softmax_backward(fn))


@pytest.mark.parametrize("fn", [softmax_jacobian, softmax_functional_jacobian])
def test_softmax_backward_tells_a_jacobian_solution_so(fn):
    result = mc.check.softmax_backward(fn)
    assert_diagnosed(result, checks.SOFTMAX_BACKWARD_MISTAKES, "builds the Jacobian")
    assert "4,096" in result.details  # one 64 × 64 row Jacobian: the size that gave it away


SOFTMAX_WRONG = {
    "missing rowsum term": lambda p, dp: dp * p,
    "rowsum without the weights": lambda p, dp: p * dp - p * dp.sum(-1)[..., None],
    "not multiplied by the weights": lambda p, dp: dp - torch.einsum("...k,...k->...", p, dp)[..., None],
    "rowsum over the wrong axis": lambda p, dp: p * (dp - (dp * p).sum(-2)[..., None, :]),
    "Jacobian diagonal only": lambda p, dp: (p - p**2) * dp,
}


@pytest.mark.parametrize("name", SOFTMAX_WRONG)
def test_softmax_backward_mistakes(name):
    result = mc.check.softmax_backward(SOFTMAX_WRONG[name])
    assert_diagnosed(result, checks.SOFTMAX_BACKWARD_MISTAKES, name)


# ---------------------------------------------------------------------------------------------
# backward_tile


def tile_straight(q_i, k_j, v_j, do_i, lse_i, delta_i, *, scale, mask=None, flaws=()):
    """A learner's tile, with optional flaws (each a mistake the checker should name)."""
    s = torch.einsum("...qd,...kd->...qk", q_i, k_j) * (1.0 if "scores" in flaws else scale)
    if mask is not None:
        s = torch.where(mask, s, float("-inf"))
    if "tile softmax" in flaws:
        p = torch.nan_to_num(torch.softmax(s, -1))
    elif "exp" in flaws:
        p = s.exp()
    elif "nan" in flaws:
        p = (s - lse_i).exp()
    else:
        p = torch.where(torch.isfinite(lse_i), (s - lse_i).exp(), 0.0)
    dv = p @ do_i if "dv" in flaws else torch.einsum("...qk,...qd->...kd", p, do_i)
    dp = torch.einsum("...qd,...kd->...qk", do_i, v_j)
    if "tile D" in flaws:
        delta_i = torch.einsum("...qk,...qk->...q", p, dp)[..., None]
    ds = p * dp if "delta" in flaws else p * (dp - delta_i)
    c = 1.0 if "scale" in flaws else scale
    dq = torch.einsum("...qk,...kd->...qd", ds, k_j) * c
    dk = (ds @ q_i if "dk" in flaws else torch.einsum("...qk,...qd->...kd", ds, q_i)) * c
    return dq, dk, dv


def tile_autograd(q_i, k_j, v_j, do_i, lse_i, delta_i, *, scale, mask=None):
    """Autograd on the tile's own piece of the loss: Σ dO ⊙ (P V) with P from lse, plus the D term."""
    with torch.enable_grad():
        q, k, v = (t.clone().requires_grad_() for t in (q_i, k_j, v_j))
        s = q @ k.transpose(-2, -1) * scale
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        p = torch.exp(s - torch.where(torch.isinf(lse_i), torch.inf, lse_i))
        # ∂loss/∂s through the full softmax = P ⊙ (dP − D): the D term enters as −D · Σ_k p_k
        loss = (do_i * (p @ v)).sum() - (delta_i * p.sum(-1, keepdim=True)).sum()
        loss.backward()
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize("fn", [tile_straight, tile_autograd])
def test_backward_tile_accepts(fn):
    assert_passes(mc.check.backward_tile(fn))


TILE_WRONG = {
    "missing rowsum term": "delta",
    "dv transpose": "dv",
    "dk transpose": "dk",
    "tile softmax instead of lse": "tile softmax",
    "exp without lse": "exp",
    "no scale": ("scale",),
    "scores not scaled": ("scores",),
    "scale left off everywhere": ("scores", "scale"),
    "D from the tile": ("tile D",),
    "NaN for a row with no allowed key": "nan",
}


@pytest.mark.parametrize("name", TILE_WRONG)
def test_backward_tile_mistakes(name):
    def learner(*args, **kwargs):
        flaws = TILE_WRONG[name]
        return tile_straight(*args, **kwargs, flaws=flaws if isinstance(flaws, tuple) else (flaws,))

    assert_diagnosed(mc.check.backward_tile(learner), checks.BACKWARD_TILE_MISTAKES, name)


# ---------------------------------------------------------------------------------------------
# repeat_kv_backward


def repeat_view(grad, n_rep):
    B, h, L, d = grad.shape
    return grad.view(B, h // n_rep, n_rep, L, d).sum(2)


def repeat_loop(grad, n_rep):
    return torch.stack([grad[:, g * n_rep : (g + 1) * n_rep].sum(1) for g in range(grad.shape[1] // n_rep)], dim=1)


def repeat_autograd(grad, n_rep):
    with torch.enable_grad():
        x = torch.zeros(grad.shape[0], grad.shape[1] // n_rep, *grad.shape[2:], requires_grad=True)
        torch.repeat_interleave(x, n_rep, dim=1).backward(grad)
    return x.grad


@pytest.mark.parametrize("fn", [repeat_view, repeat_loop, repeat_autograd])
def test_repeat_kv_backward_accepts(fn):
    assert_passes(mc.check.repeat_kv_backward(fn))


REPEAT_WRONG = {
    "wrong grouping": lambda grad, n: sum(
        grad[:, r * (grad.shape[1] // n) : (r + 1) * (grad.shape[1] // n)] for r in range(n)
    ),
    "mean instead of sum": lambda grad, n: grad.unflatten(1, (-1, n)).mean(2),
    "one head per group": lambda grad, n: grad.unflatten(1, (-1, n))[:, :, 0],
    "summed over the batch": lambda grad, n: grad.unflatten(1, (-1, n)).sum((0, 2)).expand(grad.shape[0], -1, -1, -1),
}


@pytest.mark.parametrize("name", REPEAT_WRONG)
def test_repeat_kv_backward_mistakes(name):
    result = mc.check.repeat_kv_backward(REPEAT_WRONG[name])
    assert_diagnosed(result, checks.REPEAT_KV_BACKWARD_MISTAKES, name)


@pytest.mark.parametrize("name", ["softmax_backward", "backward_tile", "repeat_kv_backward"])
def test_not_attempted_and_never_raises(name):
    def todo(*args, **kwargs):
        raise NotImplementedError

    assert mc.check.CHECKERS[name](todo).status == "not attempted"
    assert not mc.check.CHECKERS[name](lambda *a, **kw: None).passed  # wrong type: a message, no exception
    assert "raised" in mc.check.CHECKERS[name](lambda *a, **kw: 1 / 0).message
