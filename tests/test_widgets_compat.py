"""The explorers and quizzes with the ipywidgets that is installed: 8 in the course's environment
(JupyterLab 4), 7.7 on Colab. .ci/run runs this file a second time in an environment with
``ipywidgets==7.7.*`` (and ``MHA_EXPECT_IPYWIDGETS=7.7``, so that it cannot silently test 8).

* quizzes: every quiz's widget is built and each option of each question is picked the way the
  front end does it (a state update of ``index``): the feedback line must say ✅ for the correct
  option and ❌ for the others, with that option's explanation;
* explorers: every control of every explorer is changed the way the front end does it (a state
  update) inside the student edition's run of its notebook (tests/test_student_edition.py and
  tests/explorer_driver.py), or, where the session runs that notebook in JupyterLab, by the
  browser (tests/browser/test_jupyterlab.py, the same spy in the kernel): the explorer must
  redraw once, with the current values of all its controls, and the figure must change; no
  callback may raise. This file checks that every notebook with an explorer is driven there, that
  the driver is not blind, and that a front end's rounding of a value draws nothing.
"""

from __future__ import annotations

import html
import json
import os
import sys
import warnings
from pathlib import Path

import ipywidgets as W
import pytest
from packaging.requirements import Requirement
from packaging.version import Version

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script too: the repository's tools
from authoring import notebooks as notebook_tools  # noqa: E402
from mha_course.kit import quiz

pytestmark = pytest.mark.slow  # pip plans and second interpreters: not in `course.py test --fast`

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
QUIZZES = sorted(p.stem for p in (ROOT / "mha_course" / "kit" / "quizzes").glob("*.json"))
VERSION = Version(W.__version__)


