"""Hint ladders stop short of the answer: no rung of any ladder repeats a line of its exercise's
solution (the code between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` in the solved notebook).

What counts as "a line of the solution": every logical line of the region (a statement continued
over several physical lines is one line), comments dropped, compared with whitespace removed and
quotes unified, so ``q@k.transpose(-2,-1)`` and ``q @ k.transpose(-2, -1)`` are the same line. Of
each line both the whole statement and its right-hand side (what follows ``return`` or the ``=`` of
an assignment) are looked for in the rung, because "the answer is ``x.repeat_interleave(n_rep,
dim=1)``" gives the line away as surely as the line itself.

Trivial pieces are left out: ``pass``, ``return out``, ``heads = []``, ``B, L, d = x.shape``,
``if mask is not None:`` — anything shorter than 12 characters without spaces, with fewer than 3
names and numbers (``weights + biases``), or made only of names and keywords (plain words).

A rung gives a piece away when it repeats at least 75 % of it in order (runs of 4 characters or
more) and at least 60 % of its operators and brackets; ``×``, ``·`` and ``−`` read as ``*`` and
``-``. So ``torch.f(x)`` for ``x.f()`` does not hide a line, and prose that names the same
variables ("weights times v, and the weights") is not code.
"""

from __future__ import annotations

import difflib
import io
import json
import keyword
import re
import textwrap
import tokenize

import pytest

from authoring import notebooks as notebook_tools
from authoring import student_edition as se
from mha_course.kit import hint_ladder as hints

ROOT = notebook_tools.ROOT
HINT_FILES = sorted((ROOT / "mha_course" / "kit" / "hints").glob("[0-9][0-9].json"))
MIN_CHARS = 12  # a piece of code shorter than this (spaces removed) gives nothing away
MIN_OPERANDS = 3  # ... and so does one with fewer names and numbers than this (``weights + biases``)
COVERED = 0.75  # a rung that repeats this share of a piece, in order, gives the piece away ...
COVERED_SYMBOLS = 0.6  # ... when it repeats this share of the piece's operators and brackets too
_WORDS_ONLY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SHAPE = re.compile(r"(?:[A-Za-z_]\w*,)*[A-Za-z_]\w*=[A-Za-z_]\w*\.shape")


_MATH = str.maketrans({"×": "*", "·": "*", "−": "-", "'": '"'})


def _squash(text: str) -> str:
    """``text`` without whitespace and backticks, with one kind of quote and ASCII operators."""
    return re.sub(r"[\s`]+", "", text).translate(_MATH)


def _covered(piece: str, rung: str) -> tuple[float, float]:
    """The share of ``piece`` that ``rung`` repeats in order, counting runs of 4 characters or more
    (so ``torch.repeat_interleave(x, n_rep, dim=1)`` covers ``x.repeat_interleave(n_rep, dim=1)``);
    and the share of its operators and brackets alone, so that prose naming the same variables
    ("weights times v, and the weights") does not count as code."""
    matcher = difflib.SequenceMatcher(None, piece, rung, autojunk=False)
    hit = [False] * len(piece)
    for block in matcher.get_matching_blocks():
        if block.size >= 4:
            hit[block.a : block.a + block.size] = [True] * block.size
    symbols = [i for i, c in enumerate(piece) if not (c.isalnum() or c == "_")]
    return sum(hit) / len(piece), (sum(hit[i] for i in symbols) / len(symbols) if symbols else 1.0)


def gives_away(piece: str, rung: str) -> bool:
    """Whether ``rung`` (squashed) repeats most of ``piece``: its characters and its operators."""
    chars, symbols = _covered(piece, rung)
    return chars >= COVERED and symbols >= COVERED_SYMBOLS


ASSIGN = {"=", "+=", "-=", "*=", "/=", "//=", "%=", "**=", "@=", "&=", "|=", "^=", ">>=", "<<=", ":="}
SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER, tokenize.ENCODING}


def _logical_lines(solution) -> list[list[str]]:
    """The region's statements, one token list per logical line, comments dropped."""
    source = textwrap.dedent("\n".join(solution)) + "\n"
    lines, current = [], []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NEWLINE:
            if current:
                lines.append(current)
            current = []
        elif tok.type not in SKIP:
            current.append(tok.string)
    return lines


def _right_hand_side(tokens: list[str]) -> list[str] | None:
    """What follows ``return`` or the first top-level assignment operator; None when neither."""
    if tokens[0] == "return":
        return tokens[1:]
    if keyword.iskeyword(tokens[0]):
        return None
    depth = 0
    for i, t in enumerate(tokens):
        depth += t in ("(", "[", "{")
        depth -= t in (")", "]", "}")
        if depth == 0 and t in ASSIGN:
            return tokens[i + 1 :]
    return None


def _operands(tokens: list[str]) -> int:
    """How many names (keywords excluded) and numbers ``tokens`` hold."""
    return sum((t.isidentifier() and not keyword.iskeyword(t)) or t[:1].isdigit() for t in tokens)


def _is_trivial(tokens: list[str]) -> bool:
    """Gives nothing away: shorter than MIN_CHARS, fewer than MIN_OPERANDS names and numbers
    (``weights + biases``, ``head_outputs.clone()``), or only names and keywords run together
    (``if mask is not None``: plain words)."""
    piece = _squash("".join(tokens))
    if _SHAPE.fullmatch(piece):  # B, L, d = x.shape: reading the sizes gives nothing away
        return True
    return len(piece) < MIN_CHARS or _operands(tokens) < MIN_OPERANDS or _WORDS_ONLY.fullmatch(piece) is not None


