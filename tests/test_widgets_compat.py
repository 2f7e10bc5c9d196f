"""The explorers and quizzes with the ipywidgets that is installed: 8 in the course's environment
(JupyterLab 4), 7.7 on Colab. .ci/run runs this file a second time in an environment with
``ipywidgets==7.7.*`` (and ``MHA_EXPECT_IPYWIDGETS=7.7``, so that it cannot silently test 8).

* quizzes: every quiz's widget is built and each option of each question is picked the way the
  front end does it (a state update of ``index``): the feedback line must say ✅ for the correct
  option and ❌ for the others, with that option's explanation;
* explorers: every notebook that has one is run (in a fresh IPython shell in a subprocess, up to
  its last explorer), and every control of every explorer is changed the way the front end does it
  (a state update): the explorer must redraw once, with the new values of all its controls, and
  the figure must change; no callback may raise.
"""

from __future__ import annotations

import html
import io
import json
import os
import subprocess
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


# --- explorers, driven in each notebook -----------------------------------------------------------------


def _next_state(widget) -> dict:
    """The state update the front end sends when a learner changes ``widget``."""
    if isinstance(widget, W.FloatLogSlider):  # its steps are steps of the exponent
        up = widget.value * widget.base**widget.step
        return {"value": up if up <= widget.base**widget.max else widget.value / widget.base**widget.step}
    if isinstance(widget, (W.IntSlider, W.FloatSlider)):
        up = widget.value + widget.step
        return {"value": up if up <= widget.max else widget.value - widget.step}
    if isinstance(widget, (W.Checkbox, W.ToggleButton)):
        return {"value": not widget.value}
    if isinstance(widget, (W.Dropdown, W.ToggleButtons, W.RadioButtons, W.Select)):
        return {"index": (widget.index + 1) % len(widget.options)}
    raise TypeError(f"no known way to change a {type(widget).__name__}")


def drive(path: Path) -> dict:
    """Run ``path`` in an IPython shell up to its last explorer, then change every control of every
    explorer. Returns what happened (JSON-able), including every warning about widget arguments
    (ipywidgets 7 takes an argument it does not know, e.g. one new in 8, with only a warning).
    Runs in a subprocess: see ``drive_in_subprocess``."""
    import contextlib

    import matplotlib

    matplotlib.use("Agg")
    from IPython.core.interactiveshell import InteractiveShell

    import mha_course.kit.widgets as mw

    explorers = []
    real_explorer = mw.explorer

    def spy(draw, controls, **kwargs):
        record = {"calls": [], "errors": [], "names": list(controls)}

        def draw_and_record(**values):
            try:
                fig = draw(**values)
            except Exception as e:
                record["errors"].append(f"{type(e).__name__}: {e}")
                raise
            png = io.BytesIO()
            fig.savefig(png, format="png", dpi=30)
            record["calls"].append((dict(values), png.getvalue()))
            return fig

        box = real_explorer(draw_and_record, controls, **kwargs)
        explorers.append((record, controls))
        return box

    mw.explorer = spy
    shell = InteractiveShell.instance()
    cells = _code_cells(path)
    last = max(i for i, s in enumerate(cells) if "explorer(" in s)
    with (
        open(os.devnull, "w") as quiet,
        contextlib.redirect_stdout(quiet),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        for i, source in enumerate(cells[: last + 1]):
            result = shell.run_cell(source, store_history=True)
            if not result.success:
                return {"error": f"code cell {i + 1} failed: {result.error_before_exec or result.error_in_exec!r}"}
        report = []
        for record, controls in explorers:
            steps = []
            for name, widget in controls.items():
                before, previous = len(record["calls"]), record["calls"][-1][1] if record["calls"] else b""
                try:
                    state = _next_state(widget)
                    widget.set_state(state)
                except Exception as e:
                    steps.append({"control": name, "problem": f"{type(e).__name__}: {e}"})
                    continue
                new_calls = record["calls"][before:]
                current = {n: w.value for n, w in controls.items()}
                steps.append(
                    {
                        "control": name,
                        "type": type(widget).__name__,
                        "state": repr(state),
                        "redraws": len(new_calls),
                        "drawn_with_current_values": bool(new_calls) and new_calls[-1][0] == current,
                        "figure_changed": bool(new_calls) and new_calls[-1][1] != previous,
                    }
                )
            report.append({"controls": record["names"], "errors": record["errors"], "steps": steps})
    return {"explorers": report, "code_cells_run": last + 1, "widget_warnings": sorted(set(_widget_warnings(caught)))}


def drive_in_subprocess(path: Path, tmp: Path) -> dict:
    """``drive(path)`` in a fresh interpreter: notebooks change global state (seeds, grad mode,
    print options, rcParams) that must not leak into other notebooks or tests."""
    out = tmp / "driven.json"
    env = dict(os.environ, MPLBACKEND="Agg", **notebook_tools.EXEC_ENV)
    cmd = [sys.executable, __file__, "--drive", str(path), str(out)]
    result = subprocess.run(cmd, cwd=path.parent, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"the explorer driver failed:\n{(result.stdout + result.stderr)[-4000:]}"
    return json.loads(out.read_text())


@pytest.mark.executes_notebooks
@pytest.mark.parametrize("path", EXPLORER_NOTEBOOKS, ids=lambda p: p.stem)
def test_explorers_redraw_on_every_control(path, tmp_path):
    result = drive_in_subprocess(path, tmp_path)
    assert "error" not in result, f"{path.name} (ipywidgets {VERSION}): {result.get('error')}"
    assert result["explorers"], f"{path.name}: no explorer was created"
    assert not result["widget_warnings"], f"{path.name} (ipywidgets {VERSION}): {result['widget_warnings']}"
    for k, explorer in enumerate(result["explorers"], 1):
        assert not explorer["errors"], f"explorer {k} raised while drawing: {explorer['errors']}"
        assert len(explorer["steps"]) == len(explorer["controls"]) >= 1
        for step in explorer["steps"]:
            where = f"{path.name}, explorer {k}, control {step['control']!r} (ipywidgets {VERSION})"
            assert "problem" not in step, f"{where}: {step.get('problem')}"
            assert step["redraws"] == 1, f"{where}: {step['redraws']} redraws for one change {step['state']}"
            assert step["drawn_with_current_values"], f"{where}: redrawn with stale values"
            assert step["figure_changed"], f"{where}: the figure did not change after {step['state']}"


def test_the_driver_sees_unknown_arguments_failing_callbacks_and_dead_controls(tmp_path):
    """The explorer checks are not blind (a synthetic notebook, driven like the real ones)."""
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
    nb.cells = [nbformat.v4.new_code_cell(source)]
    nbformat.write(nb, tmp_path / "broken.ipynb")
    result = drive_in_subprocess(tmp_path / "broken.ipynb", tmp_path)
    assert any("unrecognized arguments" in w and "not_a_trait" in w for w in result["widget_warnings"])
    (explorer,) = result["explorers"]
    flag, x = explorer["steps"]
    assert flag["redraws"] == 1 and not flag["figure_changed"], flag  # a control that changes nothing
    assert x["redraws"] == 0 and explorer["errors"] == ["ValueError: boom in draw"], explorer


if __name__ == "__main__" and sys.argv[1:2] == ["--drive"]:
    Path(sys.argv[3]).write_text(json.dumps(drive(Path(sys.argv[2])), indent=1))
