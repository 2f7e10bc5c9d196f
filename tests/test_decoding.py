"""Tests for mha_course.lessons.decoding: cached and recomputed decoding against a naive reference,
the head-to-group mapping and the figures of notebook 06."""

import math

import matplotlib
import pytest
import torch

import mha_course as mc
from mha_course.lessons import decoding

matplotlib.use("Agg")


def naive_causal_gqa(layer: mc.GroupedQueryAttention, x):
    """Reference: one query head at a time, reading K/V head i // n_rep, with an explicit
    lower-triangular mask and softmax; written from the definition, not from the layer's forward."""
    B, L, _ = x.shape
    hd, n_rep = layer.head_dim, layer.n_rep
    wq = layer.q_proj.weight.view(layer.num_heads, hd, -1)  # (h, hd, d_model)
    wk = layer.k_proj.weight.view(layer.num_kv_heads, hd, -1)  # (h_kv, hd, d_model)
    wv = layer.v_proj.weight.view(layer.num_kv_heads, hd, -1)
    future = torch.ones(L, L, dtype=torch.bool).triu(1)
    heads = []
    for i in range(layer.num_heads):
        q, k, v = x @ wq[i].T, x @ wk[i // n_rep].T, x @ wv[i // n_rep].T  # (B, L, hd)
        scores = (q @ k.transpose(1, 2) / math.sqrt(hd)).masked_fill(future, float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v)
    return torch.cat(heads, dim=-1) @ layer.o_proj.weight.T  # (B, L, d_model)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize(("use_cache", "preallocate"), [(True, False), (True, True), (False, False)])
@pytest.mark.parametrize("prompt_len", [1, 4])
def test_decode_equals_naive_causal_attention(num_heads, num_kv_heads, use_cache, preallocate, prompt_len):
    torch.manual_seed(num_heads + num_kv_heads + prompt_len)
    layer = mc.GroupedQueryAttention(num_heads * 4, num_heads, num_kv_heads)
    x = torch.randn(3, 9, num_heads * 4)
    out, cache = decoding.decode(layer, x, prompt_len=prompt_len, use_cache=use_cache, preallocate=preallocate)
    torch.testing.assert_close(out, naive_causal_gqa(layer, x), atol=1e-5, rtol=1e-4)
    assert (cache is None) == (not use_cache)
    if use_cache:
        assert cache.preallocated == preallocate and cache.length == 9


def test_decode_cache_holds_every_key_and_value_in_its_kv_heads():
    torch.manual_seed(0)
    layer = mc.GroupedQueryAttention(32, 8, 2).to(torch.bfloat16)
    x = torch.randn(2, 7, 32, dtype=torch.bfloat16)
    _, cache = decoding.decode(layer, x, prompt_len=3)
    hd = layer.head_dim
    expected_k = (x @ layer.k_proj.weight.T).view(2, 7, 2, hd).transpose(1, 2)  # (B, h_kv, L, hd)
    expected_v = (x @ layer.v_proj.weight.T).view(2, 7, 2, hd).transpose(1, 2)
    torch.testing.assert_close(cache.keys, expected_k)
    torch.testing.assert_close(cache.values, expected_v)
    assert cache.nbytes == 2 * 2 * 2 * hd * 7 * 2  # K and V · B · h_kv · hd · L · 2 bytes (bf16)
    assert cache.nbytes == mc.kv_cache_bytes(1, 2, hd, 7, batch=2, bytes_per_element=2)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (4, 1)])
@pytest.mark.parametrize("preallocated", [False, True])
def test_decode_step_is_the_next_position_of_a_causal_pass_at_every_call(num_heads, num_kv_heads, preallocated):
    torch.manual_seed(1)
    layer = mc.GroupedQueryAttention(16, num_heads, num_kv_heads)
    x = torch.randn(2, 6, 16)
    cache = mc.KVCache()
    layer(x[:, :5], cache=cache, is_causal=True)  # prefill 5 positions
    step = decoding.decode_step(layer, x[:, 5:], cache, preallocated=preallocated)
    expected = naive_causal_gqa(layer, x)[:, 5:]  # (B, 1, d_model): position 5 of one causal pass
    for _ in range(2):  # the same result every call: the cache does not grow
        torch.testing.assert_close(step(), expected, atol=1e-5, rtol=1e-4)
    assert cache.length == 5
    with pytest.raises(ValueError, match="already holds"):
        decoding.decode_step(layer, x[:, 5:], mc.KVCache())


