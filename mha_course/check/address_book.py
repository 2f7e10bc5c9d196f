"""Checker for notebook 01's query-design exercise: ask the address book one clean question."""

from __future__ import annotations

import torch

from ..i18n import tr
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
                f"{name}: "
                + tr(
                    "your query has an entry of size {largest:g}; keep every entry between -{limit:g} "
                    "and {limit:g} — a louder query is not the point here: find another way to widen the gap",
                    "check address_book_query",
                    largest=largest,
                    limit=LIMIT,
                )
                + f" ({where})",
                tr("{call} returned q = {q}", "check address_book_query", call=call, q=_fmt(q)),
            )
        weights = address_book.lookup(q.detach().float().cpu()).weights
        lowest = min(lowest, weights[target].item())
        diagnosis = _diagnose(weights, target)
        if diagnosis:
            shown = ", ".join(f"{w:.3f}" for w in weights.tolist())
            details = (
                f"{where}\n"
                + tr("{call} returned q = {q}", "check address_book_query", call=call, q=_fmt(q))
                + "\n"
                + tr("weights over the records: [{shown}]", "check address_book_query", shown=shown)
            )
            return CheckResult(
                False, tr("{name}: {diagnosis}", "check address_book_query", name=name, diagnosis=diagnosis), details
            )
    return CheckResult(
        True,
        tr(
            "{name}: each of the {n} questions finds its record "
            "with weight >= {threshold} (lowest {lowest:.3f}), every entry within ±{limit:g}",
            "check address_book_query",
            name=name,
            n=len(QUESTIONS),
            threshold=THRESHOLD,
            lowest=lowest,
            limit=LIMIT,
        ),
    )


def _shape_problem(q) -> str | None:
    if not isinstance(q, torch.Tensor):
        return tr(
            "your query should be a torch.Tensor of shape (4,), got {what}",
            "check address_book_query",
            what=type_name(q),
        )
    if tuple(q.shape) != (4,):
        return tr(
            "your query has shape {shape}, expected (4,): one number per key feature {features}",
            "check address_book_query",
            shape=tuple(q.shape),
            features=list(address_book.KEY_FEATURES),
        )
    if not q.is_floating_point():
        return tr(
            "your query has dtype {dtype}, expected a floating-point tensor (e.g. torch.zeros(4))",
            "check address_book_query",
            dtype=q.dtype,
        )
    if not bool(torch.isfinite(q).all()):
        return tr("your query contains inf or NaN: use finite numbers", "check address_book_query")
    return None


def _diagnose(weights: torch.Tensor, target: int) -> str | None:
    """None when the lookup is clean; else what went wrong, in words."""
    w = weights.tolist()
    best = max(range(len(w)), key=w.__getitem__)
    tied = [j for j in range(len(w)) if abs(w[j] - w[best]) < 1e-4]
    want = address_book.RECORDS[target]
    if len(tied) > 1 and target in tied:
        others = tr(" and ", "check address_book_query").join(f"'{address_book.RECORDS[j]}'" for j in tied)
        return tr(
            "the query cannot tell {others} apart (equal weights): name both the person and the "
            "attribute, one feature each",
            "check address_book_query",
            others=others,
        )
    if best != target:
        return tr(
            "the query reads mostly '{best}' ({weight:.3f}) instead of '{want}' "
            "— check which entries you set: the features are {features}",
            "check address_book_query",
            best=address_book.RECORDS[best],
            weight=w[best],
            want=want,
            features=list(address_book.KEY_FEATURES),
        )
    if w[target] < THRESHOLD:
        return tr(
            "the query points at the right record '{want}' but only with weight {weight:.3f} "
            "< {threshold}: make it more decisive — widen the gap between its score and the others' (the softmax "
            "sharpens as the gaps between scores grow), within entries of size {limit:g}",
            "check address_book_query",
            want=want,
            weight=w[target],
            threshold=THRESHOLD,
            limit=LIMIT,
        )
    return None


def _fmt(q: torch.Tensor) -> str:
    return "[" + ", ".join(f"{x:g}" for x in q.tolist()) + "]"
