"""The checker framework: run a learner's function on fixed cases, compare with the reference,
and name the likely mistake by matching known wrong variants.

A check returns a :class:`CheckResult` that a notebook displays as one line::

    ✅ passed · causal_mask: correct on 6 cases (square 4×4, 1×1, Lq < Lk, ...)
    ❌ failed · causal_mask: likely mistake — the diagonal is excluded (a query must see its own position)
       case 1 of 6: square 4×4 — causal_mask(q_len=4)
       mask has wrong values: 4 of 16 entries differ
    ⏳ not attempted · causal_mask: replace the raise NotImplementedError with your code

The status word stands beside its glyph, so a machine without an emoji font still shows it.

How to write a checker module (``mha_course/check/<topic>.py``)
----------------------------------------------------------------
``mha_course/check/__init__.py`` imports each checker by name (one import line and one entry in
``CHECKERS``). A checker is a function ``fn -> CheckResult`` built from its cases, the reference
and its mistakes; the mistakes are data, a module-level list ``<NAME>_MISTAKES`` (the instructor
guide lists them from there)::

    import torch
    from .framework import Case, Mistake, run_check, tensor_generator

    __all__ = ["double"]

    DOUBLE_MISTAKES = [Mistake("squared", lambda x: x * x, "you squared x instead of doubling it")]

    def double(fn):
        \"\"\"Check ``fn(x) -> 2 * x`` for a float tensor x of any shape.\"\"\"
        g = tensor_generator()                 # private, seeded: same inputs every run
        cases = [Case((torch.randn(3, generator=g),), description="1-D"),
                 Case((torch.randn(2, 5, generator=g),), description="2-D")]
        return run_check("double", fn, cases, reference=lambda x: 2 * x, mistakes=DOUBLE_MISTAKES,
                         arg_names=("x",))

Rules the runner follows (so checker modules need not):
* the learner's function runs under ``torch.no_grad()`` on clones of the inputs, with the global
  RNG state restored afterwards; it never makes the check raise;
* ``NotImplementedError`` on the first case → status "not attempted"; any other exception →
  failed, naming the exception, the case and the learner's line of code;
* the output must have the reference's structure: a tensor (same shape, same dtype *class* —
  bool, integer or floating; float64 is fine where float32 is expected), a tuple/list of the
  same length, or an ``int`` (a float that happens to be whole fails with a hint);
* float values are compared with ``atol``/``rtol`` suited to float32 (1e-4); ``NaN`` where the
  reference has a number fails; bool and integer values must match exactly;
* on the first failing case each :class:`Mistake` whose output differs from the reference there
  is run on the same inputs and compared with the learner's output (values only, dtype class
  ignored). The first mistake that also agrees with the learner on every other case is reported
  as "likely mistake — <diagnosis>" (so two mistakes that coincide on one case are told apart
  by the others); failing that, the first one that matches the failing case; failing that, a
  generic message with the case, the inputs and the max abs error;
* inputs come from :func:`tensor_generator` (fixed seed), so a message is the same on every run.

Design cases so that the first case a mistake fails on tells it apart from the other mistakes
(e.g. keep Lq ≠ Lk out of the first case so "wrong alignment" and "diagonal excluded" differ),
and keep inputs small: checks run inside notebooks that are tested on CPU.
"""

from __future__ import annotations

import html
import json
import math
import numbers
import re
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import torch

__all__ = ["CheckResult", "Case", "Mistake", "mistakes", "diagnoses", "run_check", "tensor_generator", "SEED"]

