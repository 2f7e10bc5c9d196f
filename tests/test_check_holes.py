"""Mistakes the checkers of notebooks 01–05 name besides their main lists: scaling by √d_v (1.1,
5.3), a strided split merged into column blocks (2.2), W_O without its bias (3.1) and a split of k
and v with the queries' length (4.1) — each written here independently and diagnosed by name."""

import math

import torch
import torch.nn.functional as F

import mha_course as mc


def test_sdpa_scaled_by_the_value_width_is_named():
    def by_dv(q, k, v, mask=None):
        s = q @ k.transpose(-2, -1) / math.sqrt(v.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = s.softmax(-1)
        return w @ v, w

    result = mc.check.scaled_dot_product_attention(by_dv)
    assert not result.passed and "√d_v" in result.message, result


def test_cross_attention_scaled_by_the_value_width_is_named():
    def by_dv(target, source, source_lengths, w_q, w_k, w_v):
        q, k, v = target @ w_q, source @ w_k, source @ w_v
        s = q @ k.transpose(-2, -1) / math.sqrt(v.shape[-1])
        real = torch.arange(source.shape[1])[None, :] < source_lengths[:, None]  # (B, Ls)
        w = s.masked_fill(~real[:, None, :], float("-inf")).softmax(-1)
        return w @ v, w

    result = mc.check.cross_attention(by_dv)
    assert not result.passed and "√d_v" in result.message, result


def test_a_strided_split_merged_into_column_blocks_is_named():
    def strided(x, w_q, w_k, w_v, w_o, num_heads):
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        outs = []
        for i in range(num_heads):  # head i takes columns i, i + h, i + 2h, …
            cols = slice(i, None, num_heads)
            outs.append(F.scaled_dot_product_attention(q[..., cols], k[..., cols], v[..., cols]))
        return torch.cat(outs, dim=-1) @ w_o  # … and its output goes into block i

    result = mc.check.multi_head_attention(strided)
    assert not result.passed and "every num_heads-th column" in result.message, result


def test_a_count_without_the_output_bias_is_named():
    def no_out_bias(d_model, num_heads, num_kv_heads=None, bias=True):
        kv = (num_kv_heads or num_heads) * (d_model // num_heads)
        return 2 * d_model * d_model + 2 * d_model * kv + ((d_model + 2 * kv) if bias else 0)

    result = mc.check.count_attention_params(no_out_bias)
    assert not result.passed and "W_O's bias is missing" in result.message, result


def test_a_split_with_the_queries_length_is_named():
    def queries_length(q, k, v, num_heads):
        B, Lq, d = q.shape
        q, k, v = (t.view(B, Lq, num_heads, d // num_heads).transpose(1, 2) for t in (q, k, v))
        out, _ = mc.scaled_dot_product_attention(q, k, v)
        return out.transpose(1, 2).reshape(B, Lq, d)

    result = mc.check.attend_in_heads(queries_length)
    assert not result.passed and "queries' length" in result.message, result
