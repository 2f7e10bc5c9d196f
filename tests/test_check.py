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
from mha_course.check.framework import Case, Mistake, run_check


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
    todo = CheckResult(False, "demo: replace the raise", status="not attempted")
    assert bool(ok) and not bool(bad) and not bool(todo)
    assert repr(ok) == "✅ passed · demo: correct on 3 cases"
    assert repr(bad) == "❌ failed · demo: wrong\n   case 1\n   max abs error 1"
    assert repr(todo) == "⏳ not attempted · demo: replace the raise"
    assert bad._repr_html_().count("<pre") == 1 and "max abs error 1" in bad._repr_html_()
    assert "<pre" not in ok._repr_html_() and "✅ passed · demo" in ok._repr_html_()
    with pytest.raises(ValueError):
        CheckResult(True, "x", status="failed")
    with pytest.raises(ValueError):
        CheckResult(False, "x", status="maybe")


def test_every_checker_module_is_imported_by_name():
    import importlib
    import pkgutil

    import mha_course.check as check

    found = []
    for info in pkgutil.iter_modules(check.__path__):
        if info.name != "framework":
            module = importlib.import_module(f"mha_course.check.{info.name}")
            for name in module.__all__:
                assert getattr(check, name) is getattr(module, name), f"mc.check.{name} is not {module.__name__}.{name}"
                assert check.CHECKERS[name] is getattr(module, name), f"{name} is missing from CHECKERS"
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


def test_the_documented_example_checker_works():
    import textwrap

    from mha_course.check import framework

    doc = framework.__doc__
    code = doc[doc.index("    import torch") : doc.index("Rules the runner follows")]
    namespace = {"__name__": "mha_course.check._example", "__package__": "mha_course.check"}
    exec(textwrap.dedent(code), namespace)
    assert_passes(namespace["double"](lambda x: x + x))
    assert_fails(namespace["double"](lambda x: x * x), "likely mistake", "squared")


def test_transpose_hint_for_dot_T_on_batched_tensors():
    def attention(q, k, v, mask=None):
        scores = q @ k.T / math.sqrt(q.shape[-1])
        return scores.softmax(-1) @ v, scores.softmax(-1)

    with pytest.warns(UserWarning):  # torch deprecates .T on tensors that are not 2-D
        result = mc.check.scaled_dot_product_attention(attention)
    assert_fails(result, "raised RuntimeError", "case 2")
    assert (
        "in attention, line" in result.details
        and ": scores = q @ k.T" in result.details
        and "transpose(-2, -1)" in result.details
    )


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


# ---------------------------------------------------------------------------------------------
# multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads)


def mha_view_transpose(x, w_q, w_k, w_v, w_o, num_heads):
    B, L, d = x.shape
    hd = d // num_heads

    def split(t):
        return t.view(B, L, num_heads, hd).transpose(1, 2)

    q, k, v = split(x @ w_q), split(x @ w_k), split(x @ w_v)
    w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), dim=-1)
    return (w @ v).transpose(1, 2).reshape(B, L, d) @ w_o


def mha_loop(x, w_q, w_k, w_v, w_o, num_heads):
    hd = x.shape[-1] // num_heads
    heads = []
    for i in range(num_heads):
        cols = slice(i * hd, (i + 1) * hd)
        q, k, v = x @ w_q[:, cols], x @ w_k[:, cols], x @ w_v[:, cols]
        heads.append(sdpa_neg_1e9(q, k, v)[0])
    return torch.cat(heads, dim=-1) @ w_o


def mha_einsum_sdpa(x, w_q, w_k, w_v, w_o, num_heads):
    B, L, d = x.shape
    hd = d // num_heads
    q, k, v = (torch.einsum("bld,dhe->bhle", x, w.view(d, num_heads, hd)) for w in (w_q, w_k, w_v))
    out = F.scaled_dot_product_attention(q, k, v)  # (B, h, L, hd)
    return torch.einsum("bhle,hed->bld", out, w_o.view(num_heads, hd, d))


@pytest.mark.parametrize("fn", [mha_view_transpose, mha_loop, mha_einsum_sdpa])
def test_mha_correct_variants_pass(fn):
    assert_passes(mc.check.multi_head_attention(fn))


