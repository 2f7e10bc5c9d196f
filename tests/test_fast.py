"""mha_course.fast.FastMultiHeadAttention: the same function as the readable MultiHeadAttention
(and so as torch.nn.MultiheadAttention) on random weights, shapes, masks and dtypes, with and
without autograd; its optimisations checked where they show (one L×L buffer, one fused matmul)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mha_course as mc
from mha_course.fast import FastMultiHeadAttention
from mha_course.kit.memory import peak_memory

SETTINGS = settings(max_examples=30, deadline=None, database=None)
TOL = {torch.float32: {"atol": 3e-5, "rtol": 1e-4}, torch.float64: {"atol": 1e-10, "rtol": 1e-9}}


@torch.no_grad()
def random_mha(d, h, bias, dtype, gen):
    mha = mc.MultiHeadAttention(d, h, bias=bias).to(dtype)
    for p in mha.parameters():  # every parameter random, biases included
        p.copy_(torch.randn(p.shape, generator=gen, dtype=dtype) * 0.4)
    return mha.eval()


@st.composite
def case(draw):
    h, d_head = draw(st.integers(1, 4)), draw(st.sampled_from([1, 3, 5, 8]))  # √d_head not a power of 2
    Lq = draw(st.integers(1, 6))
    mode = draw(st.sampled_from(["self", "cross", "cross_same_kv"]))
    return {
        "d": h * d_head,
        "h": h,
        "B": draw(st.integers(1, 3)),
        "Lq": Lq,
        "Lk": Lq if mode == "self" else draw(st.integers(1, 6)),
        "mode": mode,
        "bias": draw(st.booleans()),
        "dtype": draw(st.sampled_from([torch.float32, torch.float64])),
        "mask": draw(st.sampled_from(["none", "2d", "4d", "padding"])),
        "grad": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def make_inputs(c, gen):
    dt = c["dtype"]
    x = torch.randn(c["B"], c["Lq"], c["d"], generator=gen, dtype=dt)
    if c["mode"] == "self":
        return x, None, None
    key = torch.randn(c["B"], c["Lk"], c["d"], generator=gen, dtype=dt)
    value = key if c["mode"] == "cross_same_kv" else torch.randn(c["B"], c["Lk"], c["d"], generator=gen, dtype=dt)
    return x, key, value


def make_mask(c, gen):
    B, h, Lq, Lk = c["B"], c["h"], c["Lq"], c["Lk"]
    if c["mask"] == "none":
        return None
    if c["mask"] == "2d":
        return torch.rand(Lq, Lk, generator=gen) < 0.6  # some rows may allow no key
    if c["mask"] == "4d":
        return torch.rand(B, h, Lq, Lk, generator=gen) < 0.6
    lengths = torch.randint(0, Lk + 1, (B,), generator=gen)  # a length of 0 masks a whole sequence
    return (torch.arange(Lk)[None, :] < lengths[:, None])[:, None, None, :]


@SETTINGS
@given(case())
def test_fast_computes_the_readable_modules_function(c):
    gen = torch.Generator().manual_seed(c["seed"])
    mha = random_mha(c["d"], c["h"], c["bias"], c["dtype"], gen)
    fast = FastMultiHeadAttention.from_module(mha)
    query, key, value = make_inputs(c, gen)
    mask = make_mask(c, gen)
    with torch.set_grad_enabled(c["grad"]):
        for need_weights in (True, False):
            expected, expected_w = mha(query, key, value, mask=mask, need_weights=need_weights)
            got, got_w = fast(query, key, value, mask=mask, need_weights=need_weights)
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got, expected, **TOL[c["dtype"]])
            if need_weights:
                torch.testing.assert_close(got_w, expected_w, **TOL[c["dtype"]])
            else:
                assert got_w is None


def test_fast_matches_torch_with_a_causal_mask_and_gradients_flow():
    gen = torch.Generator().manual_seed(0)
    mha = random_mha(24, 4, True, torch.float64, gen)
    fast, theirs = FastMultiHeadAttention.from_module(mha), mha.to_torch().eval()
    x = torch.randn(2, 7, 24, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = mc.causal_mask(7)
    out, w = fast(x, mask=mask)
    ref, ref_w = theirs(x, x, x, attn_mask=~mask, average_attn_weights=False)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(w, ref_w)
    (grad_fast,) = torch.autograd.grad(out.square().sum(), x)
    (grad_ref,) = torch.autograd.grad(mha(x, mask=mask)[0].square().sum(), x)
    torch.testing.assert_close(grad_fast, grad_ref)


def test_the_scale_is_folded_into_the_stored_query_rows_and_to_module_undoes_it():
    gen = torch.Generator().manual_seed(1)
    mha = random_mha(12, 3, True, torch.float64, gen)  # d_head = 4: scale 1/2
    fast = FastMultiHeadAttention.from_module(mha)
    w_q, w_k, w_v = fast.qkv_proj.weight.chunk(3)
    torch.testing.assert_close(w_q, mha.q_proj.weight / 2)
    torch.testing.assert_close(w_k, mha.k_proj.weight)
    torch.testing.assert_close(w_v, mha.v_proj.weight)
    back = fast.to_module()
    for name, tensor in mha.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], tensor)


def test_a_fresh_module_is_the_readable_one_under_the_same_seed():
    torch.manual_seed(5)
    mha = mc.MultiHeadAttention(16, 2)
    torch.manual_seed(5)
    fast = FastMultiHeadAttention(16, 2)
    x = torch.randn(1, 4, 16)
    torch.testing.assert_close(fast(x)[0], mha(x)[0])


@torch.no_grad()
def test_the_weights_path_holds_one_score_buffer_the_readable_path_more():
    B, h, L, d = 2, 2, 128, 32
    mha = mc.MultiHeadAttention(d, h).eval()
    fast = FastMultiHeadAttention.from_module(mha).eval()
    x, mask = torch.randn(B, L, d), mc.causal_mask(L)
    scores = B * h * L * L * 4
    readable = peak_memory(lambda: mha(x, mask=mask))
    tuned = peak_memory(lambda: fast(x, mask=mask))
    assert scores <= tuned < 2 * scores  # the returned weights are the one (B, h, L, L) buffer
    assert tuned < scores + L * L * 4 + 3 * B * L * d * 4 * 2  # beside it: the (L, L) mask as 0/−∞ and q, k, v
    assert readable - tuned >= scores  # the readable formula holds scores and weights side by side


@torch.no_grad()
def test_a_mask_as_large_as_the_scores_is_filled_in_place_not_copied_to_floats():
    B, h, L, d = 2, 2, 128, 32
    fast = FastMultiHeadAttention(d, h).eval()
    x, scores = torch.randn(B, L, d), B * h * L * L * 4
    full = torch.rand(B, h, L, L, generator=torch.Generator().manual_seed(0)) < 0.7  # (B, h, L, L): no broadcast
    shared = peak_memory(lambda: fast(x, mask=mc.causal_mask(L)))  # an (L, L) mask, added as 0/−∞ floats
    # a full mask may cost its bool complement (¼ of the scores), never a float copy (1 × the scores)
    assert scores < peak_memory(lambda: fast(x, mask=full)) <= shared + full.numel()
    torch.testing.assert_close(fast(x, mask=full), fast.to_module()(x, mask=full))


def test_self_attention_runs_one_projection_matmul():
    from mha_course.lessons.head_layout import kernels_called

    fast = FastMultiHeadAttention(16, 2).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        ran = kernels_called(lambda: fast(x), keep=("addmm", "mm", "linear"))
    assert len(ran) == 2  # the fused QKV projection and the output projection


def test_errors_are_those_of_multi_head_attention():
    fast, mha = FastMultiHeadAttention(8, 2), mc.MultiHeadAttention(8, 2)
    bad_calls = [
        lambda m: m(torch.randn(2, 3, 7)),
        lambda m: m(torch.randn(3, 8)),
        lambda m: m(torch.randn(2, 3, 8), mask=torch.ones(3, 3)),
        lambda m: m(torch.randn(2, 3, 8), mask=torch.ones(2, 3, 3, dtype=torch.bool)),
        lambda m: m(torch.randn(2, 3, 8), torch.randn(1, 3, 8)),
        lambda m: m(torch.randn(2, 3, 8).double()),
    ]
    for call in bad_calls:
        with pytest.raises((ValueError, TypeError)) as ours:
            call(mha)
        with pytest.raises(type(ours.value), match=str(ours.value).split(",")[0][:30].replace("(", r"\(")):
            call(fast)
    with pytest.raises(ValueError, match="divisible"):
        FastMultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="kdim = vdim = d_model"):
        FastMultiHeadAttention.from_module(mc.MultiHeadAttention(8, 2, kdim=5))
    with pytest.raises(TypeError, match="mha_course.MultiHeadAttention"):
        FastMultiHeadAttention.from_module(torch.nn.MultiheadAttention(8, 2))


def test_the_library_modules_of_notebook_09_import_no_plotting():
    import subprocess
    import sys

    code = "import sys, mha_course.tiled, mha_course.fast; assert 'matplotlib' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
