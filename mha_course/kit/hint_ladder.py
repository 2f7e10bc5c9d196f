"""Hint ladders: help with an exercise one step at a time, never the answer at once.

The ladder of exercise N.M (notebook N, its M-th exercise, numbered as the student edition
numbers them) lives in ``mha_course/kit/hints/NN.json``::

    {"5.1": {"function": "causal_mask",
             "ladder": ["<the idea>", "<the approach>", "<a near-code hint>"]}}

``hint("5.1")`` prints the next rung each time it is called; after the last one it says so and
points at the checker, whose message names the likely mistake once there is code to check.
"""

from __future__ import annotations

from ..i18n import tr
from . import course_data

RUNG_NAMES = ("the idea", "the approach", "nearly code")
_shown: dict[str, int] = {}  # exercise -> rungs already printed in this session


def _key(exercise) -> tuple[str, str]:
    text = str(exercise).strip()
    number, _, minor = text.partition(".")
    if not (number.isdigit() and minor.isdigit()):
        raise ValueError(f"exercise must look like '5.1' (notebook 5, its first exercise), got {exercise!r}")
    return f"{int(number):02d}", f"{int(number)}.{int(minor)}"


def load(notebook: str) -> dict:
    """The ladders of notebook ``notebook`` ("05"): exercise number -> {"function", "ladder"}."""
    return course_data.read("hints", notebook, validate, missing_ok=True)


def validate(ladders: dict) -> list[str]:
    """Problems with a hints file's structure (empty when it is fine)."""

    def problem(number, entry) -> str | None:
        if not isinstance(entry, dict) or not entry.get("function"):
            return f"{number}: needs a 'function'"
        rungs = entry.get("ladder", [])
        if len(rungs) < 3 or not all(isinstance(r, str) and r.strip() for r in rungs):
            return f"{number}: needs a 'ladder' of at least 3 non-empty hints (idea, approach, near-code)"
        return None

    return [p for p in (problem(n, e) for n, e in ladders.items()) if p]


def ladder(exercise) -> list[str]:
    """The whole ladder of ``exercise`` ("5.1"), for instructors and tests."""
    notebook, number = _key(exercise)
    ladders = load(notebook)
    if number not in ladders:
        raise ValueError(f"exercise {number} has no hints (looked in mha_course/kit/hints/{notebook}.json)")
    return list(ladders[number]["ladder"])


def next_hint(exercise) -> str:
    """The next rung of ``exercise``'s ladder as one line of text (and remember that it was given)."""
    rungs = ladder(exercise)
    _, number = _key(exercise)
    step = _shown.get(number, 0)
    if step >= len(rungs):
        return tr(
            "Exercise {number}: that was the last hint ({n} of {n}). Run the checker under "
            "your function: when something is off, it names the likely mistake.",
            "hint",
            number=number,
            n=len(rungs),
        )
    _shown[number] = step + 1
    name = RUNG_NAMES[step] if step < len(RUNG_NAMES) else "one more step"
    name = tr(name, "hint rung name")
    return tr(
        "Exercise {number}, hint {k} of {n} ({name}): {rung}",
        "hint",
        number=number,
        k=step + 1,
        n=len(rungs),
        name=name,
        rung=rungs[step],
    )


def hint(exercise) -> None:
    """Print the next hint for ``exercise`` ("5.1"); call again for the next step."""
    print(next_hint(exercise))


def reset(exercise=None) -> None:
    """Start the ladder of ``exercise`` (default: every exercise) from its first rung again."""
    if exercise is None:
        _shown.clear()
    else:
        _shown.pop(_key(exercise)[1], None)
