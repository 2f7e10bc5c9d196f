"""A hint ladder's last rung is an approach, not the solution dictated in words.

``tests/test_hint_ladders.py`` catches a rung that repeats a line of the solution's code; this file
catches the other way of handing the answer over: a rung that names, one after another, every
operation the solution performs ("take the softmax, subtract the row sum, multiply by the weights,
…"), so that the learner only transcribes. The operations of a solution are read from its code
(the functions and methods it calls, and ``@``); a rung *names* one when it uses one of the words
that say it in prose. A last rung that names at least :data:`DICTATED` of three or more operations
dictates the solution: it should say what to compute and leave how to the learner.
"""

from __future__ import annotations

import ast
import json
import textwrap

import pytest

from authoring import notebooks as notebook_tools
from authoring import student_edition as se

ROOT = notebook_tools.ROOT
HINT_FILES = sorted((ROOT / "mha_course" / "kit" / "hints").glob("[0-9][0-9].json"))
DICTATED = 0.75  # a last rung naming this share of the solution's operations dictates it
MIN_OPERATIONS = 3  # a solution of one or two operations has no steps to leave out

#: words that name an operation in prose (an operation not listed is named by its own name)
WORDS = {
    "matmul": ("@", "matmul", "product", "times", "multiply", "contract"),
    "softmax": ("softmax",),
    "exp": ("exp", "e^", "exponential"),
    "log": ("log",),
    "logsumexp": ("logsumexp", "log-sum-exp", "log of the sum"),
    "sum": ("sum", "add up", "adds up", "total"),
    "mean": ("mean", "average"),
    "transpose": ("transpose", "swap", "swapping"),
    "view": ("view", "reshape"),
    "reshape": ("reshape", "view"),
    "flatten": ("flatten", "reshape", "merge"),
    "masked_fill": ("fill", "-inf", "−inf", "minus infinity"),
    "where": ("where", "replace", "made 0", "use 0"),
    "topk": ("top", "largest", "highest"),
    "scatter": ("scatter", "put true", "mark"),
    "sigmoid": ("sigmoid", "σ"),
    "tanh": ("tanh",),
    "sqrt": ("sqrt", "√", "square root"),
    "amax": ("max", "larg"),
    "max": ("max", "larg"),
    "maximum": ("max", "larg"),
    "cat": ("cat", "join", "concat"),
    "stack": ("stack",),
    "repeat_interleave": ("repeat",),
    "expand": ("expand", "broadcast"),
    "unsqueeze": ("unsqueeze", "trailing axis", "new axis", "broadcast"),
    "chunk": ("chunk", "half", "halves", "split"),
    "clamp": ("clamp", "clip"),
    "arange": ("arange", "integers from", "positions"),
    "unique": ("unique", "distinct"),
    "copy_": ("copy", "put"),
    "zero_": ("zero",),
    "backward": ("backprop", "backward"),
    "abs": ("abs",),
    "tril": ("tril", "lower triangle", "below the diagonal"),
    "outer": ("outer",),
    "einsum": ("einsum",),
    "linear": ("project", "linear"),
    "multiply": ("times", "multipl", "product"),
    "subtract": ("minus", "subtract", "difference"),
    "divide": ("divide", "divided"),
    "floor_divide": ("divided", "rounded down", "integer division"),
    "add": ("plus", "add"),
    "slice": ("slice", "up to", "from position", "the last", "the first"),
}
BINARY = {ast.Mult: "multiply", ast.Sub: "subtract", ast.Div: "divide", ast.FloorDiv: "floor_divide", ast.Add: "add"}
#: calls that are bookkeeping, not steps of the computation
IGNORED = {"shape", "size", "len", "range", "int", "float", "bool", "tensor", "to", "dim", "item", "tolist",
           "isinstance", "enumerate", "zip", "list", "tuple", "dict", "append", "super", "no_grad", "contiguous",
           "clone", "detach", "type_as", "new_zeros", "zeros", "ones", "empty", "full", "zeros_like", "ones_like",
           "requires_grad_", "print", "min", "float64", "double", "long", "equal", "allclose"}  # fmt: skip


def operations(solution) -> set[str]:
    """The distinct operations a solution's code performs: the names of the functions and methods
    it calls (``torch.softmax`` and ``x.softmax`` are both ``softmax``), ``@`` as ``matmul``, the
    arithmetic operators, and slices with a bound."""
    source = textwrap.dedent("\n".join(line for line in solution))
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a region inside a class body, say: parse it as the body of a function
        tree = ast.parse("def _():\n" + textwrap.indent(source, "    "))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            found.add("matmul")
        elif isinstance(node, ast.BinOp) and type(node.op) in BINARY:
            found.add(BINARY[type(node.op)])
        elif isinstance(node, ast.Slice) and (node.lower is not None or node.upper is not None):
            found.add("slice")
        elif isinstance(node, ast.Call):
            f = node.func
            # methods and torch's functions; a bare name is the learner's own argument (layer, loss_fn)
            name = (
                f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) and f.id in WORDS else None
            )
            if name and name not in IGNORED and not name[0].isupper():
                found.add({"bmm": "matmul", "mm": "matmul", "matmul": "matmul"}.get(name, name))
    return found


def named(operation: str, rung: str) -> bool:
    text = rung.lower()
    return any(word in text for word in WORDS.get(operation, (operation.lower().rstrip("_"),)))


def dictated(solution, rung: str) -> list[str] | None:
    """The operations ``rung`` names, when they are at least DICTATED of three or more; else None."""
    ops = operations(solution)
    said = sorted(op for op in ops if named(op, rung))
    if len(ops) >= MIN_OPERATIONS and len(said) >= DICTATED * len(ops):
        return said
    return None


SOLUTION = (
    "    c = (weights * grad_weights).sum(dim=-1, keepdim=True)",
    "    out = weights * (grad_weights - c)",
    "    scores = torch.softmax(q @ k.transpose(-2, -1), dim=-1)",
)


def test_operations_are_read_from_the_code():
    assert operations(SOLUTION) == {"sum", "softmax", "matmul", "transpose", "multiply", "subtract"}
    assert operations(("    return x.view(B, L, h, d).transpose(1, 2)",)) == {"view", "transpose"}


def test_a_rung_that_dictates_every_operation_is_flagged():
    rung = "Sum weights times grad over the keys, subtract it; transpose k, take the product with q and the softmax."
    assert dictated(SOLUTION, rung) == ["matmul", "multiply", "softmax", "subtract", "sum", "transpose"]


def test_an_approach_is_not_flagged():
    rung = "The gradient of a row depends on how far each upstream gradient sits from their weighted mean."
    assert dictated(SOLUTION, rung) is None


@pytest.mark.parametrize("path", HINT_FILES, ids=lambda p: p.stem)
def test_no_last_rung_dictates_the_solution(path):
    by_number = {e.number: e for e in se.exercises()}
    found = []
    for number, entry in json.loads(path.read_text(encoding="utf-8")).items():
        exercise = by_number.get(number)
        if exercise is None:
            continue  # tests/test_hint_ladders.py names a ladder without an exercise
        said = dictated(exercise.solution, entry["ladder"][-1])
        if said:
            found.append(f"{number}: the last rung names {', '.join(said)} of {sorted(operations(exercise.solution))}")
    assert found == [], "these last rungs dictate the solution; give the approach instead:\n" + "\n".join(found)
