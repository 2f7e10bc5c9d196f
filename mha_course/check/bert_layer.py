"""Checker for notebook 08's exercise: one BERT attention layer, copied into the course's
multi-head attention and run on a padded batch.

The learner's ``fn(layer, num_heads)`` receives one encoder layer laid out like transformers'
``BertLayer`` (``layer.attention.self.query/key/value`` and ``layer.attention.output.dense``,
four ``nn.Linear(d_model, d_model)``) and returns a module that, called as
``module(x, mask=mask)``, gives ``(out, weights)`` like ``mc.MultiHeadAttention``: ``weights``
the layer's attention probabilities (B, h, L, L), ``out`` the attention's output after W_O
(before BERT's residual sum and LayerNorm). The cases are small stand-in layers with random
weights and biases, so the check needs neither transformers nor a download.
"""

from __future__ import annotations

import torch
from torch import nn

from ..multihead import MultiHeadAttention
from .framework import CheckResult, Mistake, diagnoses, learner_raised, raised_message, tensor_generator, type_name

__all__ = ["attention_from_bert"]

NAME = "attention_from_bert"
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


class _Holder(nn.Module):
    """A module that only holds named children, as transformers' BertAttention and BertLayer do."""

    def __init__(self, children: dict[str, nn.Module]):
        super().__init__()
        for name, child in children.items():
            self.add_module(name, child)


def stand_in_layer(d_model: int, num_heads: int, *, generator: torch.Generator) -> nn.Module:
    """A layer with BertLayer's attribute layout and random weights and biases (no FFN)."""

    def linear():
        lin = nn.Linear(d_model, d_model)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(d_model, d_model, generator=generator) / d_model**0.5)
            lin.bias.copy_(0.5 * torch.randn(d_model, generator=generator))
        return lin

    attention_self = _Holder({"query": linear(), "key": linear(), "value": linear()})
    attention_self.num_attention_heads, attention_self.attention_head_size = num_heads, d_model // num_heads
    output = _Holder({"dense": linear(), "LayerNorm": nn.LayerNorm(d_model)})
    return _Holder({"attention": _Holder({"self": attention_self, "output": output})})


def _sources(layer) -> tuple[nn.Linear, ...]:
    """The layer's W_Q, W_K, W_V, W_O, in the order of ``_PROJECTIONS``."""
    sa = layer.attention.self
    return sa.query, sa.key, sa.value, layer.attention.output.dense


def _copy(layer, num_heads: int, *, transpose=False, biases=True, order=(0, 1, 2, 3), skip=()) -> MultiHeadAttention:
    """The layer copied into ``mc.MultiHeadAttention`` — right with the defaults, else one known mistake."""
    src = _sources(layer)
    module = MultiHeadAttention(src[0].in_features, num_heads)
    with torch.no_grad():
        for i, name in enumerate(_PROJECTIONS):
            if name in skip:
                continue
            ours, theirs = getattr(module, name), src[order[i]]
            ours.weight.copy_(theirs.weight.T if transpose else theirs.weight)
            if biases:
                ours.bias.copy_(theirs.bias)
    return module


def _reference(layer, num_heads):
    return _copy(layer, num_heads)


# the mistakes, as wrong solutions (the instructor guide lists them; the tests run each one)
ATTENTION_FROM_BERT_MISTAKES = [
    Mistake(name, fn, diagnoses(NAME)[name])
    for name, fn in {
        "head count": lambda layer, h: _copy(layer, 1 if h > 1 else 2),
        "transposed": lambda layer, h: _copy(layer, h, transpose=True),
        "query and key swapped": lambda layer, h: _copy(layer, h, order=(1, 0, 2, 3)),
        "value and output swapped": lambda layer, h: _copy(layer, h, order=(0, 1, 3, 2)),
        "output projection": lambda layer, h: _copy(layer, h, skip=("out_proj",)),
        "biases": lambda layer, h: _copy(layer, h, biases=False),
    }.items()
]


def _close(a, b, tol=1e-5) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and a.shape == b.shape
        and torch.allclose(a.double(), b.double(), atol=tol, rtol=tol)
    )