def solution_pieces(solution) -> list[str]:
    """What a rung must not contain: each non-trivial statement of the region and its right-hand side."""
    pieces = []
    for tokens in _logical_lines(solution):
        statement = tokens[:-1] if tokens[-1] == ":" else tokens
        for candidate in (statement, _right_hand_side(tokens)):
            if candidate and not _is_trivial(candidate):
                pieces.append(_squash("".join(candidate)))
    return list(dict.fromkeys(pieces))


def leaks(ladders: dict, exercises) -> list[str]:
    """'N.M rung k: <piece>' for every rung that contains a solution piece of exercise N.M."""
    by_number = {e.number: e for e in exercises}
    found = []
    for number, entry in ladders.items():
        exercise = by_number.get(number)
        if exercise is None:
            found.append(f"{number}: a ladder for an exercise the notebooks do not have")
            continue
        pieces = solution_pieces(exercise.solution)
        for k, rung in enumerate(entry["ladder"], 1):
            squashed = _squash(rung)
            found += [f"{number} rung {k}: {p}" for p in pieces if gives_away(p, squashed)]
    return found


# ---------------------------------------------------------------------------------------------
# the comparison itself


SOLUTION = (
    "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., Lq, Lk)",
    "    if mask is not None:",
    "        scores = scores.masked_fill(~mask,",
    "                                    -math.inf)  # a statement over two lines",
    "    out = torch.softmax(scores, dim=-1) @ v",
    "    return out",
    "    pass",
)


def test_solution_pieces_are_statements_and_their_right_hand_sides_without_trivia():
    pieces = solution_pieces(SOLUTION)
    assert "scores=q@k.transpose(-2,-1)/math.sqrt(q.shape[-1])" in pieces
    assert "q@k.transpose(-2,-1)/math.sqrt(q.shape[-1])" in pieces
    assert "scores.masked_fill(~mask,-math.inf)" in pieces  # joined over its two physical lines
    assert "torch.softmax(scores,dim=-1)@v" in pieces
    assert not any(p.startswith(("returnout", "pass", "if")) for p in pieces)
    assert all("#" not in p for p in pieces)
    one_line = solution_pieces(("    return ~mask, ~pad[:, 0, 0, :]",))
    assert one_line == ["return~mask,~pad[:,0,0,:]", "~mask,~pad[:,0,0,:]"]


@pytest.mark.parametrize(
    "rung",
    [
        "scores = q@k.transpose(-2,-1) / math.sqrt(q.shape[-1]), then the mask",  # spacing differs
        "the masked scores are `scores.masked_fill(~mask, -math.inf)`",  # right-hand side in backticks
        "Finally: out = torch.softmax(scores,  dim=-1) @ v.",
        "scores = q @ torch.transpose(k, -2, -1) / math.sqrt(q.shape[-1])",  # the same line, reworded
        "scores = q @ k.transpose(−2, −1) / math.sqrt(q.shape[−1])",  # typographic minus signs
    ],
)
def test_a_rung_that_repeats_a_solution_line_is_flagged(rung):
    exercise = se.Exercise("5.1", "05_toy", 1, "f", "f", SOLUTION)
    assert leaks({"5.1": {"function": "f", "ladder": ["idea", "approach", rung]}}, [exercise])


@pytest.mark.parametrize(
    "rung",
    [
        "If mask is not None, set the scores it forbids to minus infinity; return out at the end.",
        "Transpose the keys in their last two dims, divide by the square root of d_k, softmax over the keys.",
        "scores = Q Kᵀ / √d_k; fill the forbidden entries with -inf; weights = softmax over the last dim.",
        "The output is the softmax of the scores, dim -1, times v: out = weights times v.",  # names, no code
    ],
)
def test_a_rung_in_words_or_pseudo_code_is_not_flagged(rung):
    exercise = se.Exercise("5.1", "05_toy", 1, "f", "f", SOLUTION)
    assert leaks({"5.1": {"function": "f", "ladder": ["idea", "approach", rung]}}, [exercise]) == []


def test_a_ladder_without_an_exercise_is_named():
    assert leaks({"9.9": {"function": "f", "ladder": ["a", "b", "c"]}}, []) == [
        "9.9: a ladder for an exercise the notebooks do not have"
    ]


# ---------------------------------------------------------------------------------------------
# every ladder of the course


@pytest.mark.parametrize("path", HINT_FILES, ids=lambda p: p.stem)
def test_no_rung_of_a_ladder_is_a_line_of_its_solution(path):
    ladders = json.loads(path.read_text(encoding="utf-8"))
    assert hints.validate(ladders) == []
    found = leaks(ladders, se.exercises())
    assert found == [], (
        f"{path.name}: these rungs repeat a line of the solution; say the approach in words or "
        "pseudo-code instead:\n" + "\n".join(found)
    )


@pytest.mark.parametrize("path", HINT_FILES, ids=lambda p: p.stem)
def test_each_ladder_belongs_to_the_function_of_its_exercise(path):
    by_number = {e.number: e for e in se.exercises()}
    for number, entry in json.loads(path.read_text(encoding="utf-8")).items():
        assert number in by_number, f"{path.name}: {number} is not an exercise of the notebooks"
        assert entry["function"] == by_number[number].function, f"{path.name}: {number} names {entry['function']}"
