"""Self-check quizzes: every notebook has one, every quiz is valid and names sections that exist,
and it renders both ways — static Markdown with collapsible answers, and a widget whose feedback
says ✅ for the correct option and ❌ for the others — in the same order.

And the quizzes are fair: the answer cannot be guessed from where it stands or how long it is.
Read from the files AND from what a learner sees (the static Markdown and the widget, parsed back):

* the correct option's position is spread: no letter holds more than a third of the correct answers,
  course-wide and within every quiz (a quiz has 4–6 questions, so with 4 each letter a–d is correct
  once, with 6 at most twice);
* the correct option is the strictly longest in at most a third of the questions course-wide (and in
  at most ⌈n/3⌉ of a quiz's n), the strictly shortest in at most a third course-wide (over-correcting
  is a tell too), and never far from the distractors' mean length (between 2/3 and 3/2 of it);
* no option hedges ("usually", "typically", …): a hedge marks the cautious, correct-sounding option.
"""

from __future__ import annotations

import copy
import html
import json
import math
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
    assert 4 <= len(questions) <= 6
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
        assert [label for label, _ in radio.options] == [
            f"{chr(97 + j)}) {o['text']}" for j, o in enumerate(q["options"])
        ]
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
    return {"notebook": "99_x", "questions": [copy.deepcopy(question) for _ in range(4)]}


def _two_correct(q):
    q["questions"][1]["options"][1]["correct"] = True


def _none_correct(q):
    q["questions"][0]["options"][0]["correct"] = False


def _no_explanation(q):
    q["questions"][2]["options"][2]["explanation"] = ""


def _no_section(q):
    del q["questions"][0]["section"]


def _too_few(q):
    q["questions"] = q["questions"][:3]


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
        (_too_few, "needs 4–6 questions, has 3"),
        (_too_many, "needs 4–6 questions, has 8"),
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


# ---------------------------------------------------------------------------------------------
# fairness: the answer's position and length, from the files and from what the learner sees

HEDGES = re.compile(r"\b(usually|typically|generally|often|probably|perhaps|in most cases|it depends)\b", re.I)
_OPTION = re.compile(r"^- \*\*([a-z])\)\*\* (.*)$", re.M)
_CORRECT = re.compile(r"Correct: \*\*([a-z])\)\*\*")


def _from_file(data: dict) -> list[tuple[list[str], int]]:
    """(option texts in order, index of the correct one) per question, as the file holds them."""
    return [
        ([o["text"] for o in q["options"]], [o["correct"] for o in q["options"]].index(True)) for q in data["questions"]
    ]


def _from_markdown(text: str) -> list[tuple[list[str], int]]:
    """The same, read back from the static Markdown: the lettered options above each answer block,
    and the letter its 'Correct:' line names."""
    blocks = text.split("<details>")
    found = []
    for question_part, answer_part in zip(blocks[:-1], blocks[1:], strict=True):
        options = _OPTION.findall(question_part.split("</details>")[-1])
        assert [letter for letter, _ in options] == [chr(97 + j) for j in range(len(options))]
        found.append(([t for _, t in options], ord(_CORRECT.search(answer_part).group(1)) - 97))
    return found


def _from_widget(widget) -> list[tuple[list[str], int]]:
    """The same, read back from the widget: each RadioButtons' labels without their letter, and the
    option whose feedback says ✅."""
    found = []
    for radio, note in _radios(widget):
        labels = []
        for j, (label, value) in enumerate(radio.options):
            assert value == j and label.startswith(f"{chr(97 + j)}) "), label
            labels.append(label[3:])
        correct = []
        for j in range(len(labels)):
            radio.value = j
            correct += [j] if "✅ Correct." in note.value else []
        radio.value = None
        assert len(correct) == 1, f"{len(correct)} options say ✅"
        found.append((labels, correct[0]))
    return found


def _rendered(path: Path) -> dict[str, list[tuple[list[str], int]]]:
    data = quiz.load(path.stem)
    return {
        "file": _from_file(data),
        "static Markdown": _from_markdown(quiz.static_markdown(data)),
        "widget": _from_widget(quiz.widget(data)),
    }


def _longest(texts: list[str], answer: int) -> bool:
    return all(len(texts[answer]) > len(t) for j, t in enumerate(texts) if j != answer)


def _shortest(texts: list[str], answer: int) -> bool:
    return all(len(texts[answer]) < len(t) for j, t in enumerate(texts) if j != answer)


