"""Checker for a whole multi-head attention layer written by the learner: a class
``MultiHeadAttention(d_model, num_heads, bias=True)`` (an ``nn.Module`` with ``nn.Linear`` layers
``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``) whose ``forward(x, mask=None)`` is self-attention.

Each case builds a ``torch.nn.MultiheadAttention`` with fixed random weights, copies them into a
fresh instance of the learner's class (``in_proj_weight``'s three row blocks, ``out_proj``) and
compares the two outputs, with no mask, padding masks (B, 1, 1, L), causal masks (L, L) and both
combined (B, 1, L, L), True = may attend, on several widths and head counts, with and without
biases. PyTorch's module is the reference (its boolean masks mean True = blocked: the checker
inverts them for it). A layer that passes is then put through the leakage test of notebook 05
with a causal mask: noise added to the inputs after position t must leave every output at a
position <= t unchanged.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..i18n import tr, verdict
from .framework import VERDICTS, Case, CheckResult, call_learner, mistakes, run_check, tensor_generator, type_name

__all__ = ["multi_head_attention_layer"]

NAME = "multi_head_attention_layer"
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")
_LEAK_TOL = 1e-6  # a causal layer's past moves by exactly 0; a leak moves it by ~0.1


class _Weights:
    """The weights of one case: a ``torch.nn.MultiheadAttention(d_model, num_heads, bias)`` with
    fixed random parameters; its repr is what a failure message shows for the layer."""

    def __init__(self, d_model, num_heads, bias, number):
        self.d_model, self.num_heads, self.bias, self.number = d_model, num_heads, bias, number

    def torch_layer(self) -> nn.MultiheadAttention:
        m = nn.MultiheadAttention(self.d_model, self.num_heads, bias=self.bias, batch_first=True)
        g = tensor_generator(100 + self.number)
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        return m.eval()

    def tensors(self):
        """(w_q, w_k, w_v, w_o) in nn.Linear layout and (b_q, b_k, b_v, b_o) or four Nones."""
        m = self.torch_layer()
        weights = (*m.in_proj_weight.detach().chunk(3), m.out_proj.weight.detach())
        if not self.bias:
            return weights, (None,) * 4
        return weights, (*m.in_proj_bias.detach().chunk(3), m.out_proj.bias.detach())

    def __repr__(self):
        bias = "" if self.bias else ", bias=False"
        return f"MultiHeadAttention({self.d_model}, {self.num_heads}{bias}) with nn.MultiheadAttention's weights"


_CASES = [  # (d_model, num_heads, bias, B, L, mask kind, padded lengths, description); B != L
    (12, 3, True, 2, 5, None, None, "3 heads of width 4, no mask"),
    (12, 3, True, 2, 5, "padding", [3, 4], "padding mask (B, 1, 1, L)"),
    (8, 2, True, 2, 6, "causal", None, "causal mask (L, L)"),
    (16, 4, True, 3, 4, "both", [4, 2, 3], "causal & padding (B, 1, L, L)"),
    (8, 8, False, 1, 3, "causal", None, "no biases, 8 heads of width 1"),
    (6, 1, True, 2, 4, "padding", [2, 3], "one head"),
]


def _mask(kind, B, L, lengths):
    if kind is None:
        return None
    causal = torch.ones(L, L, dtype=torch.bool).tril()  # (L, L), True = may attend
    if kind == "causal":
        return causal
    real = (torch.arange(L) < torch.tensor(lengths)[:, None]).view(B, 1, 1, L)  # (B, 1, 1, L)
    return real if kind == "padding" else real & causal  # (B, 1, 1, L) or (B, 1, L, L)


def _reference(weights, x, mask):
    """torch.nn.MultiheadAttention with the case's weights; its bool masks mean True = blocked."""
    m = weights.torch_layer()
    attn_mask = None
    if mask is not None:
        B, L, _ = x.shape
        full = mask.expand(B, weights.num_heads, L, L).reshape(B * weights.num_heads, L, L)
        attn_mask = ~full
    out, _ = m(x, x, x, attn_mask=attn_mask, need_weights=False)
    return out  # (B, L, d_model)