def _parameter_diagnosis(module, layer, num_heads) -> str | None:
    """Name the mistake from the module's own parameters, when it has mc.MultiHeadAttention's."""
    words = diagnoses(NAME)
    heads = getattr(module, "num_heads", None)
    if isinstance(heads, int) and heads != num_heads:
        return words["head count"] + f" (yours has {heads}, the layer {num_heads})"
    if not all(isinstance(getattr(module, n, None), nn.Linear) for n in _PROJECTIONS):
        return None
    ours = [getattr(module, n) for n in _PROJECTIONS]
    src = _sources(layer)
    right = [_close(o.weight, s.weight) for o, s in zip(ours, src, strict=True)]
    if any(_close(o.weight, s.weight.T) and not r for o, s, r in zip(ours, src, right, strict=True)):
        return words["transposed"]
    if _close(ours[0].weight, src[1].weight) or _close(ours[1].weight, src[0].weight):
        return words["query and key swapped"]
    if _close(ours[2].weight, src[3].weight) or _close(ours[3].weight, src[2].weight):
        return words["value and output swapped"]
    if all(right[:3]) and not right[3]:
        return words["output projection"]
    if all(right) and not all(o.bias is not None and _close(o.bias, s.bias) for o, s in zip(ours, src, strict=True)):
        return words["biases"]
    return None


def _cases():
    g = tensor_generator()
    specs = [  # d_model, h, B, L, real lengths (None: no padding)
        (16, 4, 2, 5, [5, 3], "d_model=16, 4 heads, padded batch (lengths 5, 3)"),
        (24, 3, 1, 7, None, "d_model=24, 3 heads, one sentence, no mask"),
        (32, 8, 3, 6, [6, 4, 2], "d_model=32, 8 heads, padded batch (lengths 6, 4, 2)"),
    ]
    cases = []
    for d, h, B, L, lengths, description in specs:
        layer = stand_in_layer(d, h, generator=g)
        x = torch.randn(B, L, d, generator=g)
        mask = None if lengths is None else (torch.arange(L) < torch.tensor(lengths)[:, None])[:, None, None, :]
        cases.append((layer, h, x, mask, description))
    return cases


def attention_from_bert(fn) -> CheckResult:
    """Check ``fn(layer, num_heads) -> module``: ``layer`` laid out like transformers' BertLayer;
    ``module(x, mask=mask)`` must give the layer's attention output after W_O and its attention
    probabilities, ``(out (B, L, d_model), weights (B, h, L, L))``; mask True = may attend."""
    if not callable(fn):
        return CheckResult(False, f"{NAME}: expected your function, got {type_name(fn)} — pass the function itself")
    cases = _cases()
    for i, (layer, h, x, mask, description) in enumerate(cases, start=1):
        where = f"case {i} of {len(cases)}: {description}"
        call = f"{NAME}(layer, num_heads={h}), then module(x of shape {tuple(x.shape)}, mask=...)"
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            try:
                module = fn(layer, h)
            except Exception as exc:  # noqa: BLE001 - report, never raise
                return learner_raised(NAME, exc, first=i == 1, where=where, call=call)
            if not isinstance(module, nn.Module):
                return CheckResult(
                    False, f"{NAME}: expected a module (e.g. mc.MultiHeadAttention), got {type_name(module)}", where
                )
            try:
                got = module.eval()(x.clone(), mask=None if mask is None else mask.clone())
            except Exception as exc:  # noqa: BLE001
                return raised_message(NAME, exc, where, call, extra=" when your module was called")
            out, weights = _reference(layer, h)(x, mask=mask)
        if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
            return CheckResult(
                False, f"{NAME}: module(x, mask=mask) must return (out, weights), got {type_name(got)}", where
            )
        if _close(got[0], out) and _close(got[1], weights):
            continue
        diagnosis = _parameter_diagnosis(module, layer, h)
        if diagnosis:
            return CheckResult(False, f"{NAME}: likely mistake — {diagnosis}", f"{where}\n{call}")
        for name, t, exp in (("weights", got[1], weights), ("out", got[0], out)):
            if not _close(t, exp):
                shape = tuple(t.shape) if t.shape != exp.shape else None
                problem = (
                    f"shape {shape}, expected {tuple(exp.shape)}"
                    if shape
                    else f"max abs error {(t - exp).abs().max():.2e}"
                )
                return CheckResult(
                    False, f"{NAME}: your module's {name} differ from the layer's ({problem}; {where})", call
                )
    return CheckResult(True, f"{NAME}: correct on {len(cases)} cases ({'; '.join(c[-1] for c in cases)})")
