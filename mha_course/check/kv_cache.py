"""Checker for the update step of a preallocated KV cache (``write_kv``).

The learner's function is run where it lives in a decoder: a grouped-query attention layer
decodes a sequence (a prompt, then one position per step) with a cache whose buffers are
preallocated, and every update goes through the learner's function. What is compared with the
reference: the decoded outputs (against one full causal pass over the whole sequence — full
recomputation), the key buffer after decoding (the new keys written in place, the unused tail
untouched) and whether the returned tensors are views of the buffers.
"""

from __future__ import annotations

import torch

from ..gqa import GroupedQueryAttention
from ..i18n import tr
from ..kv_cache import KVCache
from .framework import Case, CheckResult, mistakes, run_check, tensor_generator

__all__ = ["write_kv"]

NUM_HEADS = 4  # query heads of the layer the checker decodes with
HEAD_DIM = 4


def seeded_gqa_layer(d_model: int, num_heads: int, num_kv_heads: int, head_dim: int, seed: int):
    """The same random GQA layer for every run of a case (weights from its own seeded generator)."""
    g = tensor_generator(seed)
    layer = GroupedQueryAttention(d_model, num_heads, num_kv_heads, head_dim=head_dim)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return layer


def _layer(d_model: int, num_kv_heads: int) -> GroupedQueryAttention:
    return seeded_gqa_layer(d_model, NUM_HEADS, num_kv_heads, HEAD_DIM, seed=99)


class _ThroughFunction(KVCache):
    """A KVCache whose every update goes through ``write(k_cache, v_cache, k, v, length)``."""

    def __init__(self, write, k_cache, v_cache):
        super().__init__()
        self.write, self.k_cache, self.v_cache = write, k_cache, v_cache
        self.filled = 0
        self.all_views = True

    def update(self, k, v):
        k_all, v_all = self.write(self.k_cache, self.v_cache, k, v, self.filled)
        self.filled += k.shape[2]
        for got, buffer in ((k_all, self.k_cache), (v_all, self.v_cache)):
            self.all_views &= isinstance(got, torch.Tensor) and (
                got.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
            )
        return k_all, v_all


def _decoded_with(write):
    """A function (x, prompt_len, max_length, num_kv_heads) -> (decoded outputs, key buffer,
    returned views): decode x through a cache whose updates call ``write``."""

    def run(x, prompt_len, max_length, num_kv_heads):
        B, L, d_model = x.shape
        layer = _layer(d_model, num_kv_heads)
        k_cache = torch.zeros(B, num_kv_heads, max_length, HEAD_DIM)  # (B, h_kv, max_length, d_head)
        v_cache = torch.zeros(B, num_kv_heads, max_length, HEAD_DIM)
        cache = _ThroughFunction(write, k_cache, v_cache)
        outs = []
        for start, end in [(0, prompt_len)] + [(t, t + 1) for t in range(prompt_len, L)]:
            out, _ = layer(x[:, start:end], cache=cache, is_causal=end - start > 1, need_weights=False)
            outs.append(out)
        return torch.cat(outs, dim=1), k_cache, torch.tensor(cache.all_views)

    return run


def _full_recomputation(x, prompt_len, max_length, num_kv_heads):
    """The reference, independent of any cache: one causal pass over the whole sequence; the key
    buffer holds every position's key projection, then zeros; views: True."""
    B, L, d_model = x.shape
    layer = _layer(d_model, num_kv_heads)
    out, _ = layer(x, is_causal=True, need_weights=False)  # (B, L, d_model)
    keys = layer.k_proj(x).view(B, L, num_kv_heads, HEAD_DIM).transpose(1, 2)  # (B, h_kv, L, d_head)
    k_cache = torch.zeros(B, num_kv_heads, max_length, HEAD_DIM)
    k_cache[:, :, :L] = keys
    return out, k_cache, torch.tensor(True)


def _copies(k_cache, v_cache, k, v, length):
    end = length + k.shape[2]
    k_cache[:, :, length:end], v_cache[:, :, length:end] = k, v
    return k_cache[:, :, :end].clone(), v_cache[:, :, :end].clone()


def _concatenates(k_cache, v_cache, k, v, length):
    return torch.cat([k_cache[:, :, :length], k], dim=2), torch.cat([v_cache[:, :, :length], v], dim=2)


def _whole_buffer(k_cache, v_cache, k, v, length):
    end = length + k.shape[2]
    k_cache[:, :, length:end], v_cache[:, :, length:end] = k, v
    return k_cache, v_cache


def _writes_at_start(k_cache, v_cache, k, v, length):
    n = k.shape[2]
    k_cache[:, :, :n], v_cache[:, :, :n] = k, v
    return k_cache[:, :, : length + n], v_cache[:, :, : length + n]


def _only_new(k_cache, v_cache, k, v, length):
    end = length + k.shape[2]
    k_cache[:, :, length:end], v_cache[:, :, length:end] = k, v
    return k_cache[:, :, length:end], v_cache[:, :, length:end]


#: the likely mistakes, as data: (name, what the wrong function does, the diagnosis)
WRITE_KV_MISTAKES = mistakes(
    "write_kv",
    {
        "copies": _decoded_with(_copies),
        "concatenates": _decoded_with(_concatenates),
        "whole buffer": _decoded_with(_whole_buffer),
        "writes at 0": _decoded_with(_writes_at_start),
        "only new": _decoded_with(_only_new),
    },
)


def write_kv(fn) -> CheckResult:
    """Check ``fn(k_cache, v_cache, k, v, length) -> (k_all, v_all)``: k_cache, v_cache are
    (B, h_kv, max_length, d_head) buffers whose positions [0, length) are filled; k, v are the
    new (B, h_kv, L_new, d_head). The new K/V go into the buffers at [length, length + L_new), in
    place, and the function returns views of the filled part, (B, h_kv, length + L_new, d_head).

    The check decodes sequences with a grouped-query layer whose cache calls ``fn`` and compares
    the outputs with one causal pass over the whole sequence."""
    if not callable(fn):
        return run_check("write_kv", fn, [], _full_recomputation)  # the framework's message for a non-function
    g = tensor_generator()
    shapes = [  # (B, L, prompt_len, max_length, num_kv_heads, description)
        (2, 6, 3, 8, 2, "prompt 3 + 3 steps, room for 8, 2 K/V heads"),
        (1, 5, 1, 5, 1, "one-token prompt + 4 steps, buffers exactly full, MQA"),
        (3, 7, 4, 12, 4, "prompt 4 + 3 steps, room for 12, 4 K/V heads (MHA)"),
    ]
    cases = [
        Case((torch.randn(B, L, 8, generator=g), p, m, h_kv), description=text) for B, L, p, m, h_kv, text in shapes
    ]
    return run_check(
        "write_kv",
        _decoded_with(fn),
        cases,
        _full_recomputation,
        WRITE_KV_MISTAKES,
        arg_names=("x", "prompt_len", "max_length", "num_kv_heads"),
        output_names=(
            tr("decoded outputs", "label"),
            tr("key buffer after decoding", "label"),
            tr("returned views of the buffers", "label"),
        ),
    )
