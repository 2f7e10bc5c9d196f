"""Checker for single-head cross-attention (``cross_attention``), in two stages.

1. The function itself, on fixed inputs: queries from the target, keys and values from the
   source (Lt ≠ Ls, the encoder and decoder widths differ in the last case), the source's
   padding keys blocked, no causal mask; out and weights compared with the reference.
2. What it learns: a tiny model whose cross-attention is the learner's function is trained to
   output the source reversed (``mha_course.lessons.reorder_task``, a fraction of a second), and
   the trained weights must put each target slot on its mirrored source position. A function
   that is right on fixed inputs but cuts the gradient (``detach``, ``no_grad``, numpy) fails here.
"""

from __future__ import annotations

import math

import torch

from ..i18n import tr, verdict
from ..lessons import reorder_task
from ..masks import causal_mask
from .framework import VERDICTS, Case, CheckResult, _one_line, mistakes, run_check, tensor_generator

__all__ = ["cross_attention"]

#: a trained slot must put more than this share of its weight on its mirrored source position
MIN_WEIGHT = 0.9

_CASES = [  # (B, Lt, Ls, d_tgt, d_src, d_k, d_v, source lengths, description)
    (2, 4, 6, 8, 8, 5, 3, [6, 3], "Lt=4 over Ls=6, one source padded"),
    (1, 5, 3, 6, 6, 4, 4, [3], "Lt=5 over Ls=3, no padding"),
    (3, 3, 5, 4, 4, 2, 6, [5, 1, 4], "three sources, one of a single token"),
    (2, 4, 5, 6, 10, 3, 4, [5, 2], "decoder width 6, encoder width 10"),
]


def _attend(q, k, v, keep=None, *, scale=None, dim=-1):
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)  # (B, Lq, Lk)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = scores.softmax(dim=dim)  # (B, Lq, Lk); NaN where a whole softmax is blocked, as by hand
    return weights @ v, weights


def _keep(lengths, L):  # (B, 1, L), True = real token
    return (torch.arange(L)[None, :] < torch.as_tensor(lengths)[:, None])[:, None, :]


_reference = reorder_task.cross_attention  # q from the target, k/v from the source, padding blocked


def _swapped(target, source, lengths, w_q, w_k, w_v):
    # queries from the source, keys/values from the target (possible only when widths agree)
    return _attend(source @ w_q, target @ w_k, target @ w_v)


def _causal(target, source, lengths, w_q, w_k, w_v):
    Lt, Ls = target.shape[1], source.shape[1]
    tril = torch.ones(Lt, Ls, dtype=torch.bool).tril()  # a decoder's triangle, top-left
    return _attend(target @ w_q, source @ w_k, source @ w_v, _keep(lengths, Ls) & tril)


def _causal_bottom_right(target, source, lengths, w_q, w_k, w_v):
    Lt, Ls = target.shape[1], source.shape[1]
    return _attend(target @ w_q, source @ w_k, source @ w_v, _keep(lengths, Ls) & causal_mask(Lt, Ls))


def _no_padding(target, source, lengths, w_q, w_k, w_v):
    return _attend(target @ w_q, source @ w_k, source @ w_v)


def _four_d_mask(target, source, lengths, w_q, w_k, w_v):
    # mc.padding_mask's (B, 1, 1, Ls) against (B, Lt, Ls) scores broadcasts to (B, B, Lt, Ls)
    keep = _keep(lengths, source.shape[1])[:, None]  # (B, 1, 1, Ls)
    return _attend(target @ w_q, source @ w_k, source @ w_v, keep)


def _query_softmax(target, source, lengths, w_q, w_k, w_v):
    return _attend(target @ w_q, source @ w_k, source @ w_v, _keep(lengths, source.shape[1]), dim=-2)


def _scale_d_model(target, source, lengths, w_q, w_k, w_v):
    keep = _keep(lengths, source.shape[1])
    return _attend(target @ w_q, source @ w_k, source @ w_v, keep, scale=1 / math.sqrt(target.shape[-1]))