def _variant(
    weights,
    x,
    mask,
    *,
    split="right",
    merge="right",
    scale="d_head",
    polarity="attend",
    in_bias=True,
    out_bias=True,
    out_proj=True,
    softmax_dim=-1,
    mask_after=False,
):
    """A layer written by hand, right or with one of the known mistakes."""
    (w_q, w_k, w_v, w_o), (b_q, b_k, b_v, b_o) = weights.tensors()
    B, L, d = x.shape
    h = weights.num_heads
    hd = d // h

    def project(w, b):
        return F.linear(x, w, b if in_bias else None)  # (B, L, d_model)

    def cut(t):  # (B, L, d) -> (B, h, L, d_head)
        if split == "no transpose":
            return t.reshape(B, h, L, hd)
        return t.view(B, L, h, hd).transpose(1, 2)

    q, k, v = cut(project(w_q, b_q)), cut(project(w_k, b_k)), cut(project(w_v, b_v))
    divisor = {"d_head": math.sqrt(hd), "d_model": math.sqrt(d), "none": 1.0}[scale]
    scores = q @ k.transpose(-2, -1) / divisor  # (B, h, L, L)
    if mask is not None and not mask_after:
        blocked = mask if polarity == "blocked" else ~mask
        scores = scores.masked_fill(blocked, -math.inf)
    w = scores.softmax(dim=softmax_dim)
    if mask is not None and mask_after:
        w = w * mask
    context = w @ v  # (B, h, L, d_head)
    if merge == "no transpose" or split == "no transpose":
        merged = context.reshape(B, L, d)
    else:
        merged = context.transpose(1, 2).reshape(B, L, d)  # (B, L, d_model)
    if not out_proj:
        return merged
    return F.linear(merged, w_o, b_o if (in_bias and out_bias) else None)  # (B, L, d_model)


def _wrong(**kwargs):
    return lambda weights, x, mask: _variant(weights, x, mask, **kwargs)


MULTI_HEAD_ATTENTION_LAYER_MISTAKES = mistakes(
    NAME,
    {
        "no transpose": _wrong(split="no transpose"),
        "merge no transpose": _wrong(merge="no transpose"),
        "scale d_model": _wrong(scale="d_model"),
        "no scale": _wrong(scale="none"),
        "mask inverted": _wrong(polarity="blocked"),
        "mask after softmax": _wrong(mask_after=True),
        "softmax over queries": _wrong(softmax_dim=-2),
        "biases not applied": _wrong(in_bias=False),
        "out_proj bias missing": _wrong(out_bias=False),
        "no out_proj": _wrong(out_proj=False),
    },
)


class _LayoutError(Exception):
    """The learner's class cannot take nn.MultiheadAttention's weights; the message says why."""


def _build(cls, weights):
    """A fresh instance of the learner's class holding ``weights``' parameters."""
    d, h, bias = weights.d_model, weights.num_heads, weights.bias
    try:
        layer = cls(d, h, bias=bias)
    except TypeError as exc:
        if "bias" in str(exc) or "argument" in str(exc):
            raise _LayoutError(
                tr(
                    "MultiHeadAttention({d}, {h}, bias={bias}) raised TypeError: {exc} — the class takes "
                    "(d_model, num_heads, bias=True)",
                    "check multi_head_attention_layer",
                    d=d,
                    h=h,
                    bias=bias,
                    exc=exc,
                )
            ) from exc
        raise
    if not isinstance(layer, nn.Module):
        raise _LayoutError(
            tr(
                "MultiHeadAttention({d}, {h}) is {what}, not a torch.nn.Module",
                "check multi_head_attention_layer",
                d=d,
                h=h,
                what=type_name(layer),
            )
        )
    (w_q, w_k, w_v, w_o), biases = weights.tensors()
    for name, w, b in zip(_PROJECTIONS, (w_q, w_k, w_v, w_o), biases, strict=True):
        proj = getattr(layer, name, None)
        if not isinstance(proj, nn.Linear):
            raise _LayoutError(
                tr(
                    "layer.{name} should be an nn.Linear, got {what}",
                    "check multi_head_attention_layer",
                    name=name,
                    what=type_name(proj),
                )
            )
        if tuple(proj.weight.shape) != tuple(w.shape):
            raise _LayoutError(
                tr(
                    "layer.{name}.weight has shape {got}, expected {expected} for d_model={d}",
                    "check multi_head_attention_layer",
                    name=name,
                    got=tuple(proj.weight.shape),
                    expected=tuple(w.shape),
                    d=d,
                )
            )
        if bias and proj.bias is None:
            raise _LayoutError(
                tr(
                    "bias missing — MultiHeadAttention({d}, {h}, bias=True) built layer.{name} without a bias: "
                    "every projection, W_O included, has one when bias=True",
                    "check multi_head_attention_layer",
                    d=d,
                    h=h,
                    name=name,
                )
            )
        if not bias and proj.bias is not None:
            raise _LayoutError(
                tr(
                    "MultiHeadAttention({d}, {h}, bias=False) built layer.{name} with a bias: pass the bias "
                    "argument on to the projections",
                    "check multi_head_attention_layer",
                    d=d,
                    h=h,
                    name=name,
                )
            )
        with torch.no_grad():
            proj.weight.copy_(w)
            if b is not None:
                proj.bias.copy_(b)
    return layer.eval()