def _code_cells(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code" and "".join(c["source"]).strip()]


EXPLORER_NOTEBOOKS = [p for p in notebook_tools.numbered_notebooks() if any("explorer(" in s for s in _code_cells(p))]


def test_ipywidgets_version_is_supported():
    expected = os.environ.get("MHA_EXPECT_IPYWIDGETS")
    if expected:
        assert W.__version__.startswith(expected), f"this run should test ipywidgets {expected}, has {W.__version__}"
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    spec = next(r for r in map(Requirement, dependencies) if r.name == "ipywidgets")
    assert spec.specifier.contains(VERSION), f"ipywidgets {VERSION} is outside the course's range {spec}"
    assert VERSION.major in (7, 8), f"the course uses the API common to ipywidgets 7 and 8, not {VERSION}"


# --- quizzes -----------------------------------------------------------------------------------------


def _widget_warnings(caught) -> list[str]:
    return [
        f"{w.category.__name__}: {w.message}"
        for w in caught
        if "unrecognized arguments" in str(w.message) or {"ipywidgets", "traitlets"} & set(Path(w.filename).parts)
    ]


@pytest.mark.parametrize("key", QUIZZES)
def test_quiz_widget_answers_every_choice(key):
    questions = quiz.load(key)["questions"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        box = quiz.widget({"questions": questions})
    assert not _widget_warnings(caught), _widget_warnings(caught)
    assert isinstance(box, W.VBox) and len(box.children) == 3 * len(questions)
    for i, question in enumerate(questions):
        title, radio, note = box.children[3 * i : 3 * i + 3]
        assert isinstance(title, W.HTML) and isinstance(radio, W.RadioButtons) and isinstance(note, W.HTML)
        assert html.escape(question["question"]) in title.value
        labels = [f"{quiz.letter(j)}) {o['text']}" for j, o in enumerate(question["options"])]
        assert list(radio._options_labels) == labels  # what the front end lists: lettered as the static quiz
        assert radio.value is None and radio.index is None and note.value == "", "nothing is picked at first"
        for j, option in enumerate(question["options"]):
            radio.set_state({"index": j})  # a click in the front end
            assert radio.value == j
            assert ("Correct." in note.value) == bool(option["correct"]), note.value
            assert ("Not quite." in note.value) != bool(option["correct"]), note.value
            assert html.escape(option["explanation"]) in note.value


def test_quiz_show_displays_the_static_quiz_then_the_widget(monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: shown.extend(objs))
    quiz.show(QUIZZES[0])
    assert isinstance(shown[0], IPython.display.Markdown) and "Q1." in shown[0].data
    assert isinstance(shown[1], W.VBox)


PREDICTIONS = sorted(p.stem for p in (ROOT / "mha_course" / "kit" / "predictions").glob("*.json"))


@pytest.mark.parametrize("key", PREDICTIONS)
def test_prediction_widgets_record_a_click(key):
    from mha_course.kit import predict

    for name, question in predict.load(key).items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            box = predict.widget(key, name, question)
        assert not _widget_warnings(caught), _widget_warnings(caught)
        control, (button, note) = box.children[0], box.children[1].children
        assert isinstance(button, W.Button) and isinstance(note, W.HTML)
        if question.get("options"):
            assert list(control._options_labels)[0].startswith("a) ")
            control.set_state({"index": len(question["options"]) - 1})  # a click in the front end
        else:
            control.set_state({"value": 2.5})
        button.click()
        assert note.value.startswith("Recorded:"), note.value


# --- explorers -------------------------------------------------------------------------------------
# Every explorer of every notebook is driven inside the student edition's run of that notebook
# (tests/test_student_edition.py, with tests/explorer_driver.py): one execution serves both checks.


def test_an_explorer_redraws_on_a_change_not_on_a_front_ends_rounding(capsys):
    """JupyterLab's float slider sends back 1.0000000000000009 for 1.0 when it is first shown
    (seen in tests/browser/test_jupyterlab.py): no redraw for that, one for each real change, and
    every drawing with the controls' current values."""
    import matplotlib.pyplot as plt

    from mha_course.kit import widgets

    drawn = []

    def draw(x, flag):
        drawn.append({"x": x, "flag": flag})
        fig, ax = plt.subplots()
        ax.plot([0, x])
        return fig

    controls = {"x": W.FloatSlider(value=1.0, min=-4, max=8, step=0.5), "flag": W.Checkbox(value=False)}
    box = widgets.explorer(draw, controls)
    assert drawn == [{"x": 1.0, "flag": False}]  # the static figure
    controls["x"].set_state({"value": 1.0000000000000009})
    assert len(drawn) == 1, "a rounding of the value on show is not a change"
    controls["x"].set_state({"value": 1.5})
    controls["flag"].set_state({"value": True})
    controls["x"].set_state({"value": 1.5000000000000002})
    assert drawn == [{"x": 1.0, "flag": False}, {"x": 1.5, "flag": False}, {"x": 1.5, "flag": True}]
    box.redraw()  # forced: draws even with nothing changed
    assert len(drawn) == 4 and drawn[-1] == {"x": 1.5000000000000002, "flag": True}
    capsys.readouterr()


def test_the_browsers_spy_report_names_every_problem():
    """explorer_driver.browser_problems (JupyterLab's run) is not blind."""
    import explorer_driver

    def explorer(draws, stale=0, errors=()):
        return {"controls": ["a", "b"], "errors": list(errors), "draws": draws, "drawn_with": [], "stale_draws": stale}

    assert explorer_driver.browser_problems({"explorers": [explorer(3)], "widget_warnings": []}, "nb", [2]) == []
    record = {
        "explorers": [explorer(5, stale=1), explorer(3, errors=["ValueError: boom"])],
        "widget_warnings": ["DeprecationWarning: old"],
    }
    found = "\n".join(explorer_driver.browser_problems(record, "nb", [2, 2]))
    for words in ("DeprecationWarning: old", "explorer 1: 5 drawings", "1 drawing(s) with stale", "boom"):
        assert words in found, words
    assert "created, the page shows 3" in "".join(explorer_driver.browser_problems(record, "nb", [2, 2, 2]))
    assert explorer_driver.recorded("/nonexistent/spy.json") == {"explorers": [], "widget_warnings": []}


def test_every_notebook_with_an_explorer_is_driven_by_the_student_run():
    from test_student_edition import DRIVEN

    assert EXPLORER_NOTEBOOKS and {p.name for p in EXPLORER_NOTEBOOKS} == {p.name for p in DRIVEN}


@pytest.mark.executes_notebooks
def test_the_driver_sees_unknown_arguments_failing_callbacks_and_dead_controls(tmp_path):
    """The explorer checks are not blind (a synthetic notebook, driven like the real ones), and
    the spy leaves the notebook's own outputs as they are."""
    import explorer_driver
    import nbformat

    source = (
        "import ipywidgets as W\nimport matplotlib.pyplot as plt\nimport mha_course as mc\n\n\n"
        "def draw(x, flag):  # ignores flag; fails for x > 3\n"
        "    if x > 3:\n        raise ValueError('boom in draw')\n"
        "    fig, ax = plt.subplots()\n    ax.plot([0, x])\n    return fig\n\n\n"
        "controls = {'flag': W.Checkbox(value=False), 'x': W.IntSlider(value=3, min=0, max=5, not_a_trait=1)}\n"
        "_ = mc.widgets.explorer(draw, controls)"
    )
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source), nbformat.v4.new_code_cell("print('after the explorer')")]
    report = explorer_driver.execute(nb, tmp_path, drive=True)
    assert [c.source for c in nb.cells] == [source, "print('after the explorer')"], "spy and driver are removed"
    assert nb.cells[1].outputs[0]["text"] == "after the explorer\n"
    assert not any(o.get("name") == "stderr" for o in nb.cells[0].outputs), "the widget warning is recorded, not shown"
    assert any("unrecognized arguments" in w and "not_a_trait" in w for w in report["widget_warnings"])
    (explorer,) = report["explorers"]
    flag, x = explorer["steps"]
    assert flag["redraws"] == 1 and not flag["figure_changed"], flag  # a control that changes nothing
    assert x["redraws"] == 0 and explorer["errors"] == ["ValueError: boom in draw"], explorer
    found = "\n".join(explorer_driver.problems(report, "broken.ipynb", str(VERSION)))
    assert "not_a_trait" in found and "boom in draw" in found and "did not change" in found and "0 redraws" in found
