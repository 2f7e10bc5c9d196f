"""Checker for notebook 17's exercise (Exercise 17.1): a function that tells which bug an attention layer has.

The learner's ``fn(layer) -> str`` receives an attention layer — ``layer(x, mask=None)`` maps x
(B, L, layer.d_model) to ``(out, weights)`` like ``mc.MultiHeadAttention``, mask True = may
attend — and names what is wrong with it, one of :data:`LABELS`. The checker hands it, for two
sizes, one healthy layer and one layer with each bug, built from the course's own parts, and
compares the names; a wrong pattern of answers names the likely mistake.
"""

from __future__ import annotations

import torch

from ..i18n import tr
from ..multihead import MultiHeadAttention
from .framework import CheckResult, Mistake, diagnoses, learner_raised, tensor_generator, type_name

__all__ = ["find_bug"]

NAME = "find_bug"
#: what ``fn(layer)`` may answer
LABELS = ("healthy", "uniform", "identical heads", "nan", "leak")


class _MaskIgnored(MultiHeadAttention):
    """The mask is accepted and dropped: every query reads every key (a mask that does not take effect)."""

    def forward(self, query, key=None, value=None, *, mask=None, need_weights=True):
        return super().forward(query, key, value, mask=None, need_weights=need_weights)


def _layers(d_model: int, num_heads: int, generator: torch.Generator) -> dict[str, MultiHeadAttention]:
    """One healthy layer and one per bug, all with the same (sharpened) random weights."""
    from ..lessons.symptoms import HandWrittenAttention, copy_head

    healthy = MultiHeadAttention(d_model, num_heads)
    with torch.no_grad():
        for lin in (healthy.q_proj, healthy.k_proj, healthy.v_proj, healthy.out_proj):
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=generator) / d_model**0.5)
            lin.bias.copy_(0.1 * torch.randn(lin.bias.shape, generator=generator))
        healthy.q_proj.weight.mul_(3.0)  # sharper than a fresh init: clearly not uniform
    state = healthy.state_dict()
    layers = {"healthy": healthy}
    for label, cls in (("uniform", MultiHeadAttention), ("identical heads", MultiHeadAttention),
                       ("nan", HandWrittenAttention), ("leak", _MaskIgnored)):  # fmt: skip
        layer = cls(d_model, num_heads)
        layer.load_state_dict(state)
        layers[label] = layer.eval()
    with torch.no_grad():
        layers["uniform"].q_proj.weight.zero_()  # every query 0: every score 0, every row uniform
        layers["uniform"].q_proj.bias.zero_()
        copy_head(layers["identical heads"])
    return layers


def _cases() -> list[tuple[str, str, MultiHeadAttention]]:
    """(description, label, layer): two sizes, the layers in a fixed, mixed order."""
    g = tensor_generator()
    cases = []
    for d, h, order in ((16, 4, (0, 3, 1, 4, 2)), (24, 3, (4, 2, 0, 1, 3))):
        layers = _layers(d, h, g)
        for i in order:
            label = LABELS[i]
            cases.append((f"d_model={d}, {h} heads, {label}", label, layers[label]))
    return cases


def _name_mistake(answers: list[tuple[str, str]]) -> str | None:
    """The mistake a pattern of (expected, given) answers points to, by name."""
    wrong = {(e, g) for e, g in answers if e != g}
    given = {g for _, g in answers}
    if given == {"leak"}:  # every layer "leaks": the probes ran without the mask the layer was meant to get
        return "unmasked call"
    if len(given) == 1:
        return "constant"
    if ("uniform", "identical heads") in wrong:
        return "similarity first"
    if any(e == "healthy" for e, _ in wrong):
        return "tight thresholds"
    if ("nan", "healthy") in wrong:
        return "no empty row"
    if ("leak", "healthy") in wrong:
        return "no causal probe"
    if ("identical heads", "healthy") in wrong:
        return "loose similarity"
    return None