SEED = 1234
_STATUSES = ("passed", "failed", "not attempted")
#: the status words, as shown beside their glyph (translated at display: mha_course.i18n)
STATUSES = _STATUSES
_ICONS = {"passed": "✅", "failed": "❌", "not attempted": "⏳"}
NOT_ATTEMPTED = "replace the raise NotImplementedError with your code"
#: the shapes of the verdict lines every checker writes, translated whole at display: each {field}
#: is filled from the English line (a diagnosis, a case's place are translated in turn)
VERDICTS = (
    "{name}: correct on {n} cases ({cases})",
    "{name}: correct on {n} cases",
    "{name}: likely mistake — {diagnosis}",
    "{name}: " + NOT_ATTEMPTED,
    "{name}: your function raised {error} — finish the part this case needs ({where})",
    "{name}: your function raised {error} ({where})",
    "{name}: expected your function, got {what} — pass the function itself",
    "{name}: {problem} ({where})",
    "case {i} of {n}: {description}",
    "case {i} of {n}",
)
#: the shapes of a failure's detail lines (what differed), translated the same way
DETAILS = (
    "case {i} of {n}: {description}",
    "case {i} of {n}",
    "{label} has wrong values: max abs error {error} ({k} of {n} entries off)",
    "{label} has wrong values: {k} of {n} entries differ",
    "{label} has shape {got}, expected {expected}",
    "{label} should be a torch.Tensor, got {what}",
    "{label} contains NaN at {k} of {n} entries where a number belongs",
)


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one exercise check.

    ``passed``: True only if every case was right. ``message``: one line, starting with the
    exercise name. ``details``: extra lines shown under a failure (case, inputs, what differed).
    ``status``: "passed", "failed" or "not attempted" (default: from ``passed``).
    ``bool(result)`` is ``passed``; the repr is the message after its icon and status word
    ("✅ passed · …"), plus the indented details.
    """

    passed: bool
    message: str
    details: str = ""
    status: str = ""

    def __post_init__(self):
        status = self.status or ("passed" if self.passed else "failed")
        if status not in _STATUSES:
            raise ValueError(f"status must be one of {_STATUSES}, got {status!r}")
        if (status == "passed") != bool(self.passed):
            raise ValueError(f"status={status!r} contradicts passed={self.passed!r}")
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "passed", bool(self.passed))

    def __bool__(self) -> bool:
        return self.passed

    def _lines(self) -> list[str]:
        from ..i18n import translate, verdict

        status = translate(self.status, "status")
        lines = [f"{_ICONS[self.status]} {status} · {verdict(self.message, VERDICTS)}"]
        if self.status == "failed" and self.details:
            lines += ["   " + verdict(line, DETAILS) for line in self.details.splitlines()]
        return lines

    def __repr__(self) -> str:
        return "\n".join(self._lines())

    __str__ = __repr__

    def _repr_html_(self) -> str:
        colour = {"passed": "#1a7f37", "failed": "#cf222e", "not attempted": "#9a6700"}[self.status]
        head, *rest = self._lines()
        out = f'<div style="font-family: monospace; color: {colour}">{html.escape(head)}'
        if rest:
            body = html.escape("\n".join(line[3:] for line in rest))
            out += f'<pre style="margin: 0 0 0 2em; color: inherit">{body}</pre>'
        return out + "</div>"


@dataclass(frozen=True)
class Case:
    """One call of the learner's function: ``fn(*args, **kwargs)``.

    ``description``: a few words naming what the case tests ("Lq < Lk", "padding mask").
    ``info``: extra facts about the case (e.g. the model's query-head count) that a
    :class:`Mistake` with ``on_case=True`` may use; never passed to the learner.
    """

    args: tuple
    kwargs: dict = field(default_factory=dict)
    description: str = ""
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Mistake:
    """A known wrong variant: ``fn`` computes what the mistake would return.

    ``fn`` is called like the learner's function (``fn(*args, **kwargs)``), or with the
    :class:`Case` itself if ``on_case`` is True. ``diagnosis``: plain words naming the mistake
    and the fix, shown as "likely mistake — <diagnosis>".
    """

    name: str
    fn: Callable
    diagnosis: str
    on_case: bool = False


def diagnoses(checker: str) -> dict[str, str]:
    """The diagnoses of ``checker``'s known mistakes (name -> plain words naming the mistake and
    the fix), from ``mha_course/check/diagnoses.json``: the words live apart from the code."""
    table = json.loads(resources.files("mha_course.check").joinpath("diagnoses.json").read_text(encoding="utf-8"))
    if checker not in table:
        raise ValueError(f"no diagnoses for checker {checker!r} in mha_course/check/diagnoses.json")
    return table[checker]


def mistakes(checker: str, variants: dict[str, Callable], *, on_case: Sequence[str] = ()) -> list[Mistake]:
    """The :class:`Mistake` list of ``checker``: one per entry of ``variants`` (name -> the wrong
    function), in order, each with its diagnosis from :func:`diagnoses`; names in ``on_case`` get
    the :class:`Case` instead of its arguments."""
    words = diagnoses(checker)
    missing = [name for name in variants if name not in words]
    if missing:
        raise ValueError(f"{checker}: no diagnosis for {missing} in mha_course/check/diagnoses.json")
    return [Mistake(name, fn, words[name], on_case=name in on_case) for name, fn in variants.items()]


def tensor_generator(seed: int = SEED) -> torch.Generator:
    """A private CPU generator with a fixed seed: the same inputs (and messages) on every run,
    without touching the global RNG. Use it as ``torch.randn(..., generator=g)``."""
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------
# describing things in one line


def type_name(x) -> str:
    if x is None:
        return "None"
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of length {len(x)}"
    module = type(x).__module__
    qual = type(x).__qualname__ if module in ("builtins", None) else f"{module.split('.')[0]}.{type(x).__qualname__}"
    return f"a{'n' if qual[:1] in 'aeiou' else ''} {qual}"


def _describe_value(x) -> str:
    if isinstance(x, torch.Tensor):
        dtype = str(x.dtype).replace("torch.", "")
        if x.numel() <= 8 and not x.is_floating_point():
            return f"tensor({x.tolist()})"
        return f"<{dtype} {tuple(x.shape)}>"
    if isinstance(x, (tuple, list)):
        inner = ", ".join(_describe_value(v) for v in x)
        return f"({inner})" if isinstance(x, tuple) else f"[{inner}]"
    if isinstance(x, numbers.Integral) and not isinstance(x, bool) and abs(x) >= 10_000:
        return f"{x:_}"
    return repr(x)


def _describe_call(name: str, case: Case, arg_names: Sequence[str]) -> str:
    parts = []
    for i, a in enumerate(case.args):
        label = f"{arg_names[i]}=" if i < len(arg_names) else ""
        parts.append(label + _describe_value(a))
    parts += [f"{k}={_describe_value(v)}" for k, v in case.kwargs.items()]
    return f"{name}({', '.join(parts)})"


def _learner_line(exc: BaseException) -> str:
    """'in fn, line 3: scores = q @ k.T' for the deepest frame outside torch and mha_course."""
    here = Path(__file__).resolve().parent.parent
    torch_dir = Path(torch.__file__).resolve().parent
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        path = Path(frame.filename).resolve() if frame.filename and not frame.filename.startswith("<") else None
        if path is not None and (path.is_relative_to(here) or path.is_relative_to(torch_dir)):
            continue
        code = (frame.line or "").strip()
        return f"in {frame.name}, line {frame.lineno}" + (f": {code}" if code else "")
    return ""


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------------------------------------
# comparing outputs


def _kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_floating_point:
        return "floating-point"
    if dtype.is_complex:
        return "complex"
    return "integer"


@dataclass(frozen=True)
class _Tol:
    atol: float
    rtol: float


def _compare(got, exp, label: str, tol: _Tol, *, check_dtype: bool = True) -> str | None:
    """None if ``got`` matches ``exp``; else one line saying what differs."""
    if isinstance(exp, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{label} should be a torch.Tensor, got {type_name(got)}"
        if tuple(got.shape) != tuple(exp.shape):
            return f"{label} has shape {tuple(got.shape)}, expected {tuple(exp.shape)}"
        got = got.detach().cpu()
        if check_dtype and _kind(got.dtype) != _kind(exp.dtype):
            values = _compare(got, exp, label, tol, check_dtype=False)
            note = "the values are right" if values is None else "the values are wrong too"
            want = "bool (True = may attend)" if exp.dtype == torch.bool else _kind(exp.dtype)
            return f"{label} has dtype {got.dtype}, expected a {want} tensor ({note})"
        return _compare_values(got, exp, label, tol)
    if isinstance(exp, tuple):
        names = exp.names if hasattr(exp, "names") else [f"{label}[{i}]" for i in range(len(exp))]
        if not isinstance(got, (tuple, list)) or len(got) != len(exp):
            return f"{label} should be a tuple ({', '.join(names)}), got {type_name(got)}"
        for name, g, e in zip(names, got, exp, strict=True):
            problem = _compare(g, e, name, tol, check_dtype=check_dtype)
            if problem:
                return problem
        return None
    if isinstance(exp, numbers.Integral):
        if not check_dtype and isinstance(got, numbers.Real) and not isinstance(got, bool):
            return None if float(got) == float(exp) else f"{label} is {float(got):,}, expected {int(exp):,}"
        if isinstance(got, numbers.Integral) and not isinstance(got, bool):
            return None if int(got) == int(exp) else f"{label} is {int(got):,}, expected {int(exp):,}"
        if isinstance(got, float) and math.isfinite(got) and got.is_integer():
            if int(got) == int(exp):
                return f"{label} is the float {got:,.1f}: the value is right, but return an int (use //, not /)"
            return f"{label} is the float {got:,.1f}, expected the int {int(exp):,} (use //, not /)"
        if isinstance(got, float):
            return f"{label} is the float {got:.6g}, expected the int {int(exp):,}"
        if isinstance(got, torch.Tensor):
            return f"{label} should be a Python int, got {type_name(got)} (use .item())"
        return f"{label} should be an int, got {type_name(got)}"
    if isinstance(exp, float):  # a wrong variant that returns e.g. GiB instead of bytes
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            return f"{label} should be a number, got {type_name(got)}"
        close = math.isclose(float(got), exp, rel_tol=tol.rtol, abs_tol=tol.atol)
        return None if close else f"{label} is {float(got):.6g}, expected {exp:.6g}"
    raise TypeError(f"cannot compare with a reference of type {type(exp).__name__}")  # checker bug


def _compare_values(got: torch.Tensor, exp: torch.Tensor, label: str, tol: _Tol) -> str | None:
    n = exp.numel()
    if exp.dtype == torch.bool or not exp.dtype.is_floating_point:
        if got.is_floating_point() and exp.dtype == torch.bool:
            differ = (got != 0) != exp
        else:
            differ = got.to(torch.float64) != exp.to(torch.float64)
        k = int(differ.sum())
        return None if k == 0 else f"{label} has wrong values: {k} of {n} entries differ"
    g, e = got.to(torch.float64), exp.to(torch.float64)
    bad_nan = torch.isnan(g) & ~torch.isnan(e)
    if bad_nan.any():
        return f"{label} contains NaN at {int(bad_nan.sum())} of {n} entries where a number belongs"
    close = torch.isclose(g, e, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
    if bool(close.all()):
        return None
    err = (g - e).abs().nan_to_num(nan=math.inf).max().item()
    return f"{label} has wrong values: max abs error {err:.3g} ({int((~close).sum())} of {n} entries off)"


class _Named(tuple):
    """A tuple whose elements have names for messages (``out``, ``weights``)."""

    names: tuple[str, ...]

    def __new__(cls, values, names):
        obj = super().__new__(cls, values)
        obj.names = tuple(names)
        return obj


# ---------------------------------------------------------------------------------------------
# running a check


def _clone(x):
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, tuple):
        return tuple(_clone(v) for v in x)
    if isinstance(x, list):
        return [_clone(v) for v in x]
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    return x


def call_learner(fn, case: Case, *, pass_case: bool = False):
    """Call ``fn`` on clones of the case's inputs, without autograd, restoring the global RNG."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        if pass_case:
            return fn(case)
        return fn(*_clone(case.args), **_clone(case.kwargs))


