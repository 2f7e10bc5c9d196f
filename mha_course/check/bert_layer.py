"""Checker for notebook 08's exercise: BERT's whole self-attention block, written from one encoder
layer's weights.

The learner's ``fn(layer, x, mask, num_heads)`` receives one encoder layer laid out like
transformers' ``BertLayer`` (``layer.attention.self.query/key/value`` and
``layer.attention.output.dense``: ``nn.Linear(d_model, d_model)`` with biases;
``layer.attention.output.LayerNorm``: ``nn.LayerNorm(d_model)``), the layer's input
``x`` (B, L, d_model) and a padding mask ``mask`` (B, L), True = a real token that may be attended
to. It returns ``(out, weights)``: ``out`` (B, L, d_model) what ``BertAttention`` returns —
``LayerNorm(x + dense(merged heads))``, BertSelfAttention followed by BertSelfOutput — and
``weights`` (B, h, L, L) the attention probabilities. The cases are small stand-in layers with
random weights, biases and LayerNorm parameters, so the check needs neither transformers nor a
download; tests/test_check_bert_layer.py shows that the written-out reference below equals
transformers' ``BertAttention`` on the model's own weights.
"""

from __future__ import annotations

import torch
from torch import nn

from ..i18n import tr, verdict
from .framework import DETAILS, CheckResult, Mistake, diagnoses, learner_raised, tensor_generator, type_name

__all__ = ["attention_from_bert"]

NAME = "attention_from_bert"


class _Holder(nn.Module):
    """A module that only holds named children, as transformers' BertAttention and BertLayer do."""

    def __init__(self, children: dict[str, nn.Module]):
        super().__init__()
        for name, child in children.items():
            self.add_module(name, child)


def stand_in_layer(d_model: int, num_heads: int, *, generator: torch.Generator) -> nn.Module:
    """A layer with BertLayer's attribute layout and random weights, biases and LayerNorm (no FFN)."""

    def linear():
        lin = nn.Linear(d_model, d_model)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(d_model, d_model, generator=generator) / d_model**0.5)
            lin.bias.copy_(0.5 * torch.randn(d_model, generator=generator))
        return lin

    attention_self = _Holder({"query": linear(), "key": linear(), "value": linear()})
    attention_self.num_attention_heads, attention_self.attention_head_size = num_heads, d_model // num_heads
    norm = nn.LayerNorm(d_model, eps=1e-12)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(d_model, generator=generator))
        norm.bias.copy_(0.3 * torch.randn(d_model, generator=generator))
    output = _Holder({"dense": linear(), "LayerNorm": norm})
    return _Holder({"attention": _Holder({"self": attention_self, "output": output})})


def reference(layer, x, mask, num_heads, *, mistake: str | None = None):
    """BERT's attention block written out — right with ``mistake=None``, else one known mistake
    (a key of ``diagnoses("attention_from_bert")``). Returns ``(out, weights)``."""
    sa, so = layer.attention.self, layer.attention.output
    B, L, d = x.shape
    h = num_heads
    if mistake == "head count":
        h = 1 if num_heads > 1 else 2
    dh = d // h

    def project(lin):
        y = x @ lin.weight.T
        return y if mistake == "bias dropped" else y + lin.bias

    q, k, v = (project(lin).reshape(B, L, h, dh).transpose(1, 2) for lin in (sa.query, sa.key, sa.value))
    scores = q @ k.transpose(-2, -1) / (d if mistake == "scale d_model" else dh) ** 0.5
    if mask is not None and mistake != "padding ignored":
        keep = ~mask if mistake == "mask inverted" else mask
        # BERT's convention: an additive mask, 0 where allowed and the dtype's minimum where not
        scores = scores + (~keep)[:, None, None, :].to(scores.dtype) * torch.finfo(scores.dtype).min
    weights = torch.softmax(scores, dim=-1)
    context = weights @ v  # (B, h, L, dh)
    if mistake == "merge no transpose":
        merged = context.reshape(B, L, d)
    else:
        merged = context.transpose(1, 2).reshape(B, L, d)
    attended = merged @ so.dense.weight.T + (0 if mistake == "bias dropped" else so.dense.bias)
    if mistake == "no residual":
        out = so.LayerNorm(attended)
    elif mistake == "norm before residual":
        out = x + so.LayerNorm(attended)
    else:
        out = so.LayerNorm(x + attended)
    return out, weights


MISTAKES = (
    "merge no transpose",
    "mask inverted",
    "padding ignored",
    "scale d_model",
    "no residual",
    "norm before residual",
    "bias dropped",
    "head count",
)


def mistake_fn(name: str):
    """A wrong solution that makes the mistake ``name`` (the checker's tests run each one)."""
    return lambda layer, x, mask, num_heads: reference(layer, x, mask, num_heads, mistake=name)


