"""Learned attention sinks (gpt-oss): ``mc.scaled_dot_product_attention(..., sinks=)`` and
``GroupedQueryAttention(sinks=True)`` against transformers' gpt-oss eager attention."""

import pytest
import torch
from torch import nn

import mha_course as mc

gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
masking = pytest.importorskip("transformers.masking_utils")


def _hf_mask(L, window=None):
    """transformers' own mask functions on a grid: bool (L, L), True = may attend."""
    fn = masking.causal_mask_function if window is None else masking.sliding_window_causal_mask_function(window)
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    return fn(0, 0, i, j)


def _additive(mask, dtype):
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)[None, None]


def _hf_eager(q, k, v, sinks, mask, n_rep):
    module = nn.Module()
    module.sinks, module.num_key_value_groups, module.training = sinks, n_rep, False
    out, w = gpt_oss.eager_attention_forward(module, q, k, v, _additive(mask, q.dtype), scaling=q.shape[-1] ** -0.5)
    return out.transpose(1, 2), w  # (B, h, L, d), (B, h, L, L)


@pytest.mark.parametrize("window", [None, 4, 1])
@pytest.mark.parametrize("shape", [(2, 4, 2, 9, 8), (1, 6, 3, 5, 16)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_sink_attention_equals_gpt_oss_eager(window, shape, dtype):
    B, h, h_kv, L, d = shape
    g = torch.Generator().manual_seed(L * h + (window or 0))
    q = torch.randn(B, h, L, d, generator=g, dtype=dtype)
    k, v = (torch.randn(B, h_kv, L, d, generator=g, dtype=dtype) for _ in range(2))
    sinks = 2 * torch.randn(h, generator=g, dtype=dtype)
    mask = _hf_mask(L, window)
    ref_out, ref_w = _hf_eager(q, k, v, sinks, mask, h // h_kv)
    n_rep = h // h_kv
    out, w = mc.scaled_dot_product_attention(q, mc.repeat_kv(k, n_rep), mc.repeat_kv(v, n_rep), mask, sinks=sinks)
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(w, ref_w, atol=tol, rtol=0)
    torch.testing.assert_close(out, ref_out, atol=tol, rtol=0)
    assert (w.sum(-1) < 1).all()  # the sink keeps a share of every row


def test_window_mask_matches_transformers_sliding_window():
    for L, window in [(9, 4), (7, 1), (5, 8)]:
        assert torch.equal(mc.sliding_window_mask(L, window), _hf_mask(L, window))


def test_sinks_are_one_extra_key_with_zero_value():
    """Independent of transformers: a sink is a key whose score is its logit and whose value is 0."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 6, 4, generator=g, dtype=torch.float64) for _ in range(3))
    sinks = torch.randn(3, generator=g, dtype=torch.float64)
    mask = mc.causal_mask(6)
    out, w = mc.scaled_dot_product_attention(q, k, v, mask, sinks=sinks)
    scores = (q @ k.transpose(-2, -1)) / 2.0
    scores = scores.masked_fill(~mask, float("-inf"))
    full = torch.cat([scores, sinks[:, None, None].expand(2, 3, 6, 1)], dim=-1).softmax(-1)
    torch.testing.assert_close(w, full[..., :-1], atol=1e-14, rtol=0)
    torch.testing.assert_close(out, full[..., :-1] @ v, atol=1e-14, rtol=0)
    # a very negative sink changes nothing; a fully masked row attends to nothing, without NaN
    plain, _ = mc.scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(mc.scaled_dot_product_attention(q, k, v, mask, sinks=sinks - 1e4)[0], plain)
    none = torch.zeros(6, 6, dtype=torch.bool)
    out, w = mc.scaled_dot_product_attention(q, k, v, none, sinks=sinks)
    assert torch.equal(w, torch.zeros_like(w)) and torch.equal(out, torch.zeros_like(out))


def test_sinks_bad_input():
    q = torch.randn(1, 3, 4, 8)
    with pytest.raises(ValueError, match="one logit per head"):
        mc.scaled_dot_product_attention(q, q, q, sinks=torch.zeros(2))
    with pytest.raises(ValueError, match="sinks must be 1-D"):
        mc.scaled_dot_product_attention(q, q, q, sinks=torch.zeros(3, 1))
    with pytest.raises(TypeError, match="sinks must be a floating"):
        mc.scaled_dot_product_attention(q, q, q, sinks=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="one logit per head"):
        mc.scaled_dot_product_attention(q[0, 0], q[0, 0], q[0, 0], sinks=torch.zeros(3))
    with pytest.raises(TypeError, match="sinks must be True or False"):
        mc.GroupedQueryAttention(16, 4, 2, sinks=torch.zeros(4))


@pytest.mark.parametrize("window", [None, 3])
def test_gqa_with_sinks_equals_gpt_oss_attention_layer(window):
    torch.manual_seed(0)
    d_model, h, h_kv, hd, L = 32, 4, 2, 8, 7
    config = gpt_oss.GptOssConfig(
        hidden_size=d_model,
        num_attention_heads=h,
        num_key_value_heads=h_kv,
        head_dim=hd,
        num_hidden_layers=1,
        sliding_window=window or 128,
        layer_types=["sliding_attention" if window else "full_attention"],
        attention_bias=True,
        vocab_size=8,
    )
    config._attn_implementation = "eager"
    reference = gpt_oss.GptOssAttention(config, layer_idx=0).double().eval()
    with torch.no_grad():
        for p in reference.parameters():
            p.normal_()
    ours = mc.GroupedQueryAttention(d_model, h, h_kv, head_dim=hd, bias=True, sinks=True).double()
    ours.load_state_dict(reference.state_dict())
    x = torch.randn(2, L, d_model, dtype=torch.float64)
    identity = (torch.ones(2, L, hd // 2, dtype=torch.float64), torch.zeros(2, L, hd // 2, dtype=torch.float64))
    mask = _hf_mask(L, window)
    with torch.no_grad():
        ref, ref_w = reference(x, position_embeddings=identity, attention_mask=_additive(mask, torch.float64))
        out, w = ours(x, mask=mask)
        fast, none = ours(x, mask=mask, need_weights=False)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    torch.testing.assert_close(w, ref_w, atol=1e-12, rtol=0)
    torch.testing.assert_close(fast, ref, atol=1e-12, rtol=0)
    assert none is None
    assert "sinks=True" in repr(ours)


def test_gqa_sinks_are_learned_and_default_off():
    layer = mc.GroupedQueryAttention(16, 4, 2, sinks=True)
    x = torch.randn(2, 5, 16)
    out, _ = layer(x, is_causal=True)
    out.sum().backward()
    assert layer.sinks.grad is not None and layer.sinks.grad.abs().sum() > 0
    assert mc.GroupedQueryAttention(16, 4, 2).sinks is None
