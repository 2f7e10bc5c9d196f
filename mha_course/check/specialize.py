"""Checker for notebook 07's exercise: remove (ablate) heads from a multi-head attention output."""

from __future__ import annotations

import torch

from .framework import Case, CheckResult, Mistake, run_check, tensor_generator

__all__ = ["ablate_heads"]


def _variant(head_outputs, w_o, b_o, heads, *, how=None):
    """The ablation with one deliberate change (see the Mistake list); how=None is the reference.

    head_outputs (B, h, L, d_head); w_o (d_model, h·d_head) as nn.Linear stores it; b_o (d_model,).
    """
    B, h, L, d_head = head_outputs.shape
    keep = torch.ones(h)
    keep[list(heads)] = 0.0
    if how == "inverted":
        keep = 1.0 - keep
    if how == "rescaled" and keep.sum() > 0:
        keep = keep * h / keep.sum()
    kept = head_outputs * keep[None, :, None, None] if how != "after W_O" else head_outputs
    if how == "no transpose":
        concat = kept.reshape(B, L, h * d_head)  # mixes tokens into heads
    elif how == "interleaved":
        concat = kept.permute(0, 2, 3, 1).reshape(B, L, h * d_head)
    else:
        concat = kept.transpose(1, 2).reshape(B, L, h * d_head)  # (B, L, h·d_head): head i = block i
    if how == "strided":  # zeroed every h-th column instead of head i's block
        concat = head_outputs.transpose(1, 2).reshape(B, L, h * d_head).clone()
        for i in heads:
            concat[..., i::h] = 0.0
    out = concat @ (w_o if how == "no .T" else w_o.T)
    if how == "after W_O":  # zeroed the output features [i·d_head, (i+1)·d_head) instead
        out = out.clone()
        for i in heads:
            out[..., i * d_head : (i + 1) * d_head] = 0.0
    if how == "no bias":
        return out
    return out + b_o


def _reference(head_outputs, w_o, b_o, heads):
    return _variant(head_outputs, w_o, b_o, heads)


def _cases() -> list[Case]:
    g = tensor_generator()

    def case(B, h, L, d_head, d_model, heads, description):
        head_outputs = torch.randn(B, h, L, d_head, generator=g)
        w_o = torch.randn(d_model, h * d_head, generator=g) / (h * d_head) ** 0.5
        b_o = torch.randn(d_model, generator=g)
        return Case((head_outputs, w_o, b_o, heads), description=description)

    return [
        case(2, 3, 5, 4, 12, [1], "3 heads of width 4, remove head 1"),
        case(1, 4, 3, 2, 8, [0, 2], "4 heads, remove heads 0 and 2"),
        case(2, 2, 4, 3, 5, [1], "d_model=5 ≠ h·d_head=6"),
        case(1, 3, 2, 2, 6, [], "remove nothing"),
        case(2, 2, 3, 4, 8, [0, 1], "remove every head"),
    ]


ABLATE_HEADS_MISTAKES = [
    Mistake(
        "inverted",
        lambda *a: _variant(*a, how="inverted"),
        "you kept the heads listed in `heads` and removed the others: `heads` lists the heads to remove",
    ),
    Mistake(
        "no bias",
        lambda *a: _variant(*a, how="no bias"),
        "the bias b_o is missing: removing heads leaves W_O's bias in place (add b_o after the projection)",
    ),
    Mistake(
        "rescaled",
        lambda *a: _variant(*a, how="rescaled"),
        "you rescaled the kept heads (by h / number kept, as dropout does): ablation only sets the removed "
        "heads to zero and leaves the others as they are",
    ),
    Mistake(
        "no transpose",
        lambda *a: _variant(*a, how="no transpose"),
        "reshape without transpose: (B, h, L, d_head) reshaped straight to (B, L, h·d_head) mixes tokens "
        "into heads — transpose(1, 2) first (or use mc.merge_heads)",
    ),
    Mistake(
        "interleaved",
        lambda *a: _variant(*a, how="interleaved"),
        "the heads are interleaved feature by feature: head i's output belongs in the contiguous columns "
        "[i·d_head, (i+1)·d_head) of the concatenation — transpose(1, 2), then reshape",
    ),
    Mistake(
        "strided",
        lambda *a: _variant(*a, how="strided"),
        "you zeroed every h-th column (i::h); head i owns the contiguous block [i·d_head, (i+1)·d_head) of the "
        "concatenation",
    ),
    Mistake(
        "after W_O",
        lambda *a: _variant(*a, how="after W_O"),
        "you zeroed output features after W_O; W_O mixes all heads into every output feature, so remove the "
        "head from its input (the concatenation) before the projection",
    ),
    Mistake(
        "no .T",
        lambda *a: _variant(*a, how="no .T"),
        "w_o is stored as nn.Linear stores it, (d_model, h·d_head): project with concat @ w_o.T",
    ),
]


def ablate_heads(fn) -> CheckResult:
    """Check ``fn(head_outputs, w_o, b_o, heads) -> out``: the layer output with some heads removed.

    head_outputs (B, h, L, d_head): each head's ``weights @ V``; w_o (d_model, h·d_head) and b_o
    (d_model,): the output projection as ``nn.Linear`` stores it (out = concat @ w_o.T + b_o);
    heads: list of the head indices to remove. Returns (B, L, d_model), equal to the layer's
    output computed with the removed heads' outputs set to zero.
    """
    return run_check(
        "ablate_heads",
        fn,
        _cases(),
        _reference,
        ABLATE_HEADS_MISTAKES,
        arg_names=("head_outputs", "w_o", "b_o", "heads"),
        output_label="out",
    )