def _structure(out, output_names):
    if isinstance(out, tuple) and output_names is not None and len(output_names) == len(out):
        return _Named(out, output_names)
    return out


def run_check(
    name: str,
    fn,
    cases: Sequence[Case],
    reference: Callable,
    mistakes: Sequence[Mistake] = (),
    *,
    arg_names: Sequence[str] = (),
    output_names: Sequence[str] | None = None,
    output_label: str = "output",
    atol: float = 1e-4,
    rtol: float = 1e-4,
) -> CheckResult:
    """Run ``fn`` on every case, compare with ``reference`` and diagnose the first failure.

    ``arg_names`` name the positional arguments in messages; ``output_names`` name the elements
    of a tuple output ("out", "weights"); ``output_label`` names a single output ("mask").
    Never raises because of the learner's function (a checker's own bug still raises).
    """
    tol = _Tol(atol, rtol)
    label = "your result" if output_names else output_label
    if not callable(fn):
        return CheckResult(False, f"{name}: expected your function, got {type_name(fn)} — pass the function itself")
    runs = []  # (case, expected, got) for every case the learner's function returned from
    failure = None  # (where, call, problem) of the first wrong case
    for i, case in enumerate(cases, start=1):
        where = f"case {i} of {len(cases)}" + (f": {case.description}" if case.description else "")
        call = _describe_call(name, case, arg_names)
        expected = _structure(call_learner(reference, case), output_names)
        try:
            got = call_learner(fn, case)
        except NotImplementedError as exc:
            if i == 1:
                return CheckResult(False, f"{name}: {NOT_ATTEMPTED}", status="not attempted")
            if failure is None:
                return raised_message(name, exc, where, call, extra=" — finish the part this case needs")
            break
        except Exception as exc:  # noqa: BLE001 - report, never raise
            if failure is None:
                batched = any(isinstance(a, torch.Tensor) and a.dim() > 2 for a in case.args)
                return raised_message(name, exc, where, call, batched=batched)
            break
        try:
            problem = _compare(got, expected, label, tol)
        except Exception as exc:  # noqa: BLE001 - an output too strange to compare
            problem = f"could not compare your output ({type(exc).__name__}: {_one_line(exc, 80)})"
        if problem is not None and failure is None:
            failure = (where, call, problem, len(runs))
        runs.append((case, expected, got))
    if failure is None:
        descriptions = [c.description for c in cases if c.description]
        summary = f" ({'; '.join(descriptions)})" if descriptions else ""
        return CheckResult(True, f"{name}: correct on {len(cases)} cases{summary}")
    where, call, problem, index = failure
    diagnosis = _diagnose(runs, index, mistakes, label, tol)
    if diagnosis:
        return CheckResult(False, f"{name}: likely mistake — {diagnosis}", f"{where}\n{call}\n{problem}")
    return CheckResult(False, f"{name}: {problem} ({where})", call)


