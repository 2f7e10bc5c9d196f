"""No prediction is answered before it is asked — anywhere in the course.

Every "predict, then run" question (``mha_course/kit/predictions/NN.json``) lists in
``"gives_away"`` the short phrases that would answer it ("every head reads every token", "NaN").
None of them may appear in what a learner reads before the prompt:

* README.md and the course map (``mha_course.kit.course_map``: the table README and notebook 00
  show) — a map describes the questions a notebook asks, not their answers;
* any earlier notebook, Markdown and stored text outputs alike (a quiz's answers are outputs);
* the prompt's own notebook above the prompt, headings included.

Phrases are compared as words and numbers, case-insensitively ("0.450, 0.450" = "0.450 / 0.450").
Spoilers in notebooks whose prose is being rewritten elsewhere are listed, cell by cell, in
``KNOWN_SPOILERS``; those cases are expected to fail (strict xfail) until the cells are fixed,
and the entry is then removed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from authoring import notebooks as notebook_tools
from mha_course.kit import course_map, predict
from tests.test_assessments import _contains as contains
from tests.test_assessments import _output_text
from tests.test_assessments import _tokens as tokens

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = notebook_tools.numbered_notebooks()
PREDICT_CALL = re.compile(r"""mc\.predict\(\s*["'](\d\d)["']\s*,\s*["']([\w-]+)["']\s*\)""")

#: (notebook, prediction) -> where a phrase of its "gives_away" still stands before the prompt.
KNOWN_SPOILERS: dict[tuple[str, str], str] = {}


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _text(cell: dict) -> str:
    """What a learner reads of a cell: Markdown source, or a code cell's stored text outputs."""
    return "".join(cell["source"]) if cell["cell_type"] == "markdown" else _output_text(cell)


def _prompts() -> list[tuple[Path, int, str, str]]:
    found = []
    for path in NOTEBOOKS:
        for index, cell in enumerate(_cells(path)):
            if cell["cell_type"] == "code":
                found += [(path, index, m[1], m[2]) for m in PREDICT_CALL.finditer("".join(cell["source"]))]
    return found


PROMPTS = _prompts()


def sources_before(path: Path, index: int) -> dict[str, str]:
    """Everything a learner may have read before the prompt in cell ``index`` of ``path``, by name."""
    found = {
        "README.md": (ROOT / "README.md").read_text(encoding="utf-8"),
        "the course map": course_map.course_map_markdown(),
    }
    for other in NOTEBOOKS:
        if other.name[:2] < path.name[:2]:
            for i, cell in enumerate(_cells(other)):
                found[f"{other.stem} cell {i}"] = _text(cell)
    for i, cell in enumerate(_cells(path)[:index]):
        found[f"{path.stem} cell {i} (above the prompt)"] = _text(cell)
    return found


def spoilers(gives_away: list[str], sources: dict[str, str]) -> list[str]:
    """'<source>: <phrase>' for every phrase found in a source."""
    read = {name: tokens(text) for name, text in sources.items()}
    return [
        f"{name}: {phrase!r}"
        for phrase in gives_away
        for name, words in read.items()
        if contains(words, tokens(phrase))
    ]


def _param(path, index, notebook, key):
    reason = KNOWN_SPOILERS.get((notebook, key))
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(path, index, notebook, key, marks=marks, id=f"{notebook}-{key}")


# ---------------------------------------------------------------------------------------------


def test_the_spoiler_finder_reads_words_not_characters():
    sources = {"map": "Heads see the whole sequence.", "cell 3": "weights: 0.450 / 0.450", "cell 4": "a band"}
    assert spoilers(["heads see the whole sequence", "0.450, 0.450", "NaN"], sources) == [
        "map: 'heads see the whole sequence'",
        "cell 3: '0.450, 0.450'",
    ]
    assert spoilers(["band of tokens"], sources) == []  # a phrase, not its words one by one


def test_every_prediction_lists_what_would_give_it_away():
    for path in NOTEBOOKS:
        for key, q in predict.course_data.read("predictions", path.stem, predict.validate, missing_ok=True).items():
            assert q.get("gives_away"), f"predictions/{path.stem[:2]}.json: {key} needs a 'gives_away' list"
    assert predict.validate({"a": {"question": "?", "unit": "GiB", "gives_away": "1 GiB"}})  # not a list


def test_every_prediction_is_asked_and_the_known_spoilers_name_real_prompts():
    asked = {(notebook, key) for _, _, notebook, key in PROMPTS}
    assert len(asked) == len(PROMPTS) >= 21
    assert set(KNOWN_SPOILERS) <= asked


def test_the_sources_are_read_in_course_order():
    path, index, notebook, key = next(p for p in PROMPTS if p[2] == "10")
    names = sources_before(path, index)
    assert "README.md" in names and "the course map" in names
    assert any(n.startswith("09_") for n in names) and not any(n.startswith("11_") for n in names)
    assert f"{path.stem} cell {index - 1} (above the prompt)" in names
    assert f"{path.stem} cell {index} (above the prompt)" not in names


@pytest.mark.parametrize("path,index,notebook,key", [_param(*p) for p in PROMPTS])
def test_no_prediction_is_answered_before_it_is_asked(path, index, notebook, key):
    q = predict.load(notebook)[key]
    assert spoilers(q["gives_away"], sources_before(path, index)) == []
