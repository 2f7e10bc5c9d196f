"""Rolling window + sinks against full attention with the equivalent mask (built independently
here), the paged cache against a contiguous one, and the int8 cache's bytes and error."""

import math

import pytest
import torch
import torch.nn.functional as F

import mha_course as mc
from mha_course.cache_schemes import (
    Int8KVCache,
    PagedKVCache,
    SinkWindowCache,
    decode_with_sink_window,
    dequantize_int8,
    gather_blocks,
    quantize_int8,
    sink_window_mask,
)


def loop_mask(L, window, sinks):
    return torch.tensor([[j <= i and (j > i - window or j < sinks) for j in range(L)] for i in range(L)])


@pytest.mark.parametrize("L, window, sinks", [(20, 5, 2), (9, 3, 0), (12, 1, 4), (7, 10, 1), (16, 4, 4)])
def test_sink_window_mask_matches_definition(L, window, sinks):
    assert torch.equal(sink_window_mask(L, window, sinks), loop_mask(L, window, sinks))


def test_sink_window_mask_without_sinks_is_the_sliding_window():
    assert torch.equal(sink_window_mask(10, 3, 0), mc.sliding_window_mask(10, 3))
    assert torch.equal(sink_window_mask(4, 2, 1, 9), loop_mask(9, 2, 1)[-4:])  # bottom-right aligned


@pytest.mark.parametrize(
    "L, window, sinks, h, dv", [(20, 5, 2, 2, 3), (9, 3, 0, 1, 4), (30, 4, 4, 3, 2), (6, 8, 2, 2, 2)]
)
def test_rolling_cache_equals_masked_attention(L, window, sinks, h, dv):
    g = torch.Generator().manual_seed(L)
    q, k = torch.randn(2, h, L, 4, generator=g), torch.randn(2, h, L, 4, generator=g)
    v = torch.randn(2, h, L, dv, generator=g)
    out, cache = decode_with_sink_window(q, k, v, window, sinks)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=loop_mask(L, window, sinks))
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    assert cache.keys.shape[2] == sinks + window  # fixed size, however long the sequence
    kept = sorted(p for p in cache.positions.tolist() if p >= 0)
    assert kept == sorted(set(range(min(sinks, L))) | set(range(max(0, L - window), L)))


def test_rolling_cache_evicts_the_oldest_window_token():
    cache = SinkWindowCache(window=3, num_sinks=2)
    for t in range(8):
        cache.update(torch.full((1, 1, 1, 1), float(t)), torch.zeros(1, 1, 1, 1))
    assert sorted(cache.keys.flatten().tolist()) == [0.0, 1.0, 5.0, 6.0, 7.0]
    with pytest.raises(ValueError, match="one new position"):
        cache.update(torch.zeros(1, 1, 2, 1), torch.zeros(1, 1, 2, 1))
    with pytest.raises(ValueError, match="num_sinks"):
        SinkWindowCache(4, -1)


@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
def test_paged_cache_gathers_what_a_contiguous_cache_holds(block_size):
    g = torch.Generator().manual_seed(block_size)
    lengths = {"a": 13, "b": 5, "c": 9}
    full = {s: (torch.randn(2, n, 4, generator=g), torch.randn(2, n, 4, generator=g)) for s, n in lengths.items()}
    cache = PagedKVCache(64, block_size, 2, 4)
    pos = dict.fromkeys(lengths, 0)
    while any(pos[s] < n for s, n in lengths.items()):  # interleave the sequences, 2 tokens at a time
        for s, n in lengths.items():
            a, b = pos[s], min(pos[s] + 2, n)
            if a < b:
                cache.append(s, full[s][0][:, a:b], full[s][1][:, a:b])
                pos[s] = b
    for s, n in lengths.items():
        k, v = cache.gather(s)
        assert torch.equal(k, full[s][0]) and torch.equal(v, full[s][1])
        assert len(cache.block_tables[s]) == math.ceil(n / block_size)
        q = torch.randn(2, 1, 4, generator=g)
        torch.testing.assert_close(
            F.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, *full[s]), atol=0, rtol=0
        )
    used = sum(math.ceil(n / block_size) for n in lengths.values())
    assert cache.used_nbytes == used * block_size * 2 * 4 * 4 * 2
    if 1 < block_size < 13:  # interleaving makes the tables of multi-block sequences non-contiguous
        assert any(t != list(range(t[0], t[0] + len(t))) for t in cache.block_tables.values())
    cache.free("a")
    assert len(cache.free_blocks) == 64 - used + math.ceil(13 / block_size)


