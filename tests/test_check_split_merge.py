"""The attend_in_heads checker (notebook 04, exercise 4.1): correct splits and merges of several
kinds pass, each known wrong pair is named, against a reference computed here head by head."""

import math

import pytest
import torch
import torch.nn.functional as F

import mha_course as mc
from mha_course.check import split_merge


def by_view(q, k, v, num_heads):
    B, Lq, D = q.shape
    q, k, v = (t.view(B, t.shape[1], num_heads, D // num_heads).transpose(1, 2) for t in (q, k, v))
    out, _ = mc.scaled_dot_product_attention(q, k, v)  # (B, h, Lq, d_head)
    return out.transpose(1, 2).reshape(B, Lq, D)


def by_einsum(q, k, v, num_heads):
    B, Lq, D = q.shape
    hd = D // num_heads
    qh, kh, vh = (t.unflatten(-1, (num_heads, hd)) for t in (q, k, v))  # (B, L, h, d_head)
    w = torch.einsum("bqhd,bkhd->bhqk", qh, kh).div(math.sqrt(hd)).softmax(-1)
    return torch.einsum("bhqk,bkhd->bqhd", w, vh).flatten(2)  # (B, Lq, h*d_head)


def by_slices(q, k, v, num_heads):  # a loop over the heads' column blocks
    hd = q.shape[-1] // num_heads
    outs = []
    for i in range(num_heads):
        cols = slice(i * hd, (i + 1) * hd)
        outs.append(F.scaled_dot_product_attention(q[..., cols], k[..., cols], v[..., cols]))
    return torch.cat(outs, dim=-1)


@pytest.mark.parametrize("fn", [by_view, by_einsum, by_slices])
def test_correct_variants_pass(fn):
    result = mc.check.attend_in_heads(fn)
    assert result.passed, result


def test_reference_is_per_head_attention_on_column_blocks():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, L, 12, generator=g) for L in (3, 5, 5))
    torch.testing.assert_close(split_merge._reference(q, k, v, 3), by_slices(q, k, v, 3))


def no_transpose(q, k, v, h):
    B, Lq, D = q.shape
    qh, kh, vh = (t.reshape(B, h, t.shape[1], D // h) for t in (q, k, v))
    return mc.scaled_dot_product_attention(qh, kh, vh)[0].reshape(B, Lq, D)


def merge_no_transpose(q, k, v, h):
    B, Lq, D = q.shape
    return mc.scaled_dot_product_attention(*(mc.split_heads(t, h) for t in (q, k, v)))[0].reshape(B, Lq, D)


def merge_wrong_dims(q, k, v, h):
    B, Lq, D = q.shape
    out = mc.scaled_dot_product_attention(*(mc.split_heads(t, h) for t in (q, k, v)))[0]
    return out.transpose(-2, -1).reshape(B, Lq, D)


def interleaved(q, k, v, h):
    B, Lq, D = q.shape
    cut = [t.reshape(B, t.shape[1], D // h, h).permute(0, 3, 1, 2) for t in (q, k, v)]
    return mc.scaled_dot_product_attention(*cut)[0].permute(0, 2, 3, 1).reshape(B, Lq, D)


def scale_d_model(q, k, v, h):
    out, _ = mc.scaled_dot_product_attention(*(mc.split_heads(t, h) for t in (q, k, v)), scale=q.shape[-1] ** -0.5)
    return mc.merge_heads(out)


def no_scale(q, k, v, h):
    return mc.merge_heads(mc.scaled_dot_product_attention(*(mc.split_heads(t, h) for t in (q, k, v)), scale=1.0)[0])


MISTAKES = {
    "no transpose": (no_transpose, "band of consecutive tokens"),
    "merge no transpose": (merge_no_transpose, "the split is right, but the merge"),
    "merge wrong dims": (merge_wrong_dims, "transposes the wrong pair"),
    "interleaved": (interleaved, "every h-th feature"),
    "scale d_model": (scale_d_model, "√(h·d_head)"),
    "no scale": (no_scale, "not scaled"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_each_mistake_is_named(mistake):
    fn, words = MISTAKES[mistake]
    result = mc.check.attend_in_heads(fn)
    assert not result.passed
    assert "likely mistake" in result.message and words in result.message, result


def test_not_attempted_and_not_callable_and_raising():
    def todo(q, k, v, h):
        raise NotImplementedError

    assert mc.check.attend_in_heads(todo).status == "not attempted"
    assert "expected your function" in mc.check.attend_in_heads(None).message

    def crashes(q, k, v, h):
        return q @ k  # (B, Lq, D) @ (B, Lk, D): a shape error

    result = mc.check.attend_in_heads(crashes)
    assert not result.passed and "raised" in result.message