def find_bug(fn) -> CheckResult:
    """Check ``fn(layer) -> str``, one of LABELS: "healthy", "uniform" (every head attends evenly
    to every allowed key), "identical heads" (all heads attend alike), "nan" (a query with no
    allowed key gives NaN), "leak" (the causal mask does not take effect)."""
    if not callable(fn):
        return CheckResult(False, f"{NAME}: expected your function, got {type_name(fn)} — pass the function itself")
    cases = _cases()
    answers = []  # (expected, given)
    for i, (description, label, layer) in enumerate(cases, start=1):
        where = f"case {i} of {len(cases)}: {description}"
        call = f"{NAME}(layer) with layer.d_model={layer.d_model}, layer.num_heads={layer.num_heads}"
        with torch.random.fork_rng(devices=[]):
            try:
                given = fn(layer)
            except Exception as exc:  # noqa: BLE001 - report, never raise
                return learner_raised(NAME, exc, first=i == 1, where=where, call=call)
        if given not in LABELS:
            return CheckResult(
                False,
                tr(
                    "{name}: return one of {labels}; got {what} {given!r}",
                    "check find_bug",
                    name=NAME,
                    labels=", ".join(repr(x) for x in LABELS),
                    what=type_name(given),
                    given=given,
                )[:300],
                where,
            )
        answers.append((label, given))
    if all(e == g for e, g in answers):
        return CheckResult(
            True,
            tr(
                "{name}: all {n} layers named right (a healthy one and four bugs, two sizes)",
                "check find_bug",
                name=NAME,
                n=len(cases),
            ),
        )
    first = next(i for i, (e, g) in enumerate(answers) if e != g)
    details = "\n".join(
        tr("case {i}: a layer with {expected!r} — you said {given!r}", "check find_bug", i=i + 1, expected=e, given=g)
        for i, (e, g) in enumerate(answers)
        if e != g
    )
    mistake = _name_mistake(answers)
    if mistake:
        return CheckResult(False, f"{NAME}: likely mistake — {diagnoses(NAME)[mistake]}", details)
    expected, given = answers[first]
    return CheckResult(
        False,
        tr(
            "{name}: the layer of case {i} has {expected!r}, you said {given!r}",
            "check find_bug",
            name=NAME,
            i=first + 1,
            expected=expected,
            given=given,
        ),
        details,
    )


def _wrong(*, order=("nan", "leak", "uniform", "identical heads"), threshold=0.99, empty_row=True, masked=True):
    """A find_bug that runs the checks in ``order`` with the given entropy threshold: the right one
    with the defaults, else one of the known mistakes (the tests and the instructor guide use them)."""

    def fn(layer):
        g = torch.Generator().manual_seed(0)
        L = 8
        x = torch.randn(2, L, layer.d_model, generator=g)  # (B, L, d_model)
        causal = torch.ones(L, L, dtype=torch.bool).tril()
        probe = causal.clone()
        if empty_row:
            probe[3] = False  # query 3 may read nothing
        if not masked:  # the mistake: the layer called without any mask
            probe = causal = None
        with torch.no_grad():
            out, _ = layer(x, mask=probe)
            x2 = x.clone()
            x2[:, L // 2 :] += 1.0  # change only the second half
            early = layer(x2, mask=causal)[0][:, : L // 2] - layer(x, mask=causal)[0][:, : L // 2]
            _, w = layer(x)  # (B, h, L, L)
        p = w.clamp_min(1e-30)
        entropy = -(w * p.log()).sum(-1).mean(dim=(0, 2)) / torch.log(torch.tensor(float(L)))  # (h,)
        same = all(torch.allclose(w[:, 0], w[:, j], atol=1e-6) for j in range(1, w.shape[1]))
        tests = {
            "nan": not torch.isfinite(out).all(),
            "leak": early.abs().max() > 1e-6,
            "uniform": bool(entropy.min() > threshold),
            "identical heads": same,
        }
        return next((label for label in order if tests[label]), "healthy")

    return fn


FIND_BUG_MISTAKES = [
    Mistake(name, fn, diagnoses(NAME)[name])
    for name, fn in {
        "similarity first": _wrong(order=("nan", "leak", "identical heads", "uniform")),
        "no empty row": _wrong(empty_row=False),
        "no causal probe": _wrong(order=("nan", "uniform", "identical heads")),
        "tight thresholds": _wrong(threshold=0.3),
        "unmasked call": _wrong(masked=False),
        "constant": lambda layer: "healthy",
    }.items()
]