def test_gather_blocks_loop_reference():
    pool = torch.randn(6, 2, 3, 4)
    table = torch.tensor([4, 0, 5])
    expected = torch.stack([pool[table[p // 3], :, p % 3] for p in range(8)], dim=1)  # (h, 8, d)
    assert torch.equal(gather_blocks(pool, table, 8), expected)


def test_paged_pool_exhaustion_is_a_clear_error():
    cache = PagedKVCache(2, 2, 1, 1)
    with pytest.raises(RuntimeError, match="2 blocks"):
        cache.append(0, torch.zeros(1, 5, 1), torch.zeros(1, 5, 1))
    with pytest.raises(ValueError, match="h_kv, L_new, d"):
        cache.append(1, torch.zeros(2, 1, 1), torch.zeros(2, 1, 1))


def test_quantize_int8_error_bound_and_range():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 50, 16, generator=g, dtype=torch.float64)
    for dim in (-1, -2):
        q, scale = quantize_int8(x, dim=dim)
        assert q.dtype == torch.int8 and int(q.abs().max()) == 127
        err = (dequantize_int8(q, scale) - x).abs()
        assert bool((err <= scale / 2 + 1e-12).all())  # round to nearest: at most half a step
    zero = torch.zeros(1, 4)
    q, scale = quantize_int8(zero)
    assert torch.equal(dequantize_int8(q, scale), zero)


def test_int8_cache_bytes_and_attention_error():
    g = torch.Generator().manual_seed(1)
    B, h, L, d = 2, 4, 64, 32
    k, v = torch.randn(B, h, L, d, generator=g), torch.randn(B, h, L, d, generator=g)
    cache = Int8KVCache()
    cache.update(k[:, :, :40], v[:, :, :40])
    kq, vq = cache.update(k[:, :, 40:], v[:, :, 40:])
    assert cache.length == L
    assert cache.nbytes == 2 * (B * h * L * d * 1 + B * h * L * 4)  # int8 values + one fp32 scale per (token, head)
    q = torch.randn(B, h, 1, d, generator=g)
    exact = F.scaled_dot_product_attention(q, k, v)
    approx = F.scaled_dot_product_attention(q, kq, vq)
    rel = ((approx - exact).norm() / exact.norm()).item()
    assert 1e-4 < rel < 2e-2  # int8 is not free, but close


# --- the notebook's helpers (mha_course.lessons.beyond_gqa) -------------------------------------

from mha_course.lessons import beyond_gqa as lesson  # noqa: E402


@pytest.mark.parametrize("layers, window", [(1, 8), (2, 8), (4, 8), (3, 5), (2, 1)])
def test_receptive_field_is_layers_times_window_minus_one(layers, window):
    assert lesson.receptive_field(layers, window, 64) == layers * (window - 1)


def test_a_real_windowed_stack_reaches_as_far_as_the_masks_say():
    assert lesson.measured_reach(3, 6, 40) == lesson.receptive_field(3, 6, 40) == 15


def test_scheme_cache_bytes_against_the_formulas():
    llama, lite = mc.MODEL_CONFIGS["Llama 3 8B"], mc.configs.LATENT_MODEL_CONFIGS["DeepSeek-V2-Lite"]
    assert lesson.scheme_cache_bytes(llama, "GQA", 1000) == mc.kv_cache_bytes(32, 8, 128, 1000)
    assert lesson.scheme_cache_bytes(llama, "MHA", 1000) == mc.kv_cache_bytes(32, 32, 128, 1000)
    assert lesson.scheme_cache_bytes(llama, "MQA", 1000) == mc.kv_cache_bytes(32, 1, 128, 1000)
    assert lesson.scheme_cache_bytes(lite, "MLA", 1000) == lite.kv_cache_bytes(1000) == 27 * 576 * 1000 * 2
    windowed = [lesson.scheme_cache_bytes(llama, "window + sinks", T, window=4096, num_sinks=4) for T in (8192, 10**5)]
    assert windowed[0] == windowed[1] == mc.kv_cache_bytes(32, 8, 128, 4100)  # stops growing
    assert lesson.scheme_cache_bytes(llama, "GQA", 1000, block_size=16) == mc.kv_cache_bytes(32, 8, 128, 1008)
    with pytest.raises(ValueError, match="scheme"):
        lesson.scheme_cache_bytes(llama, "MLQ", 10)


def test_draw_explorer_titles_the_chosen_cache():
    import matplotlib.pyplot as plt

    fig = lesson.draw_explorer("DeepSeek-V2-Lite", "MLA", 32768, block_size=1)
    left, right = fig.axes[:2]
    assert f"{27 * 576 * 32768 * 2 / 2**30:.3g} GiB" in left.get_title()
    assert len(left.get_lines()) == len(lesson.SCHEMES) + 1  # one curve per scheme + the context marker
    plt.close(fig)
    fig = lesson.draw_explorer("Mistral 7B", "window + sinks", 131072, window=4096, num_sinks=4, block_size=16)
    assert f"{mc.kv_cache_bytes(32, 8, 128, 4112) / 2**30:.3g} GiB" in fig.axes[0].get_title()
    image = fig.axes[1].get_images()[0].get_array()
    assert image.shape == (32, 32) and image[-1].sum() == 1 + 4  # window 4096/131072·32 = 1 key + 4 sinks
    plt.close(fig)
    with pytest.raises(ValueError, match="num_kv_heads"):
        lesson.draw_explorer("Gemma 2 9B", "GQA", 4096, num_kv_heads=32)
    plt.close("all")


def test_draw_patterns_shows_the_three_masks():
    import matplotlib.pyplot as plt

    fig = lesson.draw_patterns(seq_len=16, window=4, num_sinks=2)
    counts = [int(ax.get_images()[0].get_array()[-1].sum()) for ax in fig.axes]
    assert counts == [16, 4, 6]
    plt.close(fig)


def test_tiny_model_training_is_deterministic_and_shares_add_up():
    a = lesson.train_tiny_lm(seed=3, steps=4, batch_size=8)
    b = lesson.train_tiny_lm(seed=3, steps=4, batch_size=8)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
    tokens = lesson.sample_sequences(lesson.markov_table(), 20, seed=1)
    assert bool((tokens[:, 0] == lesson.BOS).all()) and int(tokens[:, 1:].max()) < lesson.VOCAB
    shares = lesson.attention_shares(a, tokens, window=8, from_position=12)
    assert bool(((shares["the BOS token"] + shares["keys beyond the window"]) <= 1 + 1e-12).all())
    assert float(lesson.attention_shares(a, tokens, window=64, from_position=12)["keys beyond the window"].max()) == 0.0
    losses = lesson.windowed_losses(a, tokens, window=4, sinks=(0, 2))
    with torch.no_grad():
        logits = a(tokens[:, :-1])  # full causal attention
        per_position = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    assert losses["full attention"] == pytest.approx(per_position[:, 6:].mean().item(), rel=1e-12)
    assert list(losses) == ["full attention", "window 4, no sink", "window 4 + 2 sinks"]


def test_rope_matrix_is_the_rotation_as_a_matrix():
    from mha_course.positions import apply_rope

    x = torch.randn(5, 16, dtype=torch.float64)
    for p in (0, 3, 11):
        rotated = apply_rope(x, torch.full((5,), p), layout="interleaved")
        torch.testing.assert_close(x @ lesson.rope_matrix(p, 16), rotated, atol=1e-12, rtol=0)


def test_transformers_sink_attention_wrapper_matches_the_course():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 6, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 6, 8, generator=g, dtype=torch.float64) for _ in range(2))
    sinks = torch.randn(4, generator=g, dtype=torch.float64)
    mask = mc.sliding_window_mask(6, 3)
    out, w = lesson.transformers_sink_attention(q, k, v, sinks, mask)
    ours, ours_w = mc.scaled_dot_product_attention(q, mc.repeat_kv(k, 2), mc.repeat_kv(v, 2), mask, sinks=sinks)
    torch.testing.assert_close(out, ours, atol=1e-12, rtol=0)
    torch.testing.assert_close(w, ours_w, atol=1e-12, rtol=0)


def test_draw_roofline_and_explorer_name_what_they_show():
    import matplotlib.pyplot as plt

    fig = lesson.draw_roofline({"a": 1.0, "b": 500.0}, peak_tflops=989, bandwidth_tbs=3.35, gpu="H100 SXM")
    ax = fig.axes[0]
    assert "ridge at 295 FLOP/B" in ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a: 1 FLOP/B", "b: 500 FLOP/B"]
    plt.close(fig)
    fig = lesson.draw_explorer("DeepSeek-V2-Lite", "MLA", num_kv_heads=4)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "window + sinks (on GQA: 4 K/V heads of 128)" in labels
    plt.close(fig)


def test_streaming_reference_equals_the_rerotating_cache():
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 15, 8, generator=g, dtype=torch.float64) for _ in range(3))
    out, _ = mc.cache_schemes.decode_streaming(q, k, v, 4, 1)
    torch.testing.assert_close(lesson.streaming_reference(q, k, v, window=4, num_sinks=1), out, atol=1e-12, rtol=0)


