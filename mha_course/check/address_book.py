"""Checker for notebook 01's query-design exercise: ask the address book one clean question."""

from __future__ import annotations

import torch

from ..lessons import address_book
from .framework import NOT_ATTEMPTED, Case, CheckResult, call_learner, raised_message, type_name

__all__ = ["address_book_query"]

#: (person, attribute, index of the record that answers it in address_book.RECORDS)
QUESTIONS = (("Zhang San", "address", 0), ("Zhang San", "phone", 1), ("Li Si", "address", 2))
THRESHOLD = 0.99
LIMIT = 6.0  #: every entry of the query stays in [-LIMIT, LIMIT], the size of section 3's queries


def address_book_query(fn) -> CheckResult:
    """Check ``fn(person, attribute) -> q``: a float tensor (4,) over ``address_book.KEY_FEATURES``, every
    entry between -LIMIT and LIMIT (-6 and 6), whose scaled lookup in the address book puts weight >=
    THRESHOLD (0.99) on the record that answers the question, for each of the three records. Any such
    query passes (it need not be unique)."""
    name = "address_book_query"
    if not callable(fn):
        return CheckResult(False, f"{name}: expected your function, got {type_name(fn)} — pass the function itself")
    lowest = 1.0
    for i, (person, attribute, target) in enumerate(QUESTIONS, start=1):
        where = f"case {i} of {len(QUESTIONS)}: {person}'s {attribute}"
        call = f"{name}(person={person!r}, attribute={attribute!r})"
        try:
            q = call_learner(fn, Case((person, attribute)))
        except NotImplementedError as exc:
            if i == 1:
                return CheckResult(False, f"{name}: {NOT_ATTEMPTED}", status="not attempted")
            return raised_message(name, exc, where, call, extra=" — answer every question")
        except Exception as exc:  # noqa: BLE001 - report, never raise
            return raised_message(name, exc, where, call)
        problem = _shape_problem(q)
        if problem:
            return CheckResult(False, f"{name}: {problem} ({where})", call)
        largest = q.detach().abs().max().item()
        if largest > LIMIT + 1e-6:
            return CheckResult(
                False,
                f"{name}: your query has an entry of size {largest:g}; keep every entry between -{LIMIT:g} "
                f"and {LIMIT:g} — a louder query is not the point here: find another way to widen the gap ({where})",
                f"{call} returned q = {_fmt(q)}",
            )
        weights = address_book.lookup(q.detach().float().cpu()).weights
        lowest = min(lowest, weights[target].item())
        diagnosis = _diagnose(weights, target)
        if diagnosis:
            shown = ", ".join(f"{w:.3f}" for w in weights.tolist())
            details = f"{where}\n{call} returned q = {_fmt(q)}\nweights over the records: [{shown}]"
            return CheckResult(False, f"{name}: {diagnosis}", details)
    return CheckResult(
        True,
        f"{name}: each of the {len(QUESTIONS)} questions finds its record "
        f"with weight >= {THRESHOLD} (lowest {lowest:.3f}), every entry within ±{LIMIT:g}",
    )


def _shape_problem(q) -> str | None:
    if not isinstance(q, torch.Tensor):
        return f"your query should be a torch.Tensor of shape (4,), got {type_name(q)}"
    if tuple(q.shape) != (4,):
        return (
            f"your query has shape {tuple(q.shape)}, expected (4,): one number per key feature "
            f"{list(address_book.KEY_FEATURES)}"
        )
    if not q.is_floating_point():
        return f"your query has dtype {q.dtype}, expected a floating-point tensor (e.g. torch.zeros(4))"
    if not bool(torch.isfinite(q).all()):
        return "your query contains inf or NaN: use finite numbers"
    return None


def _diagnose(weights: torch.Tensor, target: int) -> str | None:
    """None when the lookup is clean; else what went wrong, in words."""
    w = weights.tolist()
    best = max(range(len(w)), key=w.__getitem__)
    tied = [j for j in range(len(w)) if abs(w[j] - w[best]) < 1e-4]
    want = address_book.RECORDS[target]
    if len(tied) > 1 and target in tied:
        others = " and ".join(f"'{address_book.RECORDS[j]}'" for j in tied)
        return (
            f"the query cannot tell {others} apart (equal weights): name both the person and the "
            f"attribute, one feature each"
        )
    if best != target:
        return (
            f"the query reads mostly '{address_book.RECORDS[best]}' ({w[best]:.3f}) instead of '{want}' "
            f"— check which entries you set: the features are {list(address_book.KEY_FEATURES)}"
        )
    if w[target] < THRESHOLD:
        return (
            f"the query points at the right record '{want}' but only with weight {w[target]:.3f} "
            f"< {THRESHOLD}: make it more decisive — widen the gap between its score and the others' (the softmax "
            f"sharpens as the gaps between scores grow), within entries of size {LIMIT:g}"
        )
    return None


def _fmt(q: torch.Tensor) -> str:
    return "[" + ", ".join(f"{x:g}" for x in q.tolist()) + "]"
