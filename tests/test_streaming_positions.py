"""StreamingLLM's position rule: keys cached before RoPE, rotated by their position in the cache."""

import pytest
import torch
import torch.nn.functional as F

from mha_course import cache_schemes as cs
from mha_course.positions import apply_rope


def _kept(t, window, sinks):
    """Text positions a window-plus-sinks cache holds after writing position t."""
    return sorted(set(range(min(sinks, t + 1))) | set(range(max(0, t - window + 1), t + 1)))


def _streaming_reference(q, k, v, window, sinks):
    """A naive loop: at step t, the kept tokens as a fresh sequence with positions 0..n-1."""
    outs = []
    for t in range(q.shape[2]):
        kept = _kept(t, window, sinks)
        n = len(kept)
        keys = apply_rope(k[:, :, kept], torch.arange(n))  # (B, h, n, d)
        query = apply_rope(q[:, :, t : t + 1], [n - 1])  # (B, h, 1, d)
        outs.append(F.scaled_dot_product_attention(query, keys, v[:, :, kept]))
    return torch.cat(outs, dim=2)


def test_cache_positions_follow_the_paper_example():
    # Xiao et al. §3.2: tokens [0, 1, 2, 3, 6, 7, 8] in the cache, then 9 -> positions 0..7
    slots = torch.tensor([0, 1, 2, 3, 8, 9, 6, 7])  # a rolling layout: 8 and 9 overwrote 4 and 5
    assert cs.cache_positions(slots).tolist() == [0, 1, 2, 3, 6, 7, 4, 5]
    assert cs.cache_positions(torch.tensor([0, -1, 2, -1])).tolist() == [0, -1, 1, -1]
    with pytest.raises(ValueError, match="positions must be 1-D"):
        cs.cache_positions(torch.zeros(2, 2, dtype=torch.long))


@pytest.mark.parametrize("L, window, sinks", [(30, 6, 4), (20, 4, 0), (15, 3, 1), (10, 16, 2)])
def test_streaming_rule_equals_a_fresh_sequence_of_the_kept_tokens(L, window, sinks):
    g = torch.Generator().manual_seed(L + window)
    q, k, v = (torch.randn(2, 3, L, 8, generator=g, dtype=torch.float64) for _ in range(3))
    out, cache = cs.decode_streaming(q, k, v, window, sinks, positions="cache")
    torch.testing.assert_close(out, _streaming_reference(q, k, v, window, sinks), atol=1e-12, rtol=0)
    assert cache.query_position == len(_kept(L - 1, window, sinks)) - 1


def test_text_rule_equals_rope_at_text_positions_with_the_mask():
    g = torch.Generator().manual_seed(1)
    L, window, sinks = 25, 5, 2
    q, k, v = (torch.randn(1, 2, L, 8, generator=g, dtype=torch.float64) for _ in range(3))
    out, _ = cs.decode_streaming(q, k, v, window, sinks, positions="text")
    pos = torch.arange(L)
    mask = cs.sink_window_mask(L, window, sinks)
    expected = F.scaled_dot_product_attention(apply_rope(q, pos), apply_rope(k, pos), v, attn_mask=mask)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)


def test_the_two_rules_agree_until_the_first_eviction_then_differ():
    """The test that tells them apart: a rotated-key cache fails the StreamingLLM reference as soon
    as a token has been evicted (its cached keys keep distances larger than the cache)."""
    g = torch.Generator().manual_seed(2)
    L, window, sinks = 24, 6, 2
    q, k, v = (torch.randn(1, 2, L, 8, generator=g, dtype=torch.float64) for _ in range(3))
    reference = _streaming_reference(q, k, v, window, sinks)
    text, _ = cs.decode_streaming(q, k, v, window, sinks, positions="text")
    first_eviction = sinks + window  # step at which a window token leaves
    torch.testing.assert_close(text[:, :, :first_eviction], reference[:, :, :first_eviction], atol=1e-12, rtol=0)
    gap = (text[:, :, first_eviction:] - reference[:, :, first_eviction:]).abs().amax(dim=(0, 1, 3))
    assert (gap > 1e-3).all()


def test_decode_streaming_bad_rule():
    x = torch.randn(1, 1, 3, 4)
    with pytest.raises(ValueError, match="positions must be 'cache' or 'text'"):
        cs.decode_streaming(x, x, x, 2, positions="absolute")
