"""Tests of the exercise checkers: correct learner code passes in every style, each known mistake
fails with its diagnosis, and nothing the learner does makes a checker raise.

The learner functions below are written independently of the checkers' own wrong variants.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import mha_course as mc
from mha_course.check import CheckResult
from mha_course.check._core import Case, Mistake, run_check


def assert_passes(result):
    assert isinstance(result, CheckResult)
    assert result.passed and result.status == "passed", repr(result)
    assert "\n" not in repr(result) and repr(result).startswith("✅")


def assert_fails(result, *words):
    assert isinstance(result, CheckResult)
    assert not result.passed and result.status == "failed", repr(result)
    assert repr(result).startswith("❌")
    for word in words:
        assert word.lower() in result.message.lower(), f"{word!r} not in {result.message!r}"


def not_implemented(*args, **kwargs):
    raise NotImplementedError("Exercise — your code here")


def raises_value_error(*args, **kwargs):
    raise ValueError("something went wrong")


# ---------------------------------------------------------------------------------------------
# the framework


def test_check_result_basics():
    ok = CheckResult(True, "demo: correct on 3 cases")
    bad = CheckResult(False, "demo: wrong", "case 1\nmax abs error 1")
    todo = CheckResult(False, "demo: not attempted yet", status="not attempted")
    assert bool(ok) and not bool(bad) and not bool(todo)
    assert repr(ok) == "✅ demo: correct on 3 cases"
    assert repr(bad) == "❌ demo: wrong\n   case 1\n   max abs error 1"
    assert repr(todo) == "⏳ demo: not attempted yet"
    assert bad._repr_html_().count("<pre") == 1 and "max abs error 1" in bad._repr_html_()
    assert "<pre" not in ok._repr_html_() and "✅ demo" in ok._repr_html_()
    with pytest.raises(ValueError):
        CheckResult(True, "x", status="failed")
    with pytest.raises(ValueError):
        CheckResult(False, "x", status="maybe")


def test_discovery_exposes_every_module_all():
    import importlib
    import pkgutil

    import mha_course.check as check

    found = []
    for info in pkgutil.iter_modules(check.__path__):
        if not info.name.startswith("_"):
            module = importlib.import_module(f"mha_course.check.{info.name}")
            for name in module.__all__:
                assert getattr(check, name) is getattr(module, name)
                found.append(name)
    assert sorted(found) == check.available()
    for name in ("scaled_dot_product_attention", "multi_head_attention"):
        assert name in check.available()


def test_runner_diagnoses_and_reports_structure_problems():
    cases = [Case((torch.arange(4.0),), description="four"), Case((torch.ones(2, 3),), description="matrix")]
    mistakes = [Mistake("plus one", lambda x: x * 2 + 1, "added one")]

    def check(fn):
        return run_check("double", fn, cases, lambda x: x * 2, mistakes, arg_names=("x",))

    assert_passes(check(lambda x: x + x))
    assert_passes(check(lambda x: (x * 2).double()))  # float64 is a float: accepted
    assert_fails(check(lambda x: x * 2 + 1), "likely mistake", "added one")
    assert_fails(check(lambda x: x * 3), "wrong values", "case 1 of 2")
    assert "max abs error 3" in repr(check(lambda x: x * 3))
    assert_fails(check(lambda x: (x * 2).long()), "dtype", "values are right")
    assert_fails(check(lambda x: x * 2 if x.dim() == 1 else x.T), "shape", "case 2 of 2")
    assert_fails(check(lambda x: [1.0]), "torch.Tensor", "list")
    assert_fails(check(lambda x: x * float("nan")), "NaN")
    assert_fails(check(5), "function")

    def half_done(x):
        if x.dim() == 2:
            raise NotImplementedError
        return 2 * x

    assert_fails(check(half_done), "NotImplementedError", "case 2")
    todo = check(not_implemented)
    assert todo.status == "not attempted" and not todo.passed and "not attempted" in repr(todo)


def test_runner_reports_learner_line_and_protects_inputs_and_rng():
    cases = [Case((torch.ones(3),), description="ones")]

    def mutating(x):
        x.mul_(2)  # in-place on the input: the reference must not see it
        return x

    assert_passes(run_check("double", mutating, cases, lambda x: x * 2))

    def broken(x):
        y = x @ torch.ones(4)
        return y

    result = run_check("double", broken, cases, lambda x: x * 2)
    assert_fails(result, "raised RuntimeError")
    assert "y = x @ torch.ones(4)" in result.details

    def random_learner(x):
        torch.randn(100)  # uses the global RNG
        return x * 2

    before = torch.random.get_rng_state()
    assert_passes(run_check("double", random_learner, cases, lambda x: x * 2))
    assert torch.equal(before, torch.random.get_rng_state())


def test_int_outputs():
    cases = [Case((3, 4), description="small")]

    def check(fn):
        return run_check("mul", fn, cases, lambda a, b: a * b, arg_names=("a", "b"))

    assert_passes(check(lambda a, b: a * b))
    assert_fails(check(lambda a, b: float(a * b)), "float", "int")
    assert "value is right" in check(lambda a, b: float(a * b)).message
    assert_fails(check(lambda a, b: torch.tensor(a * b)), "int")
    assert_fails(check(lambda a, b: True), "should be an int")
    assert_fails(check(lambda a, b: a + b), "is 7", "expected 12")


# ---------------------------------------------------------------------------------------------
# scaled_dot_product_attention


def sdpa_neg_1e9(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def sdpa_einsum_inf(q, k, v, mask=None):
    scores = torch.einsum("...qd,...kd->...qk", q, k) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = torch.where(mask, scores, float("-inf"))
    weights = torch.softmax(scores, -1)
    return torch.einsum("...qk,...kd->...qd", weights, v), weights


def sdpa_torch(q, k, v, mask=None):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), float("-inf"))
    return out, scores.softmax(-1)


def sdpa_loop(q, k, v, mask=None):
    """One query row at a time, in float64, returned as a list."""
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    Lq, Lk = q.shape[-2], k.shape[-2]
    if mask is None:
        mask = torch.ones(Lq, Lk, dtype=torch.bool)
    mask = mask.expand(*batch, Lq, Lk).reshape(-1, Lq, Lk)
    qs = q.expand(*batch, *q.shape[-2:]).reshape(-1, Lq, q.shape[-1]).double()
    ks = k.expand(*batch, *k.shape[-2:]).reshape(-1, Lk, k.shape[-1]).double()
    vs = v.expand(*batch, *v.shape[-2:]).reshape(-1, Lk, v.shape[-1]).double()
    outs, weights = torch.zeros(len(qs), Lq, vs.shape[-1], dtype=torch.float64), torch.zeros(len(qs), Lq, Lk)
    for b in range(len(qs)):
        for i in range(Lq):
            allowed = mask[b, i]
            if not allowed.any():
                continue
            s = (ks[b] @ qs[b, i]) / math.sqrt(q.shape[-1])
            w = torch.zeros(Lk, dtype=torch.float64)
            w[allowed] = torch.exp(s[allowed] - s[allowed].max())
            w = w / w.sum()
            outs[b, i], weights[b, i] = w @ vs[b], w
    return [outs.reshape(*batch, Lq, -1), weights.reshape(*batch, Lq, Lk)]


def sdpa_zero_empty_rows(q, k, v, mask=None):
    out, weights = sdpa_einsum_inf(q, k, v, mask)
    if mask is not None:
        empty = ~mask.any(dim=-1, keepdim=True)
        weights = weights.masked_fill(empty, 0.0)
        out = weights @ v
    return out, weights


@pytest.mark.parametrize("fn", [sdpa_neg_1e9, sdpa_einsum_inf, sdpa_torch, sdpa_loop, sdpa_zero_empty_rows])
def test_sdpa_correct_variants_pass(fn):
    assert_passes(mc.check.scaled_dot_product_attention(fn))


def test_sdpa_fully_masked_rows_option():
    assert_passes(mc.check.scaled_dot_product_attention(sdpa_zero_empty_rows, fully_masked_rows=True))
    assert_passes(mc.check.scaled_dot_product_attention(sdpa_loop, fully_masked_rows=True))
    assert_passes(mc.check.scaled_dot_product_attention(mc.scaled_dot_product_attention, fully_masked_rows=True))
    assert_fails(mc.check.scaled_dot_product_attention(sdpa_einsum_inf, fully_masked_rows=True), "NaN", "fully masked")
    assert_fails(mc.check.scaled_dot_product_attention(sdpa_neg_1e9, fully_masked_rows=True), "evenly", "fully masked")


def _sdpa_with(*, scale="sqrt", dim=-1, mask_fn=None, order="ok"):
    def fn(q, k, v, mask=None):
        d = q.shape[-1]
        scores = q @ k.transpose(-2, -1)
        scores = {"sqrt": scores / d**0.5, "none": scores, "d": scores / d}[scale]
        if mask is not None and mask_fn != "after":
            scores = mask_fn(scores, mask)
        weights = torch.softmax(scores, dim=dim)
        if mask is not None and mask_fn == "after":
            weights = weights * mask.float()
        out = weights @ v
        return {"ok": (out, weights), "swapped": (weights, out), "no_v": (weights, weights)}[order]

    return fn


def _fill_inverted(scores, mask):
    return scores.masked_fill(mask, -1e9)


def _fill_ok(scores, mask):
    return scores.masked_fill(~mask, float("-inf"))


SDPA_MISTAKES = {
    "forgot to scale": (_sdpa_with(scale="none", mask_fn=_fill_ok), "forgot to scale"),
    "scaled by d_k": (_sdpa_with(scale="d", mask_fn=_fill_ok), "by d_k instead of √d_k"),
    "softmax over dim -2": (_sdpa_with(dim=-2, mask_fn=_fill_ok), "wrong axis"),
    "polarity inverted": (_sdpa_with(mask_fn=_fill_inverted), "polarity inverted"),
    "mask ignored": (_sdpa_with(mask_fn=lambda s, m: s), "mask is ignored"),
    "mask after softmax": (_sdpa_with(mask_fn="after"), "after the softmax"),
    "outputs swapped": (_sdpa_with(mask_fn=_fill_ok, order="swapped"), "order is (out, weights)"),
    "forgot V": (_sdpa_with(mask_fn=_fill_ok, order="no_v"), "weights @ V"),
}


@pytest.mark.parametrize("mistake", list(SDPA_MISTAKES))
def test_sdpa_mistakes_are_diagnosed(mistake):
    fn, words = SDPA_MISTAKES[mistake]
    assert_fails(mc.check.scaled_dot_product_attention(fn), "likely mistake", words)


def test_sdpa_bad_learner_functions_are_reported():
    check = mc.check.scaled_dot_product_attention
    assert check(not_implemented).status == "not attempted"
    assert_fails(check(raises_value_error), "raised ValueError", "something went wrong")
    assert_fails(check(lambda q, k, v, mask=None: None), "tuple", "None")
    assert_fails(check(lambda q, k, v, mask=None: sdpa_neg_1e9(q, k, v, mask)[0]), "tuple")
    assert_fails(check(lambda q, k, v, mask=None: [q[..., :1], k]), "shape")
    assert_fails(check(lambda q, k, v: sdpa_neg_1e9(q, k, v)), "raised TypeError", "case 3")


def test_sdpa_repr_is_deterministic():
    a = mc.check.scaled_dot_product_attention(_sdpa_with(scale="none", mask_fn=_fill_ok))
    b = mc.check.scaled_dot_product_attention(_sdpa_with(scale="none", mask_fn=_fill_ok))
    assert repr(a) == repr(b) and a._repr_html_() == b._repr_html_()
    assert "0x" not in repr(a)
    assert repr(mc.check.scaled_dot_product_attention(sdpa_torch)) == repr(
        mc.check.scaled_dot_product_attention(sdpa_loop)
    )