def _mha_with(*, split="ok", merge="ok", scale="head", out_proj=True, transposed=False):
    def fn(x, w_q, w_k, w_v, w_o, num_heads):
        B, L, d = x.shape
        hd = d // num_heads
        if transposed:
            w_q, w_k, w_v, w_o = w_q.t(), w_k.t(), w_v.t(), w_o.t()

        def split_(t):
            if split == "none":
                return t.unsqueeze(1)
            if split == "no transpose":
                return t.view(B, num_heads, L, hd)
            return t.view(B, L, num_heads, hd).permute(0, 2, 1, 3)

        q, k, v = split_(x @ w_q), split_(x @ w_k), split_(x @ w_v)
        s = {"head": hd, "model": d}[scale] ** 0.5
        out = torch.softmax(q @ k.transpose(-1, -2) / s, dim=-1) @ v
        if split == "none":
            out = out.squeeze(1)
        elif merge == "no transpose":
            out = out.reshape(B, L, d)
        elif merge == "reversed":
            out = torch.cat([out[:, i] for i in reversed(range(num_heads))], dim=-1)
        else:
            out = torch.cat([out[:, i] for i in range(num_heads)], dim=-1)
        return out @ w_o if out_proj else out

    return fn


MHA_MISTAKES = {
    "one softmax over all heads": (_mha_with(split="none", scale="model"), "one softmax over all heads"),
    "reshape without transpose": (_mha_with(split="no transpose", merge="no transpose"), "without transpose"),
    "scale by sqrt(d_model)": (_mha_with(scale="model"), "√d_model instead of √d_head"),
    "forgot W_O": (_mha_with(out_proj=False), "output projection"),
    "heads in the wrong order": (_mha_with(merge="reversed"), "wrong order"),
    "x @ w.T": (_mha_with(transposed=True), "transposed weights"),
    "split right, merged without transpose": (_mha_with(merge="no transpose"), "without transposing back"),
    "interleaved head columns": (
        lambda x, wq, wk, wv, wo, h: mha_view_transpose(
            x,
            *(w.view(-1, w.shape[1] // h, h).transpose(1, 2).reshape(w.shape) for w in (wq, wk, wv)),
            wo.view(wo.shape[0] // h, h, -1).transpose(0, 1).reshape(wo.shape),
            h,
        ),
        "every num_heads-th column",
    ),
}


@pytest.mark.parametrize("mistake", list(MHA_MISTAKES))
def test_mha_mistakes_are_diagnosed(mistake):
    fn, words = MHA_MISTAKES[mistake]
    assert_fails(mc.check.multi_head_attention(fn), "likely mistake", words)


# ---------------------------------------------------------------------------------------------
# split_heads / merge_heads


def split_view(x, num_heads):
    B, L, D = x.shape
    return x.view(B, L, num_heads, D // num_heads).transpose(1, 2)


def split_stack(x, num_heads):
    return torch.stack(x.chunk(num_heads, dim=-1), dim=1)


def split_unflatten(x, num_heads):
    return x.unflatten(-1, (num_heads, -1)).permute(0, 2, 1, 3).contiguous()


@pytest.mark.parametrize("fn", [split_view, split_stack, split_unflatten])
def test_split_heads_correct_variants_pass(fn):
    assert_passes(mc.check.split_heads(fn))


SPLIT_MISTAKES = {
    "reshape without transpose": (lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1), "without transpose"),
    "interleaved": (lambda x, h: x.view(*x.shape[:2], -1, h).permute(0, 3, 1, 2), "interleaved"),
    "forgot the transpose": (lambda x, h: x.view(*x.shape[:2], h, -1), "returned (B, L, num_heads, d_head)"),
}


@pytest.mark.parametrize("mistake", list(SPLIT_MISTAKES))
def test_split_heads_mistakes_are_diagnosed(mistake):
    fn, words = SPLIT_MISTAKES[mistake]
    assert_fails(mc.check.split_heads(fn), "likely mistake", words)


def merge_view(x):
    B, h, L, d = x.shape
    return x.transpose(1, 2).contiguous().view(B, L, h * d)


def merge_cat(x):
    return torch.cat(x.unbind(dim=1), dim=-1)


def merge_einops_style(x):
    return x.permute(0, 2, 1, 3).flatten(2)


@pytest.mark.parametrize("fn", [merge_view, merge_cat, merge_einops_style])
def test_merge_heads_correct_variants_pass(fn):
    assert_passes(mc.check.merge_heads(fn))


MERGE_MISTAKES = {
    "reshape without transpose": (lambda x: x.reshape(x.shape[0], x.shape[2], -1), "without transpose"),
    "transposed the wrong dims": (lambda x: x.transpose(-1, -2).reshape(x.shape[0], x.shape[2], -1), "wrong dims"),
    "forgot to flatten": (lambda x: x.transpose(1, 2), "reshape to (B, L, num_heads·d_head)"),
    "heads interleaved": (lambda x: torch.stack(x.unbind(1), dim=-1).flatten(2), "interleaved"),
}


@pytest.mark.parametrize("mistake", list(MERGE_MISTAKES))
def test_merge_heads_mistakes_are_diagnosed(mistake):
    fn, words = MERGE_MISTAKES[mistake]
    assert_fails(mc.check.merge_heads(fn), "likely mistake", words)


# ---------------------------------------------------------------------------------------------
# causal_mask / padding_mask


def causal_tril(q_len, k_len=None):
    k_len = q_len if k_len is None else k_len
    return torch.ones(q_len, k_len, dtype=torch.bool).tril(diagonal=k_len - q_len)


def causal_arange(q_len, k_len=None):
    k_len = k_len or q_len
    i = torch.arange(q_len)[:, None] + (k_len - q_len)
    return torch.arange(k_len)[None, :] <= i


def causal_loop(q_len, k_len=None):
    k_len = k_len or q_len
    return torch.tensor([[j <= i + k_len - q_len for j in range(k_len)] for i in range(q_len)])


@pytest.mark.parametrize("fn", [causal_tril, causal_arange, causal_loop])
def test_causal_mask_correct_variants_pass(fn):
    assert_passes(mc.check.causal_mask(fn))


CAUSAL_MISTAKES = {
    "polarity inverted": (lambda q, k=None: ~causal_tril(q, k), "polarity inverted"),
    "triu(1)": (lambda q, k=None: torch.ones(q, k or q, dtype=torch.bool).triu(1), "polarity inverted"),
    "diagonal excluded": (lambda q, k=None: torch.ones(q, k or q, dtype=torch.bool).tril(-1), "diagonal is excluded"),
    "top-left alignment": (lambda q, k=None: torch.ones(q, k or q, dtype=torch.bool).tril(), "top-left"),
    "sees the future": (lambda q, k=None: causal_tril(q, k).T if k is None or k == q else ~causal_tril(q, k), "future"),
}


@pytest.mark.parametrize("mistake", list(CAUSAL_MISTAKES))
def test_causal_mask_mistakes_are_diagnosed(mistake):
    fn, words = CAUSAL_MISTAKES[mistake]
    assert_fails(mc.check.causal_mask(fn), "likely mistake", words)


def test_causal_mask_must_be_bool():
    result = mc.check.causal_mask(lambda q, k=None: causal_tril(q, k).float())
    assert_fails(result, "bool", "values are right")
    assert_fails(mc.check.causal_mask(lambda q, k=None: causal_tril(q, k).int()), "bool")


def padding_arange(lengths, max_len):
    return (torch.arange(max_len) < lengths.unsqueeze(-1)).view(len(lengths), 1, 1, max_len)


def padding_loop(lengths, max_len):
    rows = [[[[j < int(n) for j in range(max_len)]]] for n in lengths]
    return torch.tensor(rows, dtype=torch.bool)


@pytest.mark.parametrize("fn", [padding_arange, padding_loop, mc.padding_mask])
def test_padding_mask_correct_variants_pass(fn):
    assert_passes(mc.check.padding_mask(fn))


PADDING_MISTAKES = {
    "polarity inverted": (lambda n, m: (torch.arange(m) >= n[:, None])[:, None, None], "polarity inverted"),
    "(B, max_len)": (lambda n, m: torch.arange(m) < n[:, None], "returned (B, max_len)"),
    "off by one": (lambda n, m: (torch.arange(m) <= n[:, None])[:, None, None], "off by one"),
    "masks queries": (lambda n, m: (torch.arange(m) < n[:, None])[:, None, :, None], "query positions"),
}


@pytest.mark.parametrize("mistake", list(PADDING_MISTAKES))
def test_padding_mask_mistakes_are_diagnosed(mistake):
    fn, words = PADDING_MISTAKES[mistake]
    assert_fails(mc.check.padding_mask(fn), "likely mistake", words)


# ---------------------------------------------------------------------------------------------
# repeat_kv


def repeat_kv_interleave(x, n_rep):
    return torch.repeat_interleave(x, n_rep, dim=1)


def repeat_kv_expand(x, n_rep):
    B, h, L, d = x.shape
    return x[:, :, None].expand(B, h, n_rep, L, d).reshape(B, h * n_rep, L, d)


def repeat_kv_index(x, n_rep):
    return x[:, torch.arange(x.shape[1] * n_rep) // n_rep]


@pytest.mark.parametrize("fn", [repeat_kv_interleave, repeat_kv_expand, repeat_kv_index])
def test_repeat_kv_correct_variants_pass(fn):
    assert_passes(mc.check.repeat_kv(fn))


REPEAT_MISTAKES = {
    "repeat instead of repeat_interleave": (lambda x, n: x.repeat(1, n, 1, 1), "i % h_kv"),
    "index i % h_kv": (lambda x, n: x[:, torch.arange(x.shape[1] * n) % x.shape[1]], "repeat_interleave"),
    "wrong dim (length)": (lambda x, n: x.repeat_interleave(n, dim=2), "dim 2"),
    "wrong dim (batch)": (lambda x, n: x.repeat(n, 1, 1, 1), "dim 0"),
}


@pytest.mark.parametrize("mistake", list(REPEAT_MISTAKES))
def test_repeat_kv_mistakes_are_diagnosed(mistake):
    fn, words = REPEAT_MISTAKES[mistake]
    assert_fails(mc.check.repeat_kv(fn), "likely mistake", words)


# ---------------------------------------------------------------------------------------------
# count_attention_params / kv_cache_bytes


def params_formula(d_model, num_heads, num_kv_heads=None, bias=True):
    kv_width = (num_kv_heads or num_heads) * (d_model // num_heads)
    weights = 2 * d_model * d_model + 2 * d_model * kv_width
    return weights + (2 * d_model + 2 * kv_width if bias else 0)


def params_modules(d_model, num_heads, num_kv_heads=None, bias=True):
    h_kv = num_heads if num_kv_heads is None else num_kv_heads
    with torch.device("meta"):  # real sizes, no memory
        layer = mc.GroupedQueryAttention(d_model, num_heads, h_kv, bias=bias)
    return sum(p.numel() for p in layer.parameters())


@pytest.mark.parametrize("fn", [params_formula, params_modules])
def test_count_attention_params_correct_variants_pass(fn):
    assert_passes(mc.check.count_attention_params(fn))


def _params_wrong(how):
    def fn(d_model, num_heads, num_kv_heads=None, bias=True):
        kv = (num_kv_heads or num_heads) * (d_model // num_heads)
        if how == "no gqa":
            kv = d_model
        if how == "no bias":
            bias = False
        projections = [(d_model, d_model), (d_model, kv), (d_model, kv)]
        if how != "no W_O":
            projections.append((d_model, d_model))
        total = sum(i * o + (o if bias else 0) for i, o in projections)
        return num_heads * total if how == "h heads" else total

    return fn


PARAMS_MISTAKES = {
    "biases not counted": (_params_wrong("no bias"), "biases not counted"),
    "GQA ignored": (_params_wrong("no gqa"), "counted with the query heads"),
    "forgot W_O": (_params_wrong("no W_O"), "W_O"),
    "h full-width heads": (_params_wrong("h heads"), "num_heads separate full-width"),
    "K/V biases at full width": (
        lambda d, h, kv=None, bias=True: params_formula(d, h, kv, False) + (4 * d if bias else 0),
        "biases counted at full width",
    ),
    "biases counted although bias=False": (lambda d, h, kv=None, bias=True: params_formula(d, h, kv), "bias=False"),
}


@pytest.mark.parametrize("mistake", list(PARAMS_MISTAKES))
def test_count_attention_params_mistakes_are_diagnosed(mistake):
    fn, words = PARAMS_MISTAKES[mistake]
    result = mc.check.count_attention_params(fn)
    assert_fails(result, "likely mistake", words)
    assert "expected" in result.details and "d_model=" in result.details  # inputs and numbers shown


def kv_formula(num_layers, num_kv_heads, head_dim, seq_len, batch=1, bytes_per_element=2):
    return 2 * num_layers * num_kv_heads * head_dim * seq_len * batch * bytes_per_element


def kv_tensors(num_layers, num_kv_heads, head_dim, seq_len, batch=1, bytes_per_element=2):
    dtype = {1: torch.int8, 2: torch.bfloat16, 4: torch.float32}[bytes_per_element]
    k = torch.empty(batch, num_kv_heads, seq_len, head_dim, dtype=dtype, device="meta")
    return num_layers * 2 * k.numel() * k.element_size()


@pytest.mark.parametrize("fn", [kv_formula, kv_tensors])
def test_kv_cache_bytes_correct_variants_pass(fn):
    assert_passes(mc.check.kv_cache_bytes(fn))


KV_MISTAKES = {
    "K and V not both cached": (
        lambda n, h, d, L, batch=1, bytes_per_element=2: n * h * d * L * batch * bytes_per_element,
        "K and V",
    ),
    "bytes_per_element ignored": (
        lambda n, h, d, L, batch=1, bytes_per_element=2: 2 * n * h * d * L * batch * 2,
        "bytes_per_element ignored",
    ),
    "elements, not bytes": (lambda n, h, d, L, batch=1, bytes_per_element=2: 2 * n * h * d * L * batch, "elements"),
    "layers ignored": (lambda n, h, d, L, batch=1, bytes_per_element=2: 2 * h * d * L * batch * 2, "layers ignored"),
    "batch ignored": (
        lambda n, h, d, L, batch=1, bytes_per_element=2: 2 * n * h * d * L * bytes_per_element,
        "batch ignored",
    ),
    "query heads": (
        lambda n, h, d, L, batch=1, bytes_per_element=2: 2 * n * {8: 32}.get(h, h) * d * L * batch * bytes_per_element,
        "query heads",
    ),
    "GiB": (lambda *args, **kwargs: kv_formula(*args, **kwargs) / 2**30, "GiB"),
    "GB": (lambda *args, **kwargs: kv_formula(*args, **kwargs) / 1e9, "GB"),
}


@pytest.mark.parametrize("mistake", list(KV_MISTAKES))
def test_kv_cache_bytes_mistakes_are_diagnosed(mistake):
    fn, words = KV_MISTAKES[mistake]
    result = mc.check.kv_cache_bytes(fn)
    assert_fails(result, "likely mistake", words)
    assert "num_layers=" in result.details and "expected" in result.details


# ---------------------------------------------------------------------------------------------
# every checker: not attempted, errors and wrong types reported, deterministic, RNG untouched

CHECKERS = {
    "scaled_dot_product_attention": sdpa_einsum_inf,
    "multi_head_attention": mha_view_transpose,
    "split_heads": split_view,
    "merge_heads": merge_view,
    "causal_mask": causal_tril,
    "padding_mask": padding_arange,
    "repeat_kv": repeat_kv_interleave,
    "count_attention_params": params_formula,
    "kv_cache_bytes": kv_formula,
}


@pytest.mark.parametrize("name", list(CHECKERS))
def test_every_checker_reports_instead_of_raising(name):
    check = getattr(mc.check, name)
    todo = check(not_implemented)
    assert todo.status == "not attempted" and not todo.passed
    assert repr(todo) == f"⏳ not attempted · {name}: replace the raise NotImplementedError with your code"
    assert_fails(check(raises_value_error), "raised ValueError")
    for wrong in (lambda *a, **k: None, lambda *a, **k: [1, 2, 3], lambda *a, **k: "text"):
        assert_fails(check(wrong))
    assert_fails(check(lambda *a, **k: torch.zeros(1, 2, 3, 4, 5)))  # wrong shape (or not an int)
    assert_fails(check(lambda: 0), "raised TypeError")  # wrong signature
    assert_fails(check(None), "expected your function")


@pytest.mark.parametrize("name", list(CHECKERS))
def test_every_checker_is_deterministic_and_leaves_the_rng_alone(name):
    check = getattr(mc.check, name)
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    good = check(CHECKERS[name])
    assert_passes(good)
    bad = check(lambda *a, **k: torch.ones(3))
    assert torch.equal(before, torch.random.get_rng_state())
    assert repr(good) == repr(check(CHECKERS[name])) and repr(bad) == repr(check(lambda *a, **k: torch.ones(3)))
    assert bad._repr_html_() == check(lambda *a, **k: torch.ones(3))._repr_html_()