def learner_raised(name, exc, *, first, where, call):
    """The result for a learner's function that raised ``exc`` on a case: "not attempted" when it is
    the placeholder's NotImplementedError on the first case, else the exception named with its case."""
    if first and isinstance(exc, NotImplementedError):
        return CheckResult(False, f"{name}: {NOT_ATTEMPTED}", status="not attempted")
    return raised_message(name, exc, where, call)


def raised_message(name, exc, where, call, extra="", *, batched=False):
    text = _one_line(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    line = _learner_line(exc)
    details = call + (f"\n{line}" if line else "")
    if batched and isinstance(exc, RuntimeError) and re.search(r"\.T\b", line):
        details += "\nhint: .T reverses ALL dims of a tensor with batch dims; use .transpose(-2, -1)"
    return CheckResult(False, f"{name}: your function raised {text}{extra} ({where})", details)


def _diagnose(runs, index: int, mistakes: Sequence[Mistake], label: str, tol: _Tol) -> str | None:
    """The diagnosis of the first mistake that explains the failing case ``runs[index]``,
    preferring one that also agrees with the learner's output on every other case."""

    def matches(mistake, case, expected, got, *, must_differ):
        try:
            wrong = _structure(
                call_learner(mistake.fn, case, pass_case=mistake.on_case), getattr(expected, "names", None)
            )
            if must_differ and _compare(wrong, expected, label, tol, check_dtype=False) is None:
                return False  # gives the right answer here: no evidence either way
            return _compare(got, wrong, label, tol, check_dtype=False) is None
        except Exception:  # noqa: BLE001 - a variant that cannot run on this case does not match
            return not must_differ

    fallback = None
    for mistake in mistakes:
        if not matches(mistake, *runs[index], must_differ=True):
            continue
        if all(matches(mistake, *run, must_differ=False) for run in runs):
            return mistake.diagnosis
        fallback = fallback or mistake.diagnosis
    return fallback
