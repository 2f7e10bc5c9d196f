"""mha_course.lessons.mask_lab against PyTorch's own attention APIs and naive loops."""

import itertools

import matplotlib
import pytest
import torch
import torch.nn.functional as F

import mha_course as mc
from mha_course.lessons import mask_lab as mt

matplotlib.use("Agg")


def random_mask(*shape, seed=0):
    """bool mask with at least one True per last-dim row (so no API returns NaN)."""
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(*shape, generator=g) > 0.5
    m[..., torch.randint(shape[-1], (), generator=g)] = True
    return m


@pytest.mark.parametrize("Lq,Lk", [(4, 4), (3, 7), (6, 2)])
def test_converted_masks_give_identical_attention_in_each_api(Lq, Lk):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, Lq, 8), torch.randn(2, 3, Lk, 8), torch.randn(2, 3, Lk, 5)
    m = random_mask(2, 3, Lq, Lk)
    ref, _ = mc.scaled_dot_product_attention(q, k, v, m)
    for dst in ("sdpa", "additive"):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mt.convert(m, "course", dst))
        torch.testing.assert_close(out, ref)
    # an explicit loop over rows: softmax over the allowed keys only
    for b, h, i in itertools.product(range(2), range(3), range(Lq)):
        keep = m[b, h, i]
        w = torch.softmax(q[b, h, i] @ k[b, h, keep].T / 8**0.5, dim=-1)
        torch.testing.assert_close(w @ v[b, h, keep], ref[b, h, i])


def test_torch_mha_convention_matches_nn_multihead_attention():
    torch.manual_seed(1)
    mha = mc.MultiHeadAttention(8, 2)
    x = torch.randn(3, 5, 8)
    m = random_mask(5, 5, seed=3)
    ref, _ = mha(x, mask=m)
    tm = mha.to_torch()
    for dst in ("torch_mha", "additive"):
        out, _ = tm(x, x, x, attn_mask=mt.convert(m, "course", dst), need_weights=False)
        torch.testing.assert_close(out, ref)
    wrong, _ = tm(x, x, x, attn_mask=m, need_weights=False)  # the classic polarity bug
    assert (wrong - ref).abs().max() > 1e-3


def test_key_padding_conversions_match_nn_multihead_attention():
    torch.manual_seed(2)
    mha = mc.MultiHeadAttention(8, 2)
    x = torch.randn(3, 6, 8)
    lengths = [6, 4, 1]
    kpm = torch.arange(6)[None, :] >= torch.tensor(lengths)[:, None]  # True = padding
    assert torch.equal(mt.course_to_key_padding(mc.padding_mask(lengths, 6)), kpm)
    assert torch.equal(mt.key_padding_to_course(kpm), mc.padding_mask(lengths, 6))
    ref, _ = mha.to_torch()(x, x, x, key_padding_mask=kpm, need_weights=False)
    out, _ = mha(x, mask=mt.key_padding_to_course(kpm))
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("src,dst", list(itertools.product(sorted(mt.CONVENTIONS), repeat=2)))
def test_convert_round_trips_and_known_values(src, dst):
    m = random_mask(3, 4, seed=5)
    there = mt.convert(m, "course", src)
    assert torch.equal(mt.convert(mt.convert(there, src, dst), dst, "course"), m)
    expected = {
        "course": m,
        "sdpa": m,
        "torch_mha": ~m,
        "hf": m.long(),
        "additive": torch.where(m, 0.0, float("-inf")),
    }[src]
    assert there.dtype == expected.dtype and torch.equal(there, expected)


def test_convert_accepts_dtype_minimum_and_rejects_bad_masks():
    add = torch.tensor([[0.0, torch.finfo(torch.float32).min]])
    assert mt.convert(add, "additive", "course").tolist() == [[True, False]]
    with pytest.raises(ValueError, match="only 0 and -inf"):
        mt.convert(torch.tensor([0.0, -1.5]), "additive", "course")
    with pytest.raises(TypeError, match="must be bool"):
        mt.convert(torch.ones(2), "course", "additive")
    with pytest.raises(ValueError, match="unknown mask convention"):
        mt.convert(torch.ones(2, dtype=torch.bool), "course", "keras")
    with pytest.raises(ValueError, match="0 and 1"):
        mt.convert(torch.tensor([0, 2]), "hf", "course")


