"""Checker for a grouped-query attention step with a preallocated KV cache, end to end
(``cached_gqa_attention``): project the new positions, write their K and V into the buffers,
attend over everything cached with the right causal mask, merge and project out.

The learner's step is run as a decoder runs it: a sequence is fed in chunks (a prompt, then
single positions, or a chunk of several after a prefix) through one GQA layer whose buffers are
preallocated. Compared with the reference: the outputs of all chunks against one causal pass
over the whole sequence, and both buffers after decoding against the layer's K and V
projections of the whole sequence (zeros in the unused tail).
"""

from __future__ import annotations

import torch

from ..gqa import GroupedQueryAttention, repeat_kv
from ..heads import merge_heads, split_heads
from ..i18n import tr
from ..kv_cache import write_kv
from ..masks import causal_mask
from .framework import Case, CheckResult, mistakes, run_check, tensor_generator
from .kv_cache import seeded_gqa_layer

__all__ = ["cached_gqa_attention"]

HEAD_DIM = 4
D_MODEL = 12


def _layer(num_heads: int, num_kv_heads: int) -> GroupedQueryAttention:
    return seeded_gqa_layer(D_MODEL, num_heads, num_kv_heads, HEAD_DIM, seed=77)


def _decoded_with(step):
    """(x, chunks, max_length, num_heads, num_kv_heads) -> (outputs, key buffer, value buffer):
    decode x chunk by chunk, every chunk through ``step(layer, x_new, k_cache, v_cache, length)``."""

    def run(x, chunks, max_length, num_heads, num_kv_heads):
        B = x.shape[0]
        layer = _layer(num_heads, num_kv_heads)
        k_cache = torch.zeros(B, num_kv_heads, max_length, HEAD_DIM)  # (B, h_kv, max_length, d_head)
        v_cache = torch.zeros(B, num_kv_heads, max_length, HEAD_DIM)
        outs, length = [], 0
        for n in chunks:
            outs.append(step(layer, x[:, length : length + n], k_cache, v_cache, length))  # (B, n, d_model)
            length += n
        return torch.cat(outs, dim=1), k_cache, v_cache

    return run


def _one_causal_pass(x, chunks, max_length, num_heads, num_kv_heads):
    """The reference, without any cache: one causal pass over the whole sequence; the buffers
    hold every position's K and V projections, then zeros."""
    B, L, _ = x.shape
    layer = _layer(num_heads, num_kv_heads)
    out, _ = layer(x, is_causal=True, need_weights=False)  # (B, L, d_model)
    buffers = []
    for proj in (layer.k_proj, layer.v_proj):
        buffer = torch.zeros(B, num_kv_heads, max_length, HEAD_DIM)
        buffer[:, :, :L] = split_heads(proj(x), num_kv_heads)  # (B, h_kv, L, d_head)
        buffers.append(buffer)
    return out, *buffers


def _step(layer, x, k_cache, v_cache, length, *, expand="interleave", mask="bottom-right", keys="filled", write="both"):
    """A cached GQA step, right by default; each keyword reproduces one known mistake."""
    T = x.shape[1]
    end = length + T
    q = split_heads(layer.q_proj(x), layer.num_heads)  # (B, h, T, d_head)
    k = split_heads(layer.k_proj(x), layer.num_kv_heads)  # (B, h_kv, T, d_head)
    v = split_heads(layer.v_proj(x), layer.num_kv_heads)
    if write == "at 0":
        k_cache[:, :, :T], v_cache[:, :, :T] = k, v
        k_all, v_all = k_cache[:, :, :end], v_cache[:, :, :end]
    elif write == "K only":
        k_cache[:, :, length:end] = k
        k_all, v_all = k_cache[:, :, :end], v_cache[:, :, :end]
    else:
        k_all, v_all = write_kv(k_cache, v_cache, k, v, length)  # (B, h_kv, end, d_head) views
    if keys == "whole buffer":
        k_all, v_all = k_cache, v_cache
    elif keys == "new only":
        k_all, v_all = k, v
    Lk = k_all.shape[2]
    if expand == "repeat":
        k_all, v_all = k_all.repeat(1, layer.n_rep, 1, 1), v_all.repeat(1, layer.n_rep, 1, 1)
    else:
        k_all, v_all = repeat_kv(k_all, layer.n_rep), repeat_kv(v_all, layer.n_rep)  # (B, h, Lk, d_head)
    allowed = {
        "bottom-right": causal_mask(T, Lk),
        "top-left": torch.ones(T, Lk, dtype=torch.bool).tril(),
        "none": None,
    }[mask]
    out = torch.nn.functional.scaled_dot_product_attention(q, k_all, v_all, attn_mask=allowed)  # (B, h, T, d_head)
    return layer.o_proj(merge_heads(out))  # (B, T, d_model)


CACHED_GQA_ATTENTION_MISTAKES = mistakes(
    "cached_gqa_attention",
    {
        "repeat": _decoded_with(lambda *a: _step(*a, expand="repeat")),
        "no causal mask": _decoded_with(lambda *a: _step(*a, mask="none")),
        "top-left": _decoded_with(lambda *a: _step(*a, mask="top-left")),
        "K only": _decoded_with(lambda *a: _step(*a, write="K only")),
        "writes at 0": _decoded_with(lambda *a: _step(*a, write="at 0")),
        "whole buffer": _decoded_with(lambda *a: _step(*a, keys="whole buffer", mask="none")),
        "new only": _decoded_with(lambda *a: _step(*a, keys="new only")),
    },
)

_SCHEDULES = [  # (B, chunks, max_length, num_heads, num_kv_heads, description)
    (2, [3, 1, 1, 1], 8, 4, 2, "prompt 3 + 3 steps, room for 8, 4 query heads over 2 K/V heads"),
    (1, [1, 1, 1, 1], 4, 4, 1, "one position at a time, buffers exactly full, MQA"),
    (2, [2, 3, 1], 10, 4, 4, "a chunk of 3 after a prefix of 2, MHA"),
    (1, [4, 2, 1], 9, 6, 2, "prompt 4, a chunk of 2, a step; groups of 3"),
]


def cached_gqa_attention(fn) -> CheckResult:
    """Check ``fn(layer, x, k_cache, v_cache, length) -> out``: ``layer`` a
    :class:`~mha_course.GroupedQueryAttention` (use its projections and head counts), x
    (B, T, d_model) the positions [length, length + T), k_cache and v_cache (B, h_kv,
    max_length, d_head) buffers whose positions [0, length) are filled. The new K/V go into the
    buffers in place; the queries attend causally over positions [0, length + T); out is
    (B, T, d_model). Checked by decoding in chunks against one causal pass."""
    if not callable(fn):
        return run_check("cached_gqa_attention", fn, [], _one_causal_pass)  # the framework's message
    g = tensor_generator()
    cases = [
        Case((torch.randn(B, sum(chunks), D_MODEL, generator=g), chunks, m, h, h_kv), description=text)
        for B, chunks, m, h, h_kv, text in _SCHEDULES
    ]
    return run_check(
        "cached_gqa_attention",
        _decoded_with(fn),
        cases,
        _one_causal_pass,
        CACHED_GQA_ATTENTION_MISTAKES,
        arg_names=("x", "chunks", "max_length", "num_heads", "num_kv_heads"),
        output_names=(
            tr("decoded outputs", "label"),
            tr("key buffer after decoding", "label"),
            tr("value buffer after decoding", "label"),
        ),
    )