def test_decode_rejects_bad_input():
    layer = mc.GroupedQueryAttention(8, 2, 1)
    with pytest.raises(TypeError, match="GroupedQueryAttention"):
        decoding.decode(mc.MultiHeadAttention(8, 2), torch.randn(1, 3, 8))
    with pytest.raises(ValueError, match="prompt_len=5"):
        decoding.decode(layer, torch.randn(1, 3, 8), prompt_len=5)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(32, 8), (8, 8), (8, 1), (6, 3)])
def test_kv_head_for_query_is_i_div_n_rep(num_heads, num_kv_heads):
    n_rep = num_heads // num_kv_heads
    expected = [i // n_rep for i in range(num_heads)]
    assert decoding.kv_head_for_query(num_heads, num_kv_heads) == expected
    assert torch.arange(num_kv_heads).repeat_interleave(n_rep).tolist() == expected


def test_family_names_and_bad_head_counts():
    assert [decoding.family_name(32, k) for k in (32, 8, 1)] == ["MHA", "GQA", "MQA"]
    with pytest.raises(ValueError, match="num_heads=8 is not a multiple of num_kv_heads=3"):
        decoding.kv_head_for_query(8, 3)
    with pytest.raises(ValueError, match="not a multiple"):
        decoding.draw_head_groups(8, 3)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(32, 8), (8, 2), (4, 1), (4, 4)])
def test_draw_head_groups_connects_each_query_head_to_its_kv_head(num_heads, num_kv_heads):
    ax = decoding.draw_head_groups(num_heads, num_kv_heads)
    n_rep = num_heads // num_kv_heads
    assert len(ax.lines) == num_heads
    for i, line in enumerate(ax.lines):
        top, bottom = line.get_xdata()
        group_centre = (i // n_rep) * n_rep + (n_rep - 1) / 2
        assert top == i and bottom == pytest.approx(group_centre)
    assert ax.get_title().startswith(decoding.family_name(num_heads, num_kv_heads))
    matplotlib.pyplot.close(ax.figure)


def test_cache_explorer_bars_are_the_llama3_8b_cache_sizes():
    fig = decoding.draw_cache_explorer(num_kv_heads=8, context_len=8192)
    left, right = fig.axes[:2]
    heights = [bar.get_height() for bar in right.patches]
    # 2 (K and V) · 32 layers · h_kv · 128 · 8192 tokens · 2 bytes, in GiB
    assert heights == pytest.approx([2 * 32 * k * 128 * 8192 * 2 / 2**30 for k in (1, 2, 4, 8, 16, 32)])
    assert heights[3] == 1.0 and heights[5] == 4.0
    assert "1 GiB" in right.get_title() and "8,192 tokens" in right.get_title()
    assert len(left.lines) == 32 and "GQA" in fig._suptitle.get_text()
    matplotlib.pyplot.close(fig)
    with pytest.raises(ValueError, match="num_kv_heads=3"):
        decoding.draw_cache_explorer(num_kv_heads=3)


def test_bytes_written_counts_new_tensors_and_in_place_writes_not_views():
    x = torch.zeros(4, 8)  # float32: 4 bytes a number
    assert decoding.bytes_written(lambda: x.view(8, 4).transpose(0, 1)) == 0
    assert decoding.bytes_written(lambda: x + 1) == 4 * 8 * 4
    assert decoding.bytes_written(lambda: x[:, :2].copy_(torch.ones(4, 2))) == 4 * 2 * 4 + 4 * 2 * 4  # ones + slice
    assert decoding.bytes_written(lambda: torch.cat([x, x])) == 2 * 4 * 8 * 4


@pytest.mark.parametrize("num_kv_heads", [4, 1])
def test_a_growing_step_rewrites_the_cache_and_a_preallocated_one_writes_one_position(num_kv_heads):
    torch.manual_seed(2)
    layer = mc.GroupedQueryAttention(32, 4, num_kv_heads)
    cache = mc.KVCache()
    T, hd = 64, 8
    cache.update(torch.randn(2, num_kv_heads, T, hd), torch.randn(2, num_kv_heads, T, hd))
    new = torch.randn(2, 1, 32)
    growing = decoding.bytes_written(decoding.decode_step(layer, new, cache))
    pre = decoding.bytes_written(decoding.decode_step(layer, new, cache, preallocated=True))
    one_position = 2 * 2 * num_kv_heads * hd * 4  # K and V of one token, float32
    rewrite = (T + 1) * one_position  # torch.cat writes all T + 1 positions
    assert growing - pre == rewrite - one_position