def _first(y):
    return y[0] if isinstance(y, (tuple, list)) else y


def _learner(cls):
    def run(weights, x, mask):
        layer = _build(cls, weights)
        return _first(layer(x) if mask is None else layer(x, mask=mask))  # (B, L, d_model)

    return run


def _leakage(cls) -> float:
    """The largest change of an output at a position <= t when noise is added to the inputs
    after t, over every t, for the learner's layer with a causal mask (notebook 05's test)."""
    weights = _Weights(8, 2, True, 99)
    g = tensor_generator(7)
    L = 6
    x = torch.randn(2, L, 8, generator=g)
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    run = _learner(cls)
    base = call_learner(run, Case((weights, x, causal)))
    worst = 0.0
    for t in range(L - 1):
        changed = x.clone()
        changed[:, t + 1 :] += torch.randn(changed[:, t + 1 :].shape, generator=g)  # a new future after t
        out = call_learner(run, Case((weights, changed, causal)))
        worst = max(worst, (out[:, : t + 1] - base[:, : t + 1]).abs().max().item())
    return worst


def multi_head_attention_layer(cls) -> CheckResult:
    """Check ``cls``, a class ``MultiHeadAttention(d_model, num_heads, bias=True)`` (an nn.Module
    with nn.Linear layers q_proj, k_proj, v_proj, out_proj) whose ``forward(x, mask=None)`` maps
    x (B, L, d_model) to (B, L, d_model) (or a tuple starting with it); ``mask``: bool,
    broadcastable to (B, h, L, L), True = may attend. Compared with torch.nn.MultiheadAttention
    holding the same weights, then the leakage test with a causal mask."""
    if not isinstance(cls, type):
        return CheckResult(
            False,
            tr(
                "{name}: expected your class MultiHeadAttention itself, got {what}",
                "check multi_head_attention_layer",
                name=NAME,
                what=type_name(cls),
            ),
        )
    g = tensor_generator()
    cases = []
    for number, (d, h, bias, B, L, kind, lengths, text) in enumerate(_CASES):
        x = torch.randn(B, L, d, generator=g)
        cases.append(Case((_Weights(d, h, bias, number), x, _mask(kind, B, L, lengths)), description=text))
    try:
        call_learner(_learner(cls), cases[0])
    except _LayoutError as exc:
        return CheckResult(
            False,
            tr("{name}: {problem}", "check multi_head_attention_layer", name=NAME, problem=exc),
            f"case 1 of {len(cases)}: {cases[0].description}",
        )
    except Exception:  # noqa: BLE001 - run_check reports it with the learner's line
        pass
    result = run_check(
        NAME,
        _learner(cls),
        cases,
        _reference,
        MULTI_HEAD_ATTENTION_LAYER_MISTAKES,
        arg_names=("layer", "x", "mask"),
        output_label="output",
    )
    if not result.passed:
        if "_LayoutError" in result.message:  # a layout problem on a later case: say it plainly
            text = result.message.split("_LayoutError: ", 1)[1].rsplit(" (case", 1)[0]
            return CheckResult(
                False,
                tr("{name}: {problem}", "check multi_head_attention_layer", name=NAME, problem=text),
                result.details,
            )
        return result
    worst = _leakage(cls)
    if worst > _LEAK_TOL:
        return CheckResult(
            False,
            tr(
                "{name}: the leakage test fails — with a causal mask, noise added after position t moves "
                "an earlier output by {worst:.2e}: a query must never read a later key",
                "check multi_head_attention_layer",
                name=NAME,
                worst=worst,
            ),
        )
    return CheckResult(
        True,
        tr(
            "{verdict}); the leakage test on your layer with a causal mask: "
            "noise after position t moves no output at or before t (largest change {worst:.1e})",
            "check multi_head_attention_layer",
            verdict=verdict(result.message, VERDICTS).removesuffix(")").removesuffix("）"),
            worst=worst,
        ),
    )
