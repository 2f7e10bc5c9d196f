"""Predict, then run: a question asked before an experiment whose output answers it.

The questions of notebook NN live in ``mha_course/kit/predictions/NN.json``::

    {"blur": {"question": "...", "options": ["...", "..."], "answer": 1,          # pick one
              "settled_by": {"cell": "lookup(q_both)", "says": "0.450, 0.450"}},
     "cache": {"question": "...", "unit": "GiB", "answer": 1.0,                   # a number
               "settled_by": {"cell": "cache_bytes(", "says": "1.00 GiB"}}}

``gives_away`` lists short phrases that would answer the question (tests/test_spoilers.py checks
that none appears in README.md, the course map, an earlier notebook, or its own notebook above
the prompt). ``answer`` is the index of the right option (0 = a) or the number; ``settled_by`` names the code
cell after the prompt whose output settles the question (a substring of its source, ``cell``) and
what that output says (a substring of its stored text, ``says``). The tests check that the cell
exists, that its output says so, and that nothing above the prompt gives the answer away.

``predict("01", "blur")`` shows the question as Markdown (what GitHub, nbviewer and a printed page
show) and, in a live kernel, a widget that records the learner's prediction. It never shows the
answer: the next cell's output does, and a learner compares it with what they recorded
(``recorded()`` holds the predictions of this session).
"""

from __future__ import annotations

from ..i18n import tr
from . import course_data

_recorded: dict[tuple[str, str], object] = {}


def load(notebook: str) -> dict:
    """The prediction questions of notebook ``notebook`` ("01"), validated."""
    return course_data.read("predictions", notebook, validate)


def validate(questions: dict) -> list[str]:
    """Problems with a predictions file (empty when it is fine)."""
    problems = []
    for key, q in questions.items():
        if not isinstance(q, dict) or not q.get("question"):
            problems.append(f"{key}: needs a 'question'")
            continue
        options, unit = q.get("options"), q.get("unit")
        if (options is None) == (unit is None):
            problems.append(f"{key}: needs either 'options' (multiple choice) or 'unit' (a number), not both")
        elif options is not None and (len(options) < 2 or not all(isinstance(o, str) and o for o in options)):
            problems.append(f"{key}: needs at least 2 non-empty options")
        problems += _answer_problems(key, q)
        gives_away = q.get("gives_away", [])
        if not isinstance(gives_away, list) or not all(isinstance(g, str) and g.strip() for g in gives_away):
            problems.append(f"{key}: 'gives_away' must be a list of non-empty phrases, got {gives_away!r}")
    return problems


def _answer_problems(key: str, q: dict) -> list[str]:
    """Problems with a question's 'answer' and 'settled_by', when it has them (the tests require both)."""
    problems = []
    if "answer" in q:
        answer, options = q["answer"], q.get("options")
        if isinstance(answer, bool) or not isinstance(answer, int | float):
            problems.append(f"{key}: 'answer' must be a number, got {type(answer).__name__}")
        elif options is not None and not (isinstance(answer, int) and 0 <= answer < len(options)):
            problems.append(f"{key}: 'answer' must be an option index 0..{len(options) - 1}, got {answer!r}")
    if "settled_by" in q:
        settled = q["settled_by"]
        if not isinstance(settled, dict) or set(settled) != {"cell", "says"}:
            problems.append(f"{key}: 'settled_by' must be {{'cell': ..., 'says': ...}}, got {settled!r}")
        elif not all(isinstance(v, str) and v.strip() for v in settled.values()):
            problems.append(f"{key}: 'settled_by' needs a non-empty 'cell' and 'says' (strings)")
    return problems


def static_markdown(question: dict) -> str:
    """The question as Markdown, with its options (or the unit of the number to predict)."""
    lines = [tr("**Predict, then run.** {question}", "prediction", question=question["question"]), ""]
    if question.get("options"):
        lines += [f"- **{chr(97 + j)})** {o}" for j, o in enumerate(question["options"])]
    else:
        lines += [
            tr("Write down a number (in {unit}) before you run the next cell.", "prediction", unit=question["unit"])
        ]
    lines += ["", tr("*Decide first; the next cell's output settles it.*", "prediction")]
    return "\n".join(lines)


def record(notebook: str, key: str, value) -> str:
    """Remember a prediction and return the line the widget shows."""
    _recorded[(notebook, key)] = value
    return tr("Recorded: {value}. Now run the next cell and compare.", "prediction", value=value)


def recorded() -> dict[tuple[str, str], object]:
    """(notebook, key) -> the prediction recorded in this session."""
    return dict(_recorded)


def widget(notebook: str, key: str, question: dict):
    """Controls that record a prediction (the API common to ipywidgets 7 and 8)."""
    import ipywidgets as W

    if question.get("options"):
        choice = W.RadioButtons(
            options=[(f"{chr(97 + j)}) {o}", j) for j, o in enumerate(question["options"])],
            value=None,
            layout=W.Layout(width="auto"),
        )
    else:
        choice = W.FloatText(value=0.0, description=question["unit"], layout=W.Layout(width="auto"))
    note = W.HTML("")
    button = W.Button(description=tr("Record my prediction", "prediction"), layout=W.Layout(width="auto"))

    def on_click(_):
        value = choice.value
        if question.get("options"):
            if value is None:
                note.value = tr("Pick an option first.", "prediction")
                return
            value = f"{chr(97 + value)}) {question['options'][value]}"
        else:
            value = f"{value:g} {question['unit']}"
        note.value = record(notebook, key, value)

    button.on_click(on_click)
    box = W.VBox([choice, W.HBox([button, note])])
    box.record = on_click  # lets a test press the button
    return box


def predict(notebook: str, key: str) -> None:
    """Show prediction ``key`` of notebook ``notebook``: the question (Markdown), then the controls."""
    from IPython.display import Markdown, display

    questions = load(notebook)
    if key not in questions:
        raise ValueError(f"no prediction {key!r} for notebook {notebook} (have {sorted(questions)})")
    display(Markdown(static_markdown(questions[key])))
    display(widget(notebook.split("_")[0], key, questions[key]))
