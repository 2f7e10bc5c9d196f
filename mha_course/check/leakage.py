"""Checker for a leakage test: a function that says whether a sequence model lets a position's
output depend on a later input.

The learner's test is run on attention layers whose answer is known — causal ones (False) and
ones that leak, in the open or in one place only, strongly or by a tiny amount (True).
"""

from __future__ import annotations

import torch

from ..gqa import GroupedQueryAttention
from ..i18n import tr
from ..masks import causal_mask
from ..multihead import MultiHeadAttention
from .framework import Case, CheckResult, mistakes, run_check, tensor_generator

__all__ = ["leaks_future"]

L, D_MODEL = 6, 8


def _randomized(module, seed):
    g = tensor_generator(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return module.requires_grad_(False).eval()  # outputs need grad only when the learner's x does


def _with_extra(*pairs):
    """The causal mask plus the (query, key) pairs in ``pairs``: leaks in exactly those places."""
    mask = causal_mask(L)
    for i, j in pairs:
        mask[i, j] = True
    return mask


class _Layer:
    """A named attention layer ``x (B, L, d_model) -> out`` (or (out, weights)): the answer is known."""

    def __init__(self, name, fn, leaks):
        self.name, self.fn, self.leaks = name, fn, leaks

    def __call__(self, x):
        return self.fn(x)

    def __repr__(self):
        return self.name


def _layers():
    mha = _randomized(MultiHeadAttention(D_MODEL, 2), 11)
    gqa = _randomized(GroupedQueryAttention(D_MODEL, 2, 1), 12)
    causal = causal_mask(L)
    return [
        _Layer("a causal layer", lambda x: mha(x, mask=causal), False),
        _Layer("no mask", lambda x: mha(x), True),
        _Layer(
            "every position sees the next one", lambda x: mha(x, mask=torch.ones(L, L, dtype=torch.bool).tril(1)), True
        ),
        _Layer("one leak: position 1 reads position 4", lambda x: mha(x, mask=_with_extra((1, 4))), True),
        _Layer(
            "a tiny leak: 1e-4 of the next input added",
            lambda x: mha(x, mask=causal)[0] + 1e-4 * x.roll(-1, dims=1),
            True,
        ),
        _Layer("one leak: position 4 reads position 5", lambda x: mha(x, mask=_with_extra((4, 5))), True),
        _Layer("a causal GQA layer returning (out, weights)", lambda x: gqa(x, is_causal=True), False),
    ]


def _first(y):
    return y[0] if isinstance(y, (tuple, list)) else y


def _as_answer(test):
    """(layer, x) -> tensor(bool): the test's verdict, comparable by the framework. Autograd is on
    inside (the check runner turns it off), so that a test may differentiate an output with
    respect to a later input instead of perturbing it."""

    def run(layer, x):
        with torch.enable_grad():
            return torch.tensor(bool(test(layer, x)))

    return run


def _known(layer, x):
    return torch.tensor(layer.leaks)


def _perturbed(x, positions, seed=0):
    x2 = x.clone()
    g = torch.Generator().manual_seed(seed)
    x2[:, positions] += torch.randn(x2[:, positions].shape, generator=g)
    return x2


def _all_outputs(fn, x):  # compares every output, the future's own included
    x2 = _perturbed(x, slice(1, None))
    return not torch.equal(_first(fn(x)), _first(fn(x2)))


def _last_input_only(fn, x):  # perturbs only the last position
    n = x.shape[1]
    before, after = _first(fn(x)), _first(fn(_perturbed(x, slice(n - 1, None))))
    return not torch.equal(before[:, : n - 1], after[:, : n - 1])


def _first_output_only(fn, x):  # looks only at output position 0
    before, after = _first(fn(x)), _first(fn(_perturbed(x, slice(1, None))))
    return not torch.equal(before[:, 0], after[:, 0])


def _loose_tolerance(fn, x):  # every t, but changes below 1e-3 count as none
    n = x.shape[1]
    for t in range(n - 1):
        before, after = _first(fn(x)), _first(fn(_perturbed(x, slice(t + 1, None), seed=t)))
        if not torch.allclose(before[:, : t + 1], after[:, : t + 1], atol=1e-3):
            return True
    return False


LEAKS_FUTURE_MISTAKES = mistakes(
    "leaks_future",
    {
        "all outputs": _as_answer(_all_outputs),
        "last input only": _as_answer(_last_input_only),
        "first output only": _as_answer(_first_output_only),
        "loose tolerance": _as_answer(_loose_tolerance),
    },
)


def leaks_future(fn) -> CheckResult:
    """Check ``fn(layer, x) -> bool``: True if some output position of ``layer(x)`` depends on a
    later position of ``x`` (B, L, d_model); ``layer`` returns a tensor (B, L, d) or a tuple whose
    first element is one. Judged on layers whose answer is known."""
    g = tensor_generator()
    cases = [Case((layer, torch.randn(2, L, D_MODEL, generator=g)), description=layer.name) for layer in _layers()]
    return run_check(
        "leaks_future",
        _as_answer(fn) if callable(fn) else fn,
        cases,
        _known,
        LEAKS_FUTURE_MISTAKES,
        arg_names=("layer", "x"),
        output_label=tr("your verdict (True = leaks)", "label"),
    )