def test_tiny_model_with_sinks_learns_its_sink_logits():
    plain = lesson.train_tiny_lm(seed=0, steps=3, batch_size=4)
    sunk = lesson.train_tiny_lm(seed=0, steps=3, batch_size=4, sinks=True)
    assert all(layer.self_attn.sinks is None for layer in plain.layers)
    assert all(layer.self_attn.sinks.abs().max() > 0 for layer in sunk.layers)  # moved from 0
    tokens = lesson.sample_sequences(lesson.markov_table(), 8, seed=1)
    shares = lesson.attention_shares(sunk, tokens, window=8, from_position=12)
    assert bool((shares["the learned sink"] > 0).all())
    assert (
        float(lesson.attention_shares(plain, tokens, window=8, from_position=12)["the learned sink"].abs().max())
        < 1e-12
    )


def test_uniform_bos_share_is_what_a_uniform_head_gives():
    model = lesson.train_tiny_lm(seed=3, steps=1, batch_size=8)
    with torch.no_grad():  # queries 0: every score equal, every row uniform over its allowed keys
        for layer in model.layers:
            layer.self_attn.q_proj.weight.zero_()
            if layer.self_attn.q_proj.bias is not None:
                layer.self_attn.q_proj.bias.zero_()
    tokens = lesson.sample_sequences(lesson.markov_table(), 6, seed=1)
    shares = lesson.attention_shares(model, tokens, window=8, from_position=12)["the BOS token"]
    expected = sum(1 / (t + 1) for t in range(12, tokens.shape[1] - 1)) / (tokens.shape[1] - 1 - 12)
    assert lesson.uniform_bos_share(tokens.shape[1] - 1, from_position=12) == pytest.approx(expected, rel=1e-12)
    torch.testing.assert_close(shares, torch.full_like(shares, expected))