def position_problems(questions: list[tuple[list[str], int]]) -> list[str]:
    """Letters that hold more than a third of the correct answers (for 4 or more questions)."""
    n = len(questions)
    counts = {chr(97 + a): sum(answer == a for _, answer in questions) for a in range(6)}
    if n < 4:
        return []
    return [
        f"{letter}) is correct in {c} of {n} questions (at most {n // 3})" for letter, c in counts.items() if 3 * c > n
    ]


def length_problems(questions: list[tuple[list[str], int]], *, per_quiz: bool) -> list[str]:
    """The correct option recognisable by its length: longest in more than a third of the questions
    (per quiz: more than ⌈n/3⌉), shortest in more than a third (course-wide only), or far from the
    distractors' mean length in any single question."""
    n = len(questions)
    longest = sum(_longest(t, a) for t, a in questions)
    shortest = sum(_shortest(t, a) for t, a in questions)
    problems = []
    if per_quiz and longest > math.ceil(n / 3):
        problems.append(f"the correct option is the longest in {longest} of {n} questions (at most {math.ceil(n / 3)})")
    if not per_quiz and 3 * longest > n:
        problems.append(f"the correct option is the longest in {longest} of {n} questions (at most {n // 3})")
    if not per_quiz and 3 * shortest > n:
        problems.append(f"the correct option is the shortest in {shortest} of {n} questions (at most {n // 3})")
    for i, (texts, answer) in enumerate(questions, 1):
        others = [len(t) for j, t in enumerate(texts) if j != answer]
        ratio = len(texts[answer]) / (sum(others) / len(others))
        if per_quiz and not 2 / 3 <= ratio <= 3 / 2:
            problems.append(f"Q{i}: the correct option is {ratio:.2f}× the distractors' mean length (2/3–3/2)")
    return problems


def test_the_fairness_rules_catch_a_quiz_that_always_answers_a_with_the_longest_option():
    fair = [
        (["a long distractor", "the answer, as long", "a third distractor", "a last distractor"], k)
        for k in (1, 3, 0, 2)
    ]
    assert position_problems(fair) == [] and length_problems(fair, per_quiz=True) == []
    always_a = [(["the long, careful and complete answer", "short", "shorter", "brief"], 0)] * 4
    assert position_problems(always_a) == ["a) is correct in 4 of 4 questions (at most 1)"]
    problems = length_problems(always_a, per_quiz=True)
    assert "the correct option is the longest in 4 of 4 questions (at most 2)" in problems
    assert "Q1: the correct option is 6.53× the distractors' mean length (2/3–3/2)" in problems
    shortest = [(["no", "a longer one", "another long one", "a third long one"], 0)] * 3
    assert length_problems(shortest, per_quiz=False) == [
        "the correct option is the shortest in 3 of 3 questions (at most 1)"
    ]
    five = [([f"option {c}" for c in "abcd"], k) for k in (0, 1, 2, 3, 0)]
    assert position_problems(five) == ["a) is correct in 2 of 5 questions (at most 1)"]


@pytest.mark.parametrize("path", QUIZ_FILES, ids=lambda p: p.stem)
def test_static_markdown_and_widget_show_the_file_s_options_in_the_same_order(path):
    views = _rendered(path)
    assert views["static Markdown"] == views["file"]
    assert views["widget"] == views["file"]


@pytest.mark.parametrize("path", QUIZ_FILES, ids=lambda p: p.stem)
def test_within_a_quiz_the_answer_is_not_given_away_by_its_position_or_length(path):
    for view, questions in _rendered(path).items():
        problems = position_problems(questions) + length_problems(questions, per_quiz=True)
        assert problems == [], f"{path.name}, as the {view} shows it: " + "; ".join(problems)


def test_course_wide_the_answer_is_not_given_away_by_its_position_or_length():
    for view in ("file", "static Markdown", "widget"):
        questions = [q for path in QUIZ_FILES for q in _rendered(path)[view]]
        problems = position_problems(questions) + length_problems(questions, per_quiz=False)
        assert problems == [], f"all quizzes, as the {view} shows them: " + "; ".join(problems)


@pytest.mark.parametrize("path", QUIZ_FILES, ids=lambda p: p.stem)
def test_no_option_hedges(path):
    for i, q in enumerate(quiz.load(path.stem)["questions"], 1):
        for o in q["options"]:
            assert not HEDGES.search(o["text"]), f"{path.name} Q{i}: {o['text']!r} hedges"
