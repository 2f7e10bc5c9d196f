"""Checker for notebook 02's looped exercise: multi-head attention from per-head weight matrices."""

from __future__ import annotations

import math

import torch

from .framework import Case, CheckResult, Mistake, run_check, tensor_generator

__all__ = ["multi_head_attention_per_head"]


def _variant(x, w_q, w_k, w_v, w_o, *, scale="head", dim=-1, out_proj=True, shared=False, joint=False, order=None):
    """The per-head formula with one deliberate change (x (B, L, d_model), w_q/w_k/w_v (h, d_model, d_head),
    w_o (h*d_head, d_model)).

    scale: head (√d_head) | model (√d_model) | none;  shared: every head uses head 0's weights;
    joint: one softmax over the keys of all heads together;  order: the heads' order in the concat.
    """
    h, d_model, d_head = w_q.shape
    if shared:
        w_q, w_k, w_v = (w[:1].expand(h, -1, -1) for w in (w_q, w_k, w_v))
    q, k, v = (torch.einsum("bld,hde->bhle", x, w) for w in (w_q, w_k, w_v))  # (B, h, L, d_head)
    s = {"head": 1 / math.sqrt(d_head), "model": 1 / math.sqrt(d_model), "none": 1.0}[scale]
    scores = q @ k.transpose(-2, -1) * s  # (B, h, L, L)
    if joint:  # softmax over (head, key) pairs: the heads share one unit of attention
        B, _, L, _ = scores.shape
        weights = torch.softmax(scores.transpose(1, 2).reshape(B, L, -1), dim=-1)
        weights = weights.reshape(B, L, h, L).transpose(1, 2)
    else:
        weights = torch.softmax(scores, dim=dim)
    heads = weights @ v  # (B, h, L, d_head)
    order = range(h) if order is None else order
    concat = torch.cat([heads[:, i] for i in order], dim=-1)  # (B, L, h*d_head)
    return concat @ w_o if out_proj else concat


def _reference(x, w_q, w_k, w_v, w_o):
    outs = []
    for wq, wk, wv in zip(w_q, w_k, w_v, strict=True):  # one head at a time, on the whole sequence
        q, k, v = x @ wq, x @ wk, x @ wv  # (B, L, d_head)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)  # (B, L, L)
        outs.append(weights @ v)
    return torch.cat(outs, dim=-1) @ w_o  # (B, L, h*d_head) @ (h*d_head, d_model)


def _cases() -> list[Case]:
    g = tensor_generator()

    def case(B, L, d_model, h, d_head, description):
        x = torch.randn(B, L, d_model, generator=g)
        w_q, w_k, w_v = (torch.randn(h, d_model, d_head, generator=g) / math.sqrt(d_model) * 2 for _ in range(3))
        w_o = torch.randn(h * d_head, d_model, generator=g) / math.sqrt(h * d_head)
        return Case((x, w_q, w_k, w_v, w_o), description=description)

    return [
        case(2, 5, 8, 2, 4, "B=2, L=5, d_model=8, 2 heads of width 4"),
        case(1, 6, 12, 3, 4, "3 heads"),
        case(2, 4, 6, 3, 4, "h·d_head=12 ≠ d_model=6"),
        case(3, 3, 5, 1, 5, "one head"),
    ]


MULTI_HEAD_ATTENTION_PER_HEAD_MISTAKES = [
    Mistake(
        "scale √d_model",
        lambda *a: _variant(*a, scale="model"),
        "scaled the scores by √d_model instead of √d_head: each head's dot products have only d_head terms",
    ),
    Mistake("no scale", lambda *a: _variant(*a, scale="none"), "forgot to divide each head's scores by √d_head"),
    Mistake(
        "softmax dim -2",
        lambda *a: _variant(*a, dim=-2),
        "softmax over the wrong axis (dim=-2, across queries): normalise each query's scores over the keys",
    ),
    Mistake(
        "joint softmax",
        lambda *a: _variant(*a, joint=True),
        "one softmax across all heads together: each head needs its own softmax over the keys, so that "
        "every head has a full unit of attention",
    ),
    Mistake(
        "shared weights",
        lambda *a: _variant(*a, shared=True),
        "every head used head 0's matrices: head i must project with its own w_q[i], w_k[i], w_v[i]",
    ),
    Mistake(
        "no W_O",
        lambda *a: _variant(*a, out_proj=False),
        "forgot the output projection: multiply the concatenated heads by w_o",
    ),
    Mistake(
        "reversed order",
        lambda *a: _variant(*a, order=range(a[1].shape[0] - 1, -1, -1)),
        "the heads are concatenated in the wrong order: head 0 first, head h-1 last (w_o's row block i reads head i)",
    ),
]


def multi_head_attention_per_head(fn) -> CheckResult:
    """Check ``fn(x, w_q, w_k, w_v, w_o) -> out`` (self-attention, no mask, no biases).

    x (B, L, d_model); w_q, w_k, w_v (h, d_model, d_head): head i projects with ``x @ w_q[i]``;
    w_o (h·d_head, d_model); out (B, L, d_model). h·d_head need not equal d_model (one case
    differs). A loop over heads, einsum, or stacking the heads all pass.
    """
    return run_check(
        "multi_head_attention_per_head",
        fn,
        _cases(),
        _reference,
        MULTI_HEAD_ATTENTION_PER_HEAD_MISTAKES,
        arg_names=("x", "w_q", "w_k", "w_v", "w_o"),
        output_label="out",
    )
