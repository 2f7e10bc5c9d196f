"""Checker for converting the course's masks into ``nn.MultiheadAttention``'s two mask arguments.

The learner's masks are judged by what they do: ``nn.MultiheadAttention`` runs with them and
must compute what the course's ``MultiHeadAttention`` computes with the course's mask (same
weights). So every spelling that means the same thing passes (bool True = blocked, an additive
float mask, ...).
"""

from __future__ import annotations

import warnings

import torch

from ..i18n import tr
from ..masks import causal_mask, padding_mask, sliding_window_mask
from ..multihead import MultiHeadAttention
from .framework import Case, CheckResult, mistakes, run_check, tensor_generator

__all__ = ["to_torch_masks"]

D_MODEL, NUM_HEADS = 8, 2


def _layers():
    g = tensor_generator(7)
    ours = MultiHeadAttention(D_MODEL, NUM_HEADS)
    with torch.no_grad():
        for p in ours.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return ours.eval(), ours.to_torch().eval()


def _empty_rows(mask, pad):
    """(B, Lq, 1): queries that may attend to no key under the course's mask & pad."""
    return ~(mask & pad)[:, 0].any(-1, keepdim=True)


def _through_torch(convert):
    """(x, mask, pad) -> nn.MultiheadAttention's output with the masks ``convert(mask, pad)`` gives."""

    def run(x, mask, pad):
        _, torch_mha = _layers()
        attn_mask, key_padding_mask = convert(mask.clone(), pad.clone())
        with warnings.catch_warnings():  # e.g. mixed bool / float masks: judged by the output alone
            warnings.simplefilter("ignore")
            out, _ = torch_mha(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False)
        return out.masked_fill(_empty_rows(mask, pad), 0.0)  # a query with nothing to see: 0, as in the course

    return run


def _course(x, mask, pad):
    ours, _ = _layers()
    out, _ = ours(x, mask=mask & pad)  # (B, L, d_model)
    return out.masked_fill(_empty_rows(mask, pad), 0.0)


TO_TORCH_MASKS_MISTAKES = mistakes(
    "to_torch_masks",
    {
        "not inverted": _through_torch(lambda mask, pad: (mask, pad[:, 0, 0])),
        "padding not inverted": _through_torch(lambda mask, pad: (~mask, pad[:, 0, 0])),
        "attn_mask not inverted": _through_torch(lambda mask, pad: (mask, ~pad[:, 0, 0])),
        "transposed": _through_torch(lambda mask, pad: (~mask.T, ~pad[:, 0, 0])),
    },
)


def to_torch_masks(fn) -> CheckResult:
    """Check ``fn(mask, pad) -> (attn_mask, key_padding_mask)``: the course's (L, L) mask and
    (B, 1, 1, L) padding mask (True = may attend / real token) converted into the two arguments of
    ``nn.MultiheadAttention`` ((L, L) and (B, L), True = blocked). Judged by running
    nn.MultiheadAttention with them against the course's MultiHeadAttention with ``mask & pad``."""
    g = tensor_generator()
    L = 5
    specs = [  # (the (L, L) mask, sequence lengths, description)
        (causal_mask(L), [5, 3], "causal, one sentence padded"),
        (sliding_window_mask(L, 3), [5, 4], "sliding window of 3, padding"),
        (torch.ones(L, L, dtype=torch.bool), [2, 5], "no restriction, only padding"),
    ]
    cases = [
        Case((torch.randn(2, L, D_MODEL, generator=g), mask, padding_mask(lengths, L)), description=text)
        for mask, lengths, text in specs
    ]
    return run_check(
        "to_torch_masks",
        _through_torch(fn) if callable(fn) else fn,
        cases,
        _course,
        TO_TORCH_MASKS_MISTAKES,
        arg_names=("x", "mask", "pad"),
        output_label=tr("nn.MultiheadAttention's output with your masks", "label"),
    )