# the mistakes as wrong solutions, with their diagnoses (the instructor guide lists them; the tests run each one)
ATTENTION_FROM_BERT_MISTAKES = [Mistake(name, mistake_fn(name), diagnoses(NAME)[name]) for name in MISTAKES]


def _close(a, b, tol=2e-5) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and a.shape == b.shape
        and bool(torch.isfinite(a).all())
        and torch.allclose(a.double(), b.double(), atol=tol, rtol=tol)
    )


def _matches(got, exp, tol=2e-5) -> bool:
    """``got`` equals ``exp`` wherever ``got`` is finite (a blocked row gives NaN with -inf masking
    and near-uniform weights with BERT's additive minimum) and is finite somewhere."""
    if not (isinstance(got, torch.Tensor) and got.shape == exp.shape):
        return False
    finite = torch.isfinite(got)
    if not finite.any():
        return False
    return torch.allclose(got[finite].double(), exp[finite].double(), atol=tol, rtol=tol)


def _cases():
    g = tensor_generator()
    specs = [  # d_model, h, B, L, real lengths
        (16, 4, 2, 5, [5, 3], "d_model=16, 4 heads, padded batch (lengths 5, 3)"),
        (24, 3, 1, 7, [7], "d_model=24, 3 heads, one sentence, no padding"),
        (32, 8, 3, 6, [6, 4, 2], "d_model=32, 8 heads, padded batch (lengths 6, 4, 2)"),
    ]
    cases = []
    for d, h, B, L, lengths, description in specs:
        layer = stand_in_layer(d, h, generator=g)
        x = torch.randn(B, L, d, generator=g)
        mask = torch.arange(L) < torch.tensor(lengths)[:, None]
        cases.append((layer, x, mask, h, description))
    return cases


def _diagnose(got, layer, x, mask, h) -> str | None:
    """The first known mistake whose output (and weights, when their shape allows) ``got`` reproduces."""
    words = diagnoses(NAME)
    for name in MISTAKES:
        out, weights = reference(layer, x, mask, h, mistake=name)
        if _close(out, reference(layer, x, mask, h)[0]):
            continue  # this case cannot tell the mistake apart
        if _matches(got[0], out) and (got[1].shape != weights.shape or _matches(got[1], weights)):
            return words[name]
    return None


def attention_from_bert(fn) -> CheckResult:
    """Check ``fn(layer, x, mask, num_heads) -> (out, weights)``: ``layer`` laid out like
    transformers' BertLayer, ``x`` (B, L, d_model), ``mask`` (B, L) True = real token; ``out`` the
    block's output after the residual sum and LayerNorm (B, L, d_model), ``weights`` the attention
    probabilities (B, h, L, L)."""
    if not callable(fn):
        return CheckResult(False, f"{NAME}: expected your function, got {type_name(fn)} — pass the function itself")
    cases = _cases()
    for i, (layer, x, mask, h, description) in enumerate(cases, start=1):
        where = f"case {i} of {len(cases)}: {description}"
        call = f"{NAME}(layer, x of shape {tuple(x.shape)}, mask of shape {tuple(mask.shape)}, num_heads={h})"
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            try:
                got = fn(layer, x.clone(), mask.clone(), h)
            except Exception as exc:  # noqa: BLE001 - report, never raise
                return learner_raised(NAME, exc, first=i == 1, where=where, call=call)
            out, weights = reference(layer, x, mask, h)
            if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
                return CheckResult(
                    False,
                    tr(
                        "{name}: your function must return (out, weights), two tensors; got {what}",
                        "check attention_from_bert",
                        name=NAME,
                        what=type_name(got),
                    ),
                    where,
                )
            if _close(got[0], out) and _close(got[1], weights):
                continue
            diagnosis = _diagnose(got, layer, x, mask, h)
        if diagnosis:
            return CheckResult(False, f"{NAME}: likely mistake — {diagnosis}", f"{where}\n{call}")
        for label, t, exp in (("weights", got[1], weights), ("out", got[0], out)):
            if not _close(t, exp):
                if t.shape != exp.shape:
                    problem = tr(
                        "shape {got}, expected {expected}",
                        "check attention_from_bert",
                        got=tuple(t.shape),
                        expected=tuple(exp.shape),
                    )
                elif not torch.isfinite(t).all():
                    problem = tr(
                        "{k} entries are NaN or infinite",
                        "check attention_from_bert",
                        k=int((~torch.isfinite(t)).sum()),
                    )
                else:
                    problem = tr(
                        "max abs error {error:.2e}",
                        "check attention_from_bert",
                        error=(t.double() - exp.double()).abs().max(),
                    )
                return CheckResult(
                    False,
                    tr(
                        "{name}: your {label} differ from BERT's ({problem}; {where})",
                        "check attention_from_bert",
                        name=NAME,
                        label=label,
                        problem=problem,
                        where=verdict(where, DETAILS),
                    ),
                    call,
                )
    return CheckResult(True, f"{NAME}: correct on {len(cases)} cases ({'; '.join(c[-1] for c in cases)})")
