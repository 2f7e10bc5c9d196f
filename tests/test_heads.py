"""split_heads / merge_heads against an explicit per-head slicing loop: head i owns feature
columns [i*d_head, (i+1)*d_head) and keeps every token position."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mha_course as mc

SETTINGS = settings(max_examples=40, deadline=None, database=None)


@st.composite
def model_input(draw):
    h, d_head = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    b, length = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    return torch.randn(b, length, h * d_head, generator=gen, dtype=dtype), h, d_head


@SETTINGS
@given(model_input())
def test_split_heads_is_column_slicing(case):
    x, h, d = case
    out = mc.split_heads(x, h)
    assert out.shape == (x.shape[0], h, x.shape[1], d)
    for b in range(x.shape[0]):
        for i in range(h):
            for t in range(x.shape[1]):
                assert torch.equal(out[b, i, t], x[b, t, i * d : (i + 1) * d])


@SETTINGS
@given(model_input())
def test_merge_heads_is_concatenation_of_heads(case):
    x, h, d = case
    heads = torch.randn(x.shape[0], h, x.shape[1], d, dtype=x.dtype)
    out = mc.merge_heads(heads)
    assert out.shape == (x.shape[0], x.shape[1], h * d)
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            expected = torch.cat([heads[b, i, t] for i in range(h)])
            assert torch.equal(out[b, t], expected)


@SETTINGS
@given(model_input())
def test_round_trips(case):
    x, h, d = case
    assert torch.equal(mc.merge_heads(mc.split_heads(x, h)), x)
    heads = x.reshape(x.shape[0], x.shape[1], h, d).permute(0, 2, 1, 3).contiguous()
    assert torch.equal(mc.split_heads(mc.merge_heads(heads), h), heads)


def test_split_is_not_the_token_mixing_reshape():
    """The classic bug view(B, h, L, d) deals tokens to heads; split_heads must differ from it."""
    x = torch.arange(2 * 4 * 6, dtype=torch.float32).reshape(2, 4, 6)
    wrong = x.reshape(2, 3, 4, 2)
    assert not torch.equal(mc.split_heads(x, 3), wrong)
    # every head sees all 4 positions: head 1's column block of token 3 is x[:, 3, 2:4]
    assert torch.equal(mc.split_heads(x, 3)[:, 1, 3], x[:, 3, 2:4])