def _scale_d_v(target, source, lengths, w_q, w_k, w_v):
    keep = _keep(lengths, source.shape[1])
    return _attend(target @ w_q, source @ w_k, source @ w_v, keep, scale=1 / math.sqrt(w_v.shape[-1]))


def _no_scale(target, source, lengths, w_q, w_k, w_v):
    return _attend(target @ w_q, source @ w_k, source @ w_v, _keep(lengths, source.shape[1]), scale=1.0)


CROSS_ATTENTION_MISTAKES = mistakes(
    "cross_attention",
    {
        "swapped": _swapped,
        "causal": _causal,
        "causal bottom-right": _causal_bottom_right,
        "no padding mask": _no_padding,
        "4-D mask": _four_d_mask,
        "query softmax": _query_softmax,
        "scale d_model": _scale_d_model,
        "scale d_v": _scale_d_v,
        "no scale": _no_scale,
        # right values on fixed inputs, found only by training (stage 2): listed for its words
        "detached": lambda *args: tuple(t.detach() for t in _reference(*args)),
    },
)


def _cases() -> list[Case]:
    g = tensor_generator()
    cases = []
    for B, Lt, Ls, d_tgt, d_src, d_k, d_v, lengths, text in _CASES:
        target, source = torch.randn(B, Lt, d_tgt, generator=g), torch.randn(B, Ls, d_src, generator=g)
        w_q, w_k = torch.randn(d_tgt, d_k, generator=g), torch.randn(d_src, d_k, generator=g)
        w_v = torch.randn(d_src, d_v, generator=g)
        lengths = torch.tensor(lengths)
        cases.append(Case((target, source, lengths, w_q, w_k, w_v), description=text))
    return cases


def cross_attention(fn) -> CheckResult:
    """Check ``fn(target, source, source_lengths, w_q, w_k, w_v) -> (out, weights)``: target
    (B, Lt, d_tgt), source (B, Ls, d_src), source_lengths (B,) int, w_q (d_tgt, d_k), w_k
    (d_src, d_k), w_v (d_src, d_v); out (B, Lt, d_v), weights (B, Lt, Ls), padding keys 0.
    Then train it on the reversal task and check the alignment its weights learn."""
    result = run_check(
        "cross_attention",
        fn,
        _cases(),
        _reference,
        CROSS_ATTENTION_MISTAKES,
        arg_names=("target", "source", "source_lengths", "w_q", "w_k", "w_v"),
        output_names=("out", "weights"),
    )
    if not result.passed:
        return result
    try:
        model, _ = reorder_task.train(fn)
        learned = reorder_task.alignment(model, fn)
    except Exception as exc:  # noqa: BLE001 - report, never raise
        text = _one_line(f"{type(exc).__name__}: {exc}", 120)
        return CheckResult(
            False,
            tr(
                "cross_attention: right on fixed inputs, but training through it raised {error}",
                "check cross_attention",
                error=text,
            ),
            tr(
                "training computes gradients through your function: no in-place writes to its inputs",
                "check cross_attention",
            ),
        )
    slots = learned.slots
    if learned.aligned == slots and learned.weight_on_target > MIN_WEIGHT:
        return CheckResult(
            True,
            tr(
                "{verdict}; trained to reverse the source, every one of the {slots} target "
                "positions puts more than {weight:.0%} of its weight on its mirrored source position",
                "check cross_attention",
                verdict=verdict(result.message, VERDICTS),
                slots=slots,
                weight=MIN_WEIGHT,
            ),
        )
    return CheckResult(
        False,
        f"cross_attention: likely mistake — {CROSS_ATTENTION_MISTAKES[-1].diagnosis}",
        tr(
            "right on fixed inputs, but after training only {aligned} of {slots} target positions "
            "attend most to their mirrored source position (token accuracy {accuracy:.0%})",
            "check cross_attention",
            aligned=learned.aligned,
            slots=slots,
            accuracy=learned.accuracy,
        ),
    )
