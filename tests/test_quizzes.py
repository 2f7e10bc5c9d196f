"""Self-check quizzes: every notebook has one, every quiz is valid and names sections that exist,
and it renders both ways — static Markdown with collapsible answers, and a widget whose feedback
says ✅ for the correct option and ❌ for the others."""

from __future__ import annotations

import copy
import html
import json
import re
from importlib import resources
from pathlib import Path

import pytest

from authoring import notebooks as notebook_tools
from mha_course.kit import quiz

NOTEBOOKS = notebook_tools.numbered_notebooks()
QUIZ_DIR = Path(str(resources.files("mha_course.kit.quizzes")))
QUIZ_FILES = sorted(QUIZ_DIR.glob("[0-9][0-9].json"))


def _notebook(key: str) -> Path:
    matches = [p for p in NOTEBOOKS if p.name.startswith(f"{key}_")]
    assert len(matches) == 1, f"quiz {key}.json: no single notebook {key}_*.ipynb ({matches})"
    return matches[0]


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _headings(path: Path) -> set[str]:
    """The text of every Markdown heading (# … ######) of a notebook, outside code fences."""
    found = set()
    for cell in _cells(path):
        if cell["cell_type"] != "markdown":
            continue
        text = re.sub(r"```.*?```", "", "".join(cell["source"]), flags=re.S)
        found |= {m.group(1).strip() for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_has_a_quiz_file_and_a_quiz_cell(path):
    key = path.name[:2]
    assert (QUIZ_DIR / f"{key}.json").exists(), f"mha_course/kit/quizzes/{key}.json is missing"
    calls = [
        c
        for c in _cells(path)
        if c["cell_type"] == "code" and re.search(rf"""\bmc\.quiz\.show\(\s*["']{key}["']\s*\)""", "".join(c["source"]))
    ]
    assert len(calls) == 1, f'{path.name} needs one code cell with mc.quiz.show("{key}")'


@pytest.mark.parametrize("path", QUIZ_FILES, ids=lambda p: p.stem)
def test_quiz_is_valid_and_names_existing_sections(path):
    data = json.loads(path.read_text(encoding="utf-8"))
    assert quiz.validate(data) == []
    questions = data["questions"]
    assert 3 <= len(questions) <= 5
    notebook = _notebook(path.stem)
    assert data["notebook"] == notebook.stem
    headings = _headings(notebook)
    for i, q in enumerate(questions, 1):
        assert sum(o["correct"] is True for o in q["options"]) == 1, f"Q{i}: exactly one correct option"
        assert all(o["correct"] in (True, False) for o in q["options"]), f"Q{i}: 'correct' must be true/false"
        assert all(o["explanation"].strip() for o in q["options"]), f"Q{i}: every option needs an explanation"
        assert len({o["text"] for o in q["options"]}) == len(q["options"]), f"Q{i}: two options read the same"
        assert q["section"] in headings, f"Q{i}: section {q['section']!r} is not a heading of {notebook.name}"
    assert quiz.load(path.stem) == data == quiz.load(notebook.stem)


@pytest.mark.parametrize("path", QUIZ_FILES, ids=lambda p: p.stem)
def test_static_quiz_shows_every_question_with_a_collapsible_answer(path):
    data = quiz.load(path.stem)
    text = quiz.static_markdown(data)
    assert text.count("<details>") == text.count("</details>") == len(data["questions"])
    blocks = text.split("<details>")
    for i, q in enumerate(data["questions"]):
        question_part, answer_part = blocks[i], blocks[i + 1].split("</details>")[0]
        assert q["question"] in question_part
        assert all(o["text"] in question_part for o in q["options"])
        assert all(o["explanation"] in answer_part for o in q["options"])
        correct = next(j for j, o in enumerate(q["options"]) if o["correct"])
        assert f"Correct: **{chr(97 + correct)})**" in answer_part and q["section"] in answer_part


def _radios(widget):
    import ipywidgets as W

    children = list(widget.children)
    radios = [(i, c) for i, c in enumerate(children) if isinstance(c, W.RadioButtons)]
    return [(radio, children[i + 1]) for i, radio in radios]


@pytest.mark.parametrize("path", QUIZ_FILES, ids=lambda p: p.stem)
def test_quiz_widget_gives_immediate_feedback_per_option(path):
    import ipywidgets as W

    data = quiz.load(path.stem)
    pairs = _radios(quiz.widget(data))
    assert len(pairs) == len(data["questions"])
    for (radio, note), q in zip(pairs, data["questions"], strict=True):
        assert isinstance(note, W.HTML) and note.value == "" and radio.value is None
        assert [label for label, _ in radio.options] == [o["text"] for o in q["options"]]
        for j, option in enumerate(q["options"]):
            radio.value = j
            mark = "✅" if option["correct"] else "❌"
            assert mark in note.value and ({"✅", "❌"} - {mark}).pop() not in note.value
            assert html.escape(option["explanation"]) in note.value


def test_show_displays_the_static_quiz_then_the_widget(monkeypatch):
    import IPython.display
    import ipywidgets as W

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: shown.extend(objs))
    quiz.show(QUIZ_FILES[0].stem)
    assert len(shown) == 2
    assert shown[0].data == quiz.static_markdown(quiz.load(QUIZ_FILES[0].stem))
    assert isinstance(shown[1], W.VBox)


def _good() -> dict:
    option = {"text": "a", "correct": False, "explanation": "because"}
    question = {
        "question": "Q?",
        "section": "1. Somewhere",
        "options": [dict(option, correct=True), dict(option, text="b"), dict(option, text="c")],
    }
    return {"notebook": "99_x", "questions": [copy.deepcopy(question) for _ in range(3)]}


def _two_correct(q):
    q["questions"][1]["options"][1]["correct"] = True


def _none_correct(q):
    q["questions"][0]["options"][0]["correct"] = False


def _no_explanation(q):
    q["questions"][2]["options"][2]["explanation"] = ""


def _no_section(q):
    del q["questions"][0]["section"]


def _too_few(q):
    q["questions"] = q["questions"][:2]


def _too_many(q):
    q["questions"] = q["questions"] * 2


def _one_option(q):
    q["questions"][0]["options"] = q["questions"][0]["options"][:1]


@pytest.mark.parametrize(
    "spoil, words",
    [
        (_two_correct, "question 2 must have exactly one correct option"),
        (_none_correct, "question 1 must have exactly one correct option"),
        (_no_explanation, "question 3 option 3 needs 'text' and 'explanation'"),
        (_no_section, "question 1 needs 'question' and 'section'"),
        (_too_few, "needs 3–5 questions, has 2"),
        (_too_many, "needs 3–5 questions, has 6"),
        (_one_option, "question 1 needs at least 2 options"),
    ],
)
def test_validate_names_each_problem(spoil, words):
    data = _good()
    assert quiz.validate(data) == []
    spoil(data)
    assert words in quiz.validate(data)


def test_load_rejects_an_unknown_notebook():
    with pytest.raises(ValueError, match="nothing for notebook '99' in quizzes"):
        quiz.load("99")
