"""The exercises make learners think: no spoilers anywhere, hint ladders on request, predictions
before the key experiments, and a core path marked in every notebook."""

from __future__ import annotations

import json
import re

import pytest

import mha_course as mc
from authoring import notebooks as notebook_tools
from authoring import student_edition as se
from mha_course.kit import hint_ladder as hints
from mha_course.kit import predict

ROOT = notebook_tools.ROOT
SOLUTIONS = notebook_tools.numbered_notebooks()


def _code_cells(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    return [(i, "".join(c["source"])) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]


def _markdown(path) -> str:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def spoilers(exercises, notebooks) -> list[str]:
    """Places outside an exercise's own cell that define its function in full or print the source
    of a function of that name (the answer, shown before the learner writes it)."""
    found = []
    for e in exercises:
        if not e.function:
            continue
        define = re.compile(
            rf"^[ \t]*(?:(?:async\s+)?def\s+{re.escape(e.function)}\s*\(|class\s+{re.escape(e.function)}\b)", re.M
        )
        show = re.compile(rf"getsource\([^)]*\b{re.escape(e.function)}\b")
        for path in notebooks:
            for index, source in _code_cells(path):
                if path.stem == e.notebook and index == e.cell:
                    continue
                if define.search(source):
                    found.append(f"Exercise {e.number}: {path.stem} cell {index} defines {e.function}()")
                if show.search(source):
                    found.append(f"Exercise {e.number}: {path.stem} cell {index} prints the source of {e.function}")
    return found


def test_the_spoiler_finder_finds_definitions_and_printed_sources(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# 05 · Toy"),
        nbformat.v4.new_code_cell("def twice(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION"),
        nbformat.v4.new_code_cell("def twice(x):\n    return x + x"),
        nbformat.v4.new_code_cell("import inspect\nprint(inspect.getsource(lib.twice))"),
        nbformat.v4.new_code_cell("y = twice(3)  # using it is fine"),
    ]
    path = tmp_path / "05_toy.ipynb"
    nbformat.write(nb, path)
    (exercise,) = se.exercises([path])
    assert spoilers([exercise], [path]) == [
        "Exercise 5.1: 05_toy cell 2 defines twice()",
        "Exercise 5.1: 05_toy cell 3 prints the source of twice",
    ]


def test_no_exercise_is_answered_anywhere_else_in_the_course():
    assert spoilers(se.exercises(), SOLUTIONS) == []


def test_solution_markers_stand_alone_and_the_student_edition_stores_no_check_result():
    for path in SOLUTIONS:
        for index, source in _code_cells(path):
            for line in source.splitlines():
                if "### BEGIN SOLUTION" in line:
                    assert line.strip() == "### BEGIN SOLUTION", f"{path.stem} cell {index}: {line.strip()!r}"
    for path in sorted((ROOT / "notebooks" / "student").glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        for index, cell in enumerate(nb["cells"]):
            if not re.search(r"\bmc\.check\.\w+\(", "".join(cell["source"])):
                continue
            text = json.dumps(cell.get("outputs", []), ensure_ascii=False)
            assert "✅" not in text and "❌" not in text, f"{path.name} cell {index} stores a check result"


# ---------------------------------------------------------------------------------------------
# hint ladders


def test_hint_prints_the_ladder_one_rung_per_call_then_points_at_the_checker(capsys, monkeypatch):
    ladders = {"5.1": {"function": "f", "ladder": ["think of rows", "compare two ranges", "a < b[:, None]"]}}
    monkeypatch.setattr(hints, "load", lambda notebook: ladders if notebook == "05" else {})
    hints.reset()
    for step in range(3):
        mc.hint("5.1")
        line = capsys.readouterr().out
        assert f"hint {step + 1} of 3" in line and ladders["5.1"]["ladder"][step] in line
    mc.hint(5.1)
    assert "last hint" in capsys.readouterr().out
    hints.reset("5.1")
    assert "hint 1 of 3" in hints.next_hint("5.1")
    with pytest.raises(ValueError, match="5.9"):
        hints.ladder("5.9")
    with pytest.raises(ValueError, match="look like '5.1'"):
        hints.ladder("five")


def test_hint_files_are_valid():
    assert hints.validate({"1.1": {"function": "f", "ladder": ["a", "b"]}})  # too short
    assert hints.validate({"1.1": {"ladder": ["a", "b", "c"]}})  # no function
    for path in sorted((ROOT / "mha_course" / "kit" / "hints").glob("*.json")):
        assert hints.validate(json.loads(path.read_text(encoding="utf-8"))) == [], path.name


# ---------------------------------------------------------------------------------------------
# predict, then run

PREDICT_CALL = re.compile(r"""mc\.predict\(\s*["'](\d\d)["']\s*,\s*["']([\w-]+)["']\s*\)""")


def test_predictions_show_the_question_record_the_answer_and_never_reveal_it():
    choice = {"question": "Which?", "options": ["one", "two"]}
    number = {"question": "How many GiB?", "unit": "GiB"}
    assert predict.validate({"a": choice, "b": number}) == []
    assert predict.validate({"a": {"question": "x", "options": ["only"]}})
    assert predict.validate({"a": {"question": "x"}})
    text = predict.static_markdown(choice)
    assert "Which?" in text and "**a)** one" in text and "**b)** two" in text
    assert "GiB" in predict.static_markdown(number)
    box = predict.widget("04", "a", choice)
    radio, (_, note) = box.children[0], box.children[1].children
    box.record(None)
    assert "Pick an option" in note.value
    radio.value = 1
    box.record(None)
    assert note.value.startswith("Recorded: b) two") and predict.recorded()[("04", "a")] == "b) two"
    box = predict.widget("06", "b", number)
    box.children[0].value = 1.5
    box.record(None)
    assert predict.recorded()[("06", "b")] == "1.5 GiB"


def test_every_prediction_a_notebook_asks_exists_and_each_notebook_asks_one():
    for path in SOLUTIONS:
        calls = [m.groups() for _, source in _code_cells(path) for m in PREDICT_CALL.finditer(source)]
        if path.stem[:2] != "00":
            assert calls, f"{path.stem}: no 'predict, then run' question before its key experiment"
        for notebook, key in calls:
            assert notebook == path.stem[:2], f"{path.stem} asks notebook {notebook}'s question {key}"
            assert key in predict.load(notebook), f"{path.stem}: no prediction {key!r} in predictions/{notebook}.json"


# ---------------------------------------------------------------------------------------------
# a core path and deep dives

TIME_LINE = re.compile(r"\*\*Estimated time:\*\* core path ≈ (\d+) min; with the deep dives ≈ (\d+) min\.")


def test_every_notebook_gives_its_core_path_time_and_marks_its_deep_dives():
    for path in SOLUTIONS:
        if path.stem[:2] == "00":
            continue
        text = _markdown(path)
        times = TIME_LINE.search(text)
        assert times, (
            f"{path.stem}: the header needs '**Estimated time:** core path ≈ X min; with the deep dives ≈ Y min.'"
        )
        core, full = map(int, times.groups())
        assert core <= 45 <= full or core <= full <= 45, f"{path.stem}: core path {core} min, all {full} min"
        deep = re.findall(r"^##+ .*\(deep dive\)\s*$", text, re.M)
        assert deep or core == full, f"{path.stem}: core path shorter than the whole but no '(deep dive)' heading"
