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


@pytest.mark.parametrize("L, window, sinks, h, dv", [(20, 5, 2, 2, 3), (9, 3, 0, 1, 4), (30, 4, 4, 3, 2), (6, 8, 2, 2, 2)])
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
