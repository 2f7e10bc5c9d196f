"""causal_mask, sliding_window_mask and padding_mask against double loops of their
definitions, plus behaviour: a causal mask makes the output blind to the future, and it
matches PyTorch's own lower-right causal bias when Lq != Lk."""

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.bias import causal_lower_right

import mha_course as mc

SETTINGS = settings(max_examples=40, deadline=None, database=None)


def loop_mask(q_len, k_len, allowed):
    return torch.tensor([[allowed(i, j) for j in range(k_len)] for i in range(q_len)], dtype=torch.bool)


@SETTINGS
@given(st.integers(1, 9), st.integers(0, 6), st.booleans())
def test_causal_mask_matches_definition(q_len, extra, pass_k_len):
    k_len = q_len + extra
    mask = mc.causal_mask(q_len, k_len) if (pass_k_len or extra) else mc.causal_mask(q_len)
    expected = loop_mask(q_len, k_len, lambda i, j: j <= i + k_len - q_len)
    assert mask.dtype == torch.bool
    assert torch.equal(mask, expected)


def test_causal_mask_square_is_lower_triangle_with_diagonal():
    assert mc.causal_mask(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    # decoding one new token after 3 cached: the new query sees all 4 keys
    assert mc.causal_mask(1, 4).tolist() == [[True, True, True, True]]


@SETTINGS
@given(st.integers(1, 9), st.integers(0, 6), st.integers(1, 10))
def test_sliding_window_mask_matches_definition(q_len, extra, window):
    k_len = q_len + extra
    off = k_len - q_len
    mask = mc.sliding_window_mask(q_len, window, k_len)
    expected = loop_mask(q_len, k_len, lambda i, j: i + off - window < j <= i + off)
    assert torch.equal(mask, expected)
    assert (mask.sum(-1) <= window).all()


@SETTINGS
@given(st.lists(st.integers(0, 8), min_size=1, max_size=5), st.integers(0, 4), st.booleans())
def test_padding_mask_matches_definition(lengths, extra, as_tensor):
    max_len = max(max(lengths), 1) + extra
    arg = torch.tensor(lengths) if as_tensor else lengths
    mask = mc.padding_mask(arg, max_len)
    expected = torch.tensor([[t < n for t in range(max_len)] for n in lengths], dtype=torch.bool)
    assert mask.dtype == torch.bool and mask.shape == (len(lengths), 1, 1, max_len)
    assert torch.equal(mask[:, 0, 0], expected)


@SETTINGS
@given(st.integers(1, 6), st.integers(0, 4), st.integers(0, 2**31 - 1))
def test_causal_mask_matches_torch_lower_right_bias(q_len, extra, seed):
    """PyTorch's causal_lower_right(q_len, k_len) is the same alignment, independently implemented."""
    k_len = q_len + extra
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, q_len, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 3, k_len, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 3, k_len, 5, generator=gen, dtype=torch.float64)
    ours, _ = mc.scaled_dot_product_attention(q, k, v, mc.causal_mask(q_len, k_len))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q_len, k_len))
    torch.testing.assert_close(ours, ref)
    if extra == 0:  # square: also the top-left is_causal of SDPA
        torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, is_causal=True))


@SETTINGS
@given(st.integers(2, 8), st.integers(0, 2**31 - 1))
def test_causal_mask_blinds_queries_to_the_future(length, seed):
    """Leakage test: change the keys/values at positions > t; outputs at positions <= t must not move."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, length, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    t = int(torch.randint(0, length - 1, (1,), generator=gen))
    k2, v2 = k.clone(), v.clone()
    k2[:, t + 1 :] += 10 * torch.randn(1, length - t - 1, 4, generator=gen, dtype=torch.float64)
    v2[:, t + 1 :] += 10
    mask = mc.causal_mask(length)
    out, _ = mc.scaled_dot_product_attention(q, k, v, mask)
    out2, _ = mc.scaled_dot_product_attention(q, k2, v2, mask)
    torch.testing.assert_close(out[:, : t + 1], out2[:, : t + 1], rtol=0, atol=0)
    assert not torch.allclose(out[:, t + 1 :], out2[:, t + 1 :])


def test_padding_mask_hides_padded_keys():
    """With padding, the output of each sequence equals attention over its real tokens only."""
    gen = torch.Generator().manual_seed(0)
    lengths, L = [3, 5, 1], 5
    q, k, v = (torch.randn(3, 2, L, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    out, weights = mc.scaled_dot_product_attention(q, k, v, mc.padding_mask(lengths, L))
    for b, n in enumerate(lengths):
        ref, _ = mc.scaled_dot_product_attention(q[b], k[b, :, :n], v[b, :, :n])
        torch.testing.assert_close(out[b], ref)
        assert (weights[b, :, :, n:] == 0).all()
