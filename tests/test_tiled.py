"""mha_course.tiled (tiled attention with an online softmax) and its exercise checker, against
independent references: PyTorch's softmax and SDPA, the course's explicit attention, brute force."""

import functools
import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import mha_course as mc  # noqa: E402
from mha_course import tiled
from mha_course.check import tiled as check_tiled  # noqa: E402
from mha_course.kit.memory import peak_memory  # noqa: E402
from mha_course.lessons import efficient_attention  # noqa: E402


def _explicit(q, k, v, mask=None):
    """softmax(q kᵀ/√d) v written out, rows with no allowed key set to 0 (the course's definition)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores.double(), dim=-1).nan_to_num(0.0).to(q.dtype)
    return w @ v


# ---------------------------------------------------------------------------------------------
# online_softmax_update


@pytest.mark.parametrize("sizes", [[5], [2, 3], [1, 1, 1, 1], [4, 7, 1, 2]])
def test_online_update_over_blocks_equals_softmax_then_matmul(sizes):
    g = torch.Generator().manual_seed(len(sizes))
    Lk = sum(sizes)
    s = torch.randn(2, 3, 4, Lk, generator=g) * 3  # (B, h, Lq, Lk) scores
    v = torch.randn(2, 3, Lk, 5, generator=g)
    state = (torch.full((2, 3, 4, 1), float("-inf")), torch.zeros(2, 3, 4, 1), torch.zeros(2, 3, 4, 5))
    start = 0
    for n in sizes:
        state = tiled.online_softmax_update(*state, s[..., start : start + n], v[..., start : start + n, :])
        start += n
    row_max, row_sum, acc = state
    torch.testing.assert_close(row_max, s.amax(-1, keepdim=True))
    torch.testing.assert_close(row_sum, torch.exp(s - row_max).sum(-1, keepdim=True))
    torch.testing.assert_close(acc / row_sum, torch.softmax(s, dim=-1) @ v)


def test_online_update_does_not_overflow_where_naive_exp_does():
    s = torch.tensor([[100.0, 200.0, 300.0]])  # exp(300) overflows float32
    v = torch.eye(3)
    state = (torch.full((1, 1), float("-inf")), torch.zeros(1, 1), torch.zeros(1, 3))
    for j in range(3):
        state = tiled.online_softmax_update(*state, s[:, j : j + 1], v[j : j + 1])
    assert torch.isinf(torch.exp(s)).any()
    torch.testing.assert_close(state[2] / state[1], torch.softmax(s, dim=-1))


def test_online_update_keeps_a_fully_masked_row_at_zero():
    state = (torch.full((2, 1), float("-inf")), torch.zeros(2, 1), torch.zeros(2, 3))
    s = torch.tensor([[float("-inf")] * 4, [0.0, 1.0, float("-inf"), 2.0]])
    row_max, row_sum, acc = tiled.online_softmax_update(*state, s, torch.randn(4, 3))
    assert row_max[0].item() == float("-inf") and row_sum[0].item() == 0.0
    assert torch.equal(acc[0], torch.zeros(3)) and not acc.isnan().any()


# ---------------------------------------------------------------------------------------------
# tiled_attention


@pytest.mark.parametrize(
    "batch, Lq, Lk, d_k, d_v, block",
    [((), 1, 1, 4, 4, 64), ((2,), 7, 7, 8, 8, 3), ((2, 3), 33, 65, 16, 5, 16), ((1, 2), 50, 50, 8, 8, 7)],
)
@pytest.mark.parametrize("mask_kind", ["none", "causal", "window", "padding"])
def test_tiled_equals_reference_and_torch_sdpa(batch, Lq, Lk, d_k, d_v, block, mask_kind):
    g = torch.Generator().manual_seed(Lq * 100 + Lk)
    q = torch.randn(*batch, Lq, d_k, generator=g)
    k = torch.randn(*batch, Lk, d_k, generator=g)
    v = torch.randn(*batch, Lk, d_v, generator=g)
    if mask_kind == "none":
        mask = None
    elif mask_kind == "causal":
        mask = mc.causal_mask(Lq, Lk)
    elif mask_kind == "window":
        mask = mc.sliding_window_mask(Lq, 4, Lk)
    else:  # keys beyond a length are padding; broadcast over heads and queries
        mask = (torch.arange(Lk) < max(1, Lk - 3))[None, :]  # (1, Lk)
    out = tiled.tiled_attention(q, k, v, mask, block_size=block)
    torch.testing.assert_close(out, _explicit(q, k, v, mask), atol=1e-5, rtol=1e-5)
    expected, _ = mc.scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=1e-5, rtol=1e-5)


@settings(max_examples=25, deadline=None)
@given(
    lq=st.integers(1, 20),
    lk=st.integers(1, 20),
    block=st.integers(1, 9),
    heads=st.integers(1, 3),
    density=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_tiled_equals_reference_for_random_masks_including_empty_rows(lq, lk, block, heads, density, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, heads, n, 6, generator=g) for n in (lq, lk, lk))
    mask = torch.rand(2, 1, lq, lk, generator=g) < density  # some rows may have no allowed key
    out = tiled.tiled_attention(q, k, v, mask, block_size=block)
    assert not out.isnan().any()
    torch.testing.assert_close(out, _explicit(q, k, v, mask), atol=1e-5, rtol=1e-5)


def test_tiled_scale_and_broadcast_batch_dims():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(4, 1, 9, 8, generator=g)  # broadcasts over the head dim of k and v
    k, v = torch.randn(1, 3, 12, 8, generator=g), torch.randn(1, 3, 12, 2, generator=g)
    out = tiled.tiled_attention(q, k, v, scale=0.3, block_size=5)
    expected = torch.softmax(q @ k.transpose(-2, -1) * 0.3, dim=-1) @ v
    assert out.shape == (4, 3, 9, 2)
    torch.testing.assert_close(out, expected)


def test_tiled_peak_memory_is_below_the_score_matrix_at_long_length():
    L, block = 1024, 64
    q = k = v = torch.randn(1, 2, L, 16)
    scores_bytes = 2 * L * L * 4
    with torch.no_grad():
        explicit = peak_memory(lambda: mc.scaled_dot_product_attention(q, k, v))
        tiled_peak = peak_memory(lambda: tiled.tiled_attention(q, k, v, block_size=block))
    assert explicit >= scores_bytes
    assert tiled_peak < scores_bytes / 10


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        (dict(q=torch.randn(3, 4), k=torch.randn(5, 3), v=torch.randn(5, 2)), ValueError, "d_k"),
        (dict(q=torch.randn(3, 4), k=torch.randn(5, 4), v=torch.randn(6, 2)), ValueError, "Lk"),
        (dict(q=torch.randn(3, 4), k=torch.randn(5, 4), v=torch.randn(5, 2), mask=torch.ones(3, 5)), TypeError, "bool"),
        (
            dict(q=torch.randn(3, 4), k=torch.randn(5, 4), v=torch.randn(5, 2), mask=torch.ones(4, 5).bool()),
            ValueError,
            "broadcast",
        ),
        (dict(q=torch.randn(3, 4), k=torch.randn(5, 4), v=torch.randn(5, 2), block_size=0), ValueError, "block_size"),
        (dict(q=torch.randn(4), k=torch.randn(5, 4), v=torch.randn(5, 2)), ValueError, "2-D"),
    ],
)
def test_tiled_bad_input_names_the_problem(kwargs, error, text):
    with pytest.raises(error, match=text):
        tiled.tiled_attention(**kwargs)


# ---------------------------------------------------------------------------------------------
# tiles


def _tiles_brute_force(mask, b):
    n_rows, n_cols = -(-mask.shape[0] // b), -(-mask.shape[1] // b)
    computed = sum(
        bool(mask[i * b : (i + 1) * b, j * b : (j + 1) * b].any()) for i in range(n_rows) for j in range(n_cols)
    )
    return computed, n_rows * n_cols - computed, n_rows * n_cols


@pytest.mark.parametrize("L, b", [(512, 64), (100, 16), (7, 3)])
def test_tile_counts_for_causal_and_window_masks(L, b):
    n = -(-L // b)
    assert tiled.tile_counts(mc.causal_mask(L), b) == (n * (n + 1) // 2, n * (n - 1) // 2, n * n)
    window = mc.sliding_window_mask(L, max(1, L // 4))
    assert tiled.tile_counts(window, b) == _tiles_brute_force(window, b)
    states = tiled.tile_states(mc.causal_mask(L), b)
    assert (states.diagonal()[:-1] == 1).all()  # full-size diagonal tiles are partly masked
    assert (states.tril(-1)[states.tril(-1) > 0] == 2).all()  # below the diagonal: all allowed


def test_draw_tiles_titles_each_mask_with_its_counts():
    masks = {"causal": mc.causal_mask(256), "window 64": mc.sliding_window_mask(256, 64)}
    fig = efficient_attention.draw_tiles(masks, 32)
    titles = [ax.get_title() for ax in fig.axes[:2]]
    assert titles[0].startswith("causal\n36 of 64 tiles computed, 28 skipped")
    c, s, t = _tiles_brute_force(masks["window 64"], 32)
    assert titles[1] == f"window 64\n{c} of {t} tiles computed, {s} skipped"
    assert "L = 256" in fig._suptitle.get_text()
    plt.close(fig)


def test_tile_explorer_draws_causal_and_window_for_its_arguments():
    fig = efficient_attention.draw_tile_explorer(seq_len=96, block_size=32, window=40)
    titles = [ax.get_title() for ax in fig.axes[:2]]
    assert titles[0] == "causal\n6 of 9 tiles computed, 3 skipped"
    c, s, t = _tiles_brute_force(mc.sliding_window_mask(96, 40), 32)
    assert titles[1] == f"sliding window 40\n{c} of {t} tiles computed, {s} skipped"
    assert fig.axes[0].images[0].get_array().shape == (3, 3)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# the exercise checker


def test_checker_passes_the_reference_and_another_correct_formulation():
    assert mc.check.online_softmax_update(tiled.online_softmax_update).passed

    def with_where(row_max, row_sum, acc, scores, v):
        m = torch.maximum(row_max, scores.max(dim=-1, keepdim=True).values)
        seen = torch.isfinite(m)
        alpha = torch.where(seen, torch.exp(row_max - m), torch.zeros_like(m))
        p = torch.where(seen, torch.exp(scores - m), torch.zeros_like(scores))
        return m, alpha * row_sum + p.sum(-1, keepdim=True), alpha * acc + torch.einsum("...qk,...kd->...qd", p, v)

    assert mc.check.online_softmax_update(with_where).passed


@pytest.mark.parametrize(
    "flags, words",
    [
        (dict(rescale_acc=False), "acc was not rescaled"),
        (dict(rescale_sum=False), "row_sum was not rescaled"),
        (dict(rescale_sum=False, rescale_acc=False), "neither row_sum nor acc"),
        (dict(sign=-1), "inverted"),
        (dict(block_max_only=True), "larger of the running max"),
        (dict(normalise=True), "keep acc unnormalised"),
        (dict(subtract_max=False), "without subtracting the max"),
        (dict(guard=False), "NaN for a row"),
    ],
)
def test_checker_names_each_known_mistake(flags, words):
    result = mc.check.online_softmax_update(functools.partial(check_tiled._variant, **flags))
    assert not result.passed and "likely mistake" in result.message and words in result.message


def test_checker_reports_not_attempted_and_never_raises():
    def todo(row_max, row_sum, acc, scores, v):
        raise NotImplementedError("Exercise")

    assert mc.check.online_softmax_update(todo).status == "not attempted"
    result = mc.check.online_softmax_update(lambda *a: a[0] @ a[1])
    assert not result.passed and "raised" in result.message


# ---------------------------------------------------------------------------------------------
# the checker of the tiled loop: written here independently (keys tiled, all queries at once)


def _keys_tiled(q, k, v, mask=None, *, block_size=64, scaled=True, stop=None, mask_as=None, guard=True):
    """A correct tiled loop over key blocks only (all queries at once), or one with a mistake."""
    scores_shape = torch.broadcast_shapes(q.shape[:-1] + (1,), k.shape[:-2] + (1, 1), v.shape[:-2] + (1, 1))
    Lq, Lk = q.shape[-2], k.shape[-2]
    batch = scores_shape[:-2]
    q = q / math.sqrt(q.shape[-1]) if scaled else q
    m = torch.full((*batch, Lq, 1), float("-inf"), dtype=q.dtype)
    total, acc = torch.zeros(*batch, Lq, 1, dtype=q.dtype), torch.zeros(*batch, Lq, v.shape[-1], dtype=q.dtype)
    for j in range(0, Lk if stop is None else stop(Lk, block_size), block_size):
        s = torch.einsum("...qd,...kd->...qk", q, k[..., j : j + block_size, :])
        if mask is not None and mask_as != "ignored":
            allowed = torch.broadcast_to(mask, (*batch, Lq, Lk))[..., j : j + block_size]
            s = torch.where(allowed if mask_as != "inverted" else ~allowed, s, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        base = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = (s - base).exp()
        rescale = (m - base).exp()
        total, acc, m = (
            rescale * total + p.sum(-1, keepdim=True),
            rescale * acc + p @ v[..., j : j + block_size, :],
            m_new,
        )
    if not guard:
        return acc / total
    return torch.where(total == 0, torch.zeros_like(acc), acc / total.clamp_min(1e-30))


def _per_tile_softmax(q, k, v, mask=None, *, block_size=64):
    out = 0
    for j in range(0, k.shape[-2], block_size):
        s = q @ k[..., j : j + block_size, :].transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(
                ~torch.broadcast_to(mask, s.shape[:-1] + (mask.shape[-1],))[..., j : j + block_size], -1e30
            )
        out = out + torch.softmax(s, -1) @ v[..., j : j + block_size, :]
    return out


def _whole_matrix(q, k, v, mask=None, *, block_size=64):
    return (
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask).nan_to_num(0.0)
        if mask is None
        else _explicit(q, k, v, mask)
    )


def test_tiled_loop_checker_passes_two_correct_loops():
    assert mc.check.tiled_attention(tiled.tiled_attention).passed
    result = mc.check.tiled_attention(_keys_tiled)
    assert result.passed, result
    assert "never held the 256 × 256 scores" in result.message


@pytest.mark.parametrize(
    "fn, name",
    [
        (functools.partial(_keys_tiled, scaled=False), "no scale"),
        (functools.partial(_keys_tiled, stop=lambda L, b: L // b * b), "last key block dropped"),
        (functools.partial(_keys_tiled, mask_as="ignored"), "mask ignored"),
        (functools.partial(_keys_tiled, mask_as="inverted"), "mask inverted"),
        (_per_tile_softmax, "per-tile softmax"),
        (functools.partial(_keys_tiled, guard=False), "NaN for a row with no allowed key"),
        (_whole_matrix, "materialises the score matrix"),
    ],
)
def test_tiled_loop_checker_names_each_mistake(fn, name):
    diagnosis = next(m.diagnosis for m in check_tiled.TILED_ATTENTION_MISTAKES if m.name == name)
    result = mc.check.tiled_attention(fn)
    assert not result.passed and result.message == f"tiled_attention: likely mistake — {diagnosis}", result


def test_tiled_loop_checker_reports_not_attempted():
    def todo(q, k, v, mask=None, *, block_size=64):
        raise NotImplementedError

    assert mc.check.tiled_attention(todo).status == "not attempted"


@torch.no_grad()
def test_what_notebook_09_prints_about_sdpa_holds_on_this_torch():
    """Notebook 09 prints version-robust facts instead of exact kernel bytes (the math backend's peak
    was 40.5 MiB on torch 2.13 and 56.5 MiB on 2.5 for the same call): the math backend holds more
    than two score matrices, the flash kernel under a fifth of one (0.07 on 2.13, 0.099 on 2.5.1),
    and an explicit attn_mask costs one float L × L mask. Checked on whichever torch runs the tests."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, h, L, d = 1, 4, 1024, 32
    q, k, v = (torch.randn(B, h, L, d) for _ in range(3))
    scores = B * h * L * L * 4
    causal = functools.partial(F.scaled_dot_product_attention, q, k, v, is_causal=True)
    with sdpa_kernel(SDPBackend.MATH):
        assert peak_memory(causal) > 2 * scores
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        assert peak_memory(causal) < scores / 5
    masked = functools.partial(F.scaled_dot_product_attention, q, k, v, attn_mask=mc.causal_mask(L))
    extra = (peak_memory(masked) - peak_memory(causal)) / (L * L * 4)
    assert round(extra, 1) == 1.0
