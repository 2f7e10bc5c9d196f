"""The cached_gqa_attention checker (notebook 06): correct cached GQA steps of several kinds
pass (checked by decoding in chunks against one causal pass), each known mistake is named."""

import math

import pytest
import torch
import torch.nn.functional as F

import mha_course as mc
from mha_course.check import cached_gqa
from mha_course.kv_cache import write_kv


def with_course_functions(layer, x, k_cache, v_cache, length):
    T = x.shape[1]
    q = mc.split_heads(layer.q_proj(x), layer.num_heads)  # (B, h, T, d)
    k = mc.split_heads(layer.k_proj(x), layer.num_kv_heads)  # (B, h_kv, T, d)
    v = mc.split_heads(layer.v_proj(x), layer.num_kv_heads)
    k_all, v_all = write_kv(k_cache, v_cache, k, v, length)
    mask = mc.causal_mask(T, length + T)
    out, _ = mc.scaled_dot_product_attention(
        q, mc.repeat_kv(k_all, layer.n_rep), mc.repeat_kv(v_all, layer.n_rep), mask
    )
    return layer.o_proj(mc.merge_heads(out))


def with_enable_gqa(layer, x, k_cache, v_cache, length):
    B, T, _ = x.shape
    hd, end = layer.head_dim, length + x.shape[1]
    q = layer.q_proj(x).view(B, T, layer.num_heads, hd).transpose(1, 2)
    k_cache[:, :, length:end] = layer.k_proj(x).view(B, T, layer.num_kv_heads, hd).transpose(1, 2)
    v_cache[:, :, length:end] = layer.v_proj(x).view(B, T, layer.num_kv_heads, hd).transpose(1, 2)
    keep = torch.arange(end)[None, :] <= torch.arange(length, end)[:, None]  # (T, end), bottom-right
    out = F.scaled_dot_product_attention(
        q, k_cache[:, :, :end], v_cache[:, :, :end], attn_mask=keep, enable_gqa=layer.n_rep > 1
    )
    return layer.o_proj(out.transpose(1, 2).reshape(B, T, -1))


def head_by_head(layer, x, k_cache, v_cache, length):
    B, T, _ = x.shape
    hd, end = layer.head_dim, length + T
    q = layer.q_proj(x).unflatten(-1, (layer.num_heads, hd))  # (B, T, h, d)
    k_cache[:, :, length:end] = layer.k_proj(x).unflatten(-1, (layer.num_kv_heads, hd)).transpose(1, 2)
    v_cache[:, :, length:end] = layer.v_proj(x).unflatten(-1, (layer.num_kv_heads, hd)).transpose(1, 2)
    blocked = torch.ones(T, end, dtype=torch.bool).triu(diagonal=length + 1)
    heads = []
    for i in range(layer.num_heads):
        kv = i // layer.n_rep
        scores = q[:, :, i] @ k_cache[:, kv, :end].transpose(-2, -1) / math.sqrt(hd)  # (B, T, end)
        heads.append(scores.masked_fill(blocked, float("-inf")).softmax(-1) @ v_cache[:, kv, :end])
    return layer.o_proj(torch.cat(heads, dim=-1))


@pytest.mark.parametrize("fn", [with_course_functions, with_enable_gqa, head_by_head])
def test_correct_variants_pass(fn):
    result = mc.check.cached_gqa_attention(fn)
    assert result.passed, result


def test_reference_is_the_uncached_layer_and_its_projections():
    x = torch.randn(2, 5, cached_gqa.D_MODEL)
    out, k_buf, v_buf = cached_gqa._one_causal_pass(x, [5], 7, 4, 2)
    layer = cached_gqa._layer(4, 2)
    full = torch.stack([layer(x[:, : t + 1])[0][:, t] for t in range(5)], dim=1)  # each prefix, no mask
    torch.testing.assert_close(out, full)
    assert torch.equal(k_buf[:, :, 5:], torch.zeros(2, 2, 2, cached_gqa.HEAD_DIM))
    torch.testing.assert_close(v_buf[:, 1, :5], layer.v_proj(x)[..., cached_gqa.HEAD_DIM :])


def repeat_tiled(layer, x, k_cache, v_cache, length):
    T = x.shape[1]
    q, k, v = (
        mc.split_heads(p(x), n)
        for p, n in (
            (layer.q_proj, layer.num_heads),
            (layer.k_proj, layer.num_kv_heads),
            (layer.v_proj, layer.num_kv_heads),
        )
    )
    k_all, v_all = write_kv(k_cache, v_cache, k, v, length)
    k_all, v_all = k_all.repeat(1, layer.n_rep, 1, 1), v_all.repeat(1, layer.n_rep, 1, 1)
    out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mc.causal_mask(T, length + T))
    return layer.o_proj(mc.merge_heads(out))


def _variant(**kwargs):
    return lambda *args: cached_gqa._step(*args, **kwargs)


def no_causal_mask(layer, x, k_cache, v_cache, length):  # SDPA without any mask
    q, k, v = (
        mc.split_heads(p(x), n)
        for p, n in (
            (layer.q_proj, layer.num_heads),
            (layer.k_proj, layer.num_kv_heads),
            (layer.v_proj, layer.num_kv_heads),
        )
    )
    k_all, v_all = write_kv(k_cache, v_cache, k, v, length)
    out = F.scaled_dot_product_attention(q, k_all, v_all, enable_gqa=layer.n_rep > 1)
    return layer.o_proj(mc.merge_heads(out))


def top_left(layer, x, k_cache, v_cache, length):  # SDPA's is_causal=True is top-left
    q, k, v = (
        mc.split_heads(p(x), n)
        for p, n in (
            (layer.q_proj, layer.num_heads),
            (layer.k_proj, layer.num_kv_heads),
            (layer.v_proj, layer.num_kv_heads),
        )
    )
    k_all, v_all = write_kv(k_cache, v_cache, k, v, length)
    out = F.scaled_dot_product_attention(q, k_all, v_all, is_causal=True, enable_gqa=layer.n_rep > 1)
    return layer.o_proj(mc.merge_heads(out))


MISTAKES = {
    "repeat": (repeat_tiled, ".repeat"),
    "no causal mask": (no_causal_mask, "attended to all of itself"),
    "top-left": (top_left, "aligned top-left"),
    "K only": (_variant(write="K only"), "only K was written"),
    "writes at 0": (_variant(write="at 0"), "written at position 0"),
    "whole buffer": (_variant(keys="whole buffer", mask="none"), "whole preallocated buffer"),
    "new only": (_variant(keys="new only"), "only to the new positions"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_each_mistake_is_named(mistake):
    fn, words = MISTAKES[mistake]
    result = mc.check.cached_gqa_attention(fn)
    assert not result.passed
    assert "likely mistake" in result.message and words in result.message, result


def test_not_attempted_and_not_callable():
    def todo(*args):
        raise NotImplementedError

    assert mc.check.cached_gqa_attention(todo).status == "not attempted"
    assert "expected your function" in mc.check.cached_gqa_attention("cached").message