def causal_attention(mask):
    torch.manual_seed(0)
    mha = mc.MultiHeadAttention(8, 2)
    return lambda x: mha(x, mask=mask)


def test_leakage_is_zero_for_causal_functions_and_positive_for_leaky_ones():
    x = torch.randn(2, 6, 8)
    for t in range(5):
        assert mt.leakage(lambda x: x.cumsum(1), x, t) == 0.0
        assert mt.leakage(causal_attention(mc.causal_mask(6)), x, t) < 1e-6
        assert mt.leakage(lambda x: x.flip(1).cumsum(1).flip(1), x, t) > 0.1  # reverse cumsum sees the future
        off_by_one = torch.ones(6, 6, dtype=torch.bool).tril(1)
        assert mt.leakage(causal_attention(off_by_one), x, t) > 1e-3
    # the sequence dim is respected: positions along dim 0
    assert mt.leakage(lambda x: x.cumsum(0), x.transpose(0, 1), 2, dim=0) == 0.0
    assert mt.leakage(lambda x: x.flip(0).cumsum(0).flip(0), x.transpose(0, 1), 2, dim=0) > 0.1
    with pytest.raises(ValueError, match="t must be"):
        mt.leakage(lambda x: x, x, 5)


def test_dependency_matrix_recovers_the_dependency_pattern():
    x = torch.randn(2, 5, 3)
    dep = mt.dependency_matrix(lambda x: x.cumsum(1), x)
    assert torch.equal(dep > 0, torch.ones(5, 5, dtype=torch.bool).tril())
    dep = mt.dependency_matrix(lambda x: 2 * x, x)
    assert torch.equal(dep > 0, torch.eye(5, dtype=torch.bool))
    window = mc.sliding_window_mask(5, 2)
    dep = mt.dependency_matrix(causal_attention(window), x.new_zeros(1, 5, 8).normal_())
    assert torch.equal(dep > 1e-6, window)


def test_build_mask_matches_a_loop():
    for length, causal, window in itertools.product((1, 4, 7), (False, True), (0, 1, 3)):
        for num_pad in range(length + 1):
            expected = torch.zeros(length, length, dtype=torch.bool)
            for i, j in itertools.product(range(length), repeat=2):
                ok = j < length - num_pad and (not causal or j <= i)
                if window:
                    ok = ok and (i - window < j if causal else abs(i - j) < window)
                expected[i, j] = ok
            got = mt.build_mask(length, num_pad=num_pad, causal=causal, window=window)
            assert torch.equal(got, expected), (length, num_pad, causal, window)


def test_build_mask_rejects_more_padding_than_tokens():
    with pytest.raises(ValueError, match="num_pad=5 exceeds length=4"):
        mt.build_mask(4, num_pad=5)


def test_draw_mask_explorer_shows_the_mask_and_sdpa_weights():
    fig = mt.draw_mask_explorer(length=6, num_pad=2, causal=True, window=3, seed=1)
    ax_mask, ax_w = fig.axes[0], fig.axes[1]  # the colour bars come after
    assert fig._suptitle.get_text() == "L = 6, 2 padding, causal, window 3"
    assert ax_w.get_title() == "attention weights (each row sums to 1)"
    assert [t.get_text() for t in ax_w.get_xticklabels()] == ["the", "cat", "sat", "on", "<pad>", "<pad>"]
    mask = torch.tensor(ax_mask.images[0].get_array()).bool()
    assert torch.equal(mask, mt.build_mask(6, num_pad=2, causal=True, window=3))
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 6, 8, generator=g).unbind(0)
    ref = torch.softmax((q @ k.T / 8**0.5).masked_fill(~mask, float("-inf")), dim=-1)
    torch.testing.assert_close(torch.tensor(ax_w.images[0].get_array(), dtype=torch.float32), ref)
    matplotlib.pyplot.close(fig)
    fig = mt.draw_mask_explorer(length=3, num_pad=6, causal=False)  # capped at 3: all padding, rows of 0, no NaN
    assert fig._suptitle.get_text() == "L = 3, 3 padding, bidirectional, no window"
    assert float(fig.axes[1].images[0].get_array().sum()) == 0.0
    matplotlib.pyplot.close(fig)
