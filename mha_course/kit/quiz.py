"""Self-check quizzes: multiple-choice questions with an explanation for every option.

The questions of notebook NN live in ``mha_course/kit/quizzes/NN.json``::

    {"notebook": "01_single_head_attention",
     "questions": [{"question": "...", "section": "<a heading of the notebook>",
                    "options": [{"text": "...", "correct": true, "explanation": "..."}, ...]}]}

``show("01")`` displays a static version first (questions, with the answers in collapsible
blocks: what GitHub, nbviewer and a printed page show), then an ipywidgets quiz that gives
immediate feedback on each choice (the API common to ipywidgets 7 and 8). Both show the options
in the file's order, lettered a), b), c), …, so a reader of either sees the same quiz; the files
spread the correct option's position over the letters (tests/test_quizzes.py checks it).
"""

from __future__ import annotations

import html

from ..i18n import tr
from . import course_data


def load(notebook: str) -> dict:
    """The quiz of notebook ``notebook`` ("01" or "01_single_head_attention"), validated."""
    return course_data.read("quizzes", notebook, validate)


def validate(quiz: dict) -> list[str]:
    """Problems with a quiz's structure (empty list when it is fine)."""
    problems = []
    questions = quiz.get("questions", [])
    if not 4 <= len(questions) <= 6:
        problems.append(f"needs 4–6 questions, has {len(questions)}")
    for i, q in enumerate(questions, 1):
        if not q.get("question") or not q.get("section"):
            problems.append(f"question {i} needs 'question' and 'section'")
        options = q.get("options", [])
        if len(options) < 2:
            problems.append(f"question {i} needs at least 2 options")
        if sum(bool(o.get("correct")) for o in options) != 1:
            problems.append(f"question {i} must have exactly one correct option")
        for j, o in enumerate(options, 1):
            if not o.get("text") or not o.get("explanation"):
                problems.append(f"question {i} option {j} needs 'text' and 'explanation'")
    return problems


def letter(index: int) -> str:
    """The letter of option ``index`` (0 -> "a"), the same in the static quiz and the widget."""
    return chr(97 + index)


def static_markdown(quiz: dict) -> str:
    """The quiz as Markdown: each question, its options, and a collapsible answer."""
    lines = [tr("**Self-check quiz** (the interactive version is below when a kernel runs)", "quiz"), ""]
    for i, q in enumerate(quiz["questions"], 1):
        lines += [f"**Q{i}.** {q['question']}", ""]
        lines += [f"- **{letter(j)})** {o['text']}" for j, o in enumerate(q["options"])]
        answer = next(j for j, o in enumerate(q["options"]) if o["correct"])
        lines += ["", f"<details><summary>{tr('Answer', 'quiz')}</summary>", ""]
        right, wrong = tr("✅ right", "quiz"), tr("❌ wrong", "quiz")
        lines += [
            f"- **{letter(j)})** {right if o['correct'] else wrong} — {o['explanation']}"
            for j, o in enumerate(q["options"])
        ]
        correct = tr("Correct: **{letter})** — see *{section}*.", "quiz", letter=letter(answer), section=q["section"])
        lines += ["", correct, "", "</details>", ""]
    return "\n".join(lines)


def feedback(question: dict, choice: int | None) -> str:
    """HTML feedback for picking option ``choice`` (index) of ``question``; '' when none picked."""
    if choice is None:
        return ""
    o = question["options"][choice]
    mark, colour = (tr("✅ Correct.", "quiz"), "green") if o["correct"] else (tr("❌ Not quite.", "quiz"), "firebrick")
    return f'<span style="color:{colour}"><b>{mark}</b></span> {html.escape(o["explanation"])}'


def widget(quiz: dict):
    """An ipywidgets VBox: per question a RadioButtons and a feedback line updated on change."""
    import ipywidgets as W

    rows = []
    for i, q in enumerate(quiz["questions"], 1):
        labels = [f"{letter(j)}) {o['text']}" for j, o in enumerate(q["options"])]
        radio = W.RadioButtons(
            options=[(t, j) for j, t in enumerate(labels)], value=None, layout=W.Layout(width="auto")
        )
        note = W.HTML("")

        def on_change(change, q=q, note=note):
            note.value = feedback(q, change["new"])

        radio.observe(on_change, names="value")
        rows += [W.HTML(f"<b>Q{i}.</b> {html.escape(q['question'])}"), radio, note]
    return W.VBox(rows)


def show(notebook: str) -> None:
    """Display the static quiz (Markdown), then the interactive one."""
    from IPython.display import Markdown, display

    quiz = load(notebook)
    display(Markdown(static_markdown(quiz)))
    display(widget(quiz))
