"""The student edition: built right from the solution notebooks, holds no solution, is fresh, and
runs top to bottom (every checker saying "not attempted"); plus the instructor guide's coverage.

The execution tests start one kernel per student notebook and share nothing on disk, so they can
run in parallel with everything else (``pytest -n auto`` spreads them over the workers).
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import explorer_driver
import nbformat
import pytest
import student_run

from authoring import notebooks as notebook_tools
from authoring import student_edition as se
from mha_course import check

ROOT = notebook_tools.ROOT
SOLUTIONS = notebook_tools.numbered_notebooks()
STUDENT = se.STUDENT_DIR
#: the Chinese edition (notebooks/zh) and its student copy (notebooks/student/zh)
ZH_SOLUTIONS = se.zh_sources()
STUDENT_ZH = se.STUDENT_ZH_DIR


#: the English student notebooks whose explorers the run drives (tests/explorer_driver.py)
DRIVEN = [STUDENT / p.name for p in SOLUTIONS if explorer_driver.has_explorer(nbformat.read(p, as_version=4))]


def _id(path: Path) -> str:
    return f"zh_{path.stem}" if path.parent.name == "zh" else path.stem


BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


_src = student_run.source
_output_texts = student_run.output_texts


def _norm(text: str) -> str:
    return " ".join(text.split())


def _code_cell(source, outputs=(), count=None, tags=()):
    cell = nbformat.v4.new_code_cell(source, execution_count=count, outputs=list(outputs))
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def _stream(text):
    return nbformat.v4.new_output("stream", name="stdout", text=text)


# ---------------------------------------------------------------------------------------------
# the transformation, on small made-up cells


TWO_REGIONS = '''import torch


def first(x):
    """Double x."""
    ### BEGIN SOLUTION
    y = x * 2  # the doubling
    return y
    ### END SOLUTION


class Box:
    def second(self, x):
        ### BEGIN SOLUTION
        return x + 1
        ### END SOLUTION


mc.check.first(first)'''


def test_each_region_becomes_a_numbered_raise_indented_like_its_begin_line():
    new, found = se.strip_solutions(TWO_REGIONS, notebook="07_topic", cell=4, first_number=3)
    assert new == (
        'import torch\n\n\ndef first(x):\n    """Double x."""\n'
        "    raise NotImplementedError("
        "\"Exercise 7.3: your code here — mc.hint('7.3') gives a hint, one step at a time\")"
        "\n\n\nclass Box:\n    def second(self, x):\n"
        "        raise NotImplementedError("
        "\"Exercise 7.4: your code here — mc.hint('7.4') gives a hint, one step at a time\")"
        "\n\n\n"
        "mc.check.first(first)"
    )
    assert [(e.number, e.function, e.checker, e.cell) for e in found] == [
        ("7.3", "first", "first", 4),
        ("7.4", "Box", "first", 4),
    ]
    assert found[0].solution == ("    y = x * 2  # the doubling", "    return y")
    assert found[0].message == "Exercise 7.3: your code here — mc.hint('7.3') gives a hint, one step at a time"
    assert "multiply" not in new and "+ 1" not in new, "the student edition shows the task, never the method"


def test_the_methods_of_one_class_are_one_exercise_named_after_the_class():
    source = (
        "class Layer(nn.Module):\n    def __init__(self, d):\n        super().__init__()\n"
        f"        {BEGIN}\n        self.w = nn.Linear(d, d)\n        {END}\n\n"
        f"    def forward(self, x):\n        {BEGIN}\n        return self.w(x)\n        {END}\n\n\n"
        "def helper(x):\n"
        f"    {BEGIN}\n    return x\n    {END}\n\n\nmc.check.layer(Layer)"
    )
    new, found = se.strip_solutions(source, notebook="05_x", cell=2)
    assert [(e.number, e.function, e.checker) for e in found] == [("5.1", "Layer", "layer"), ("5.2", "helper", "layer")]
    assert found[0].solution == ("        self.w = nn.Linear(d, d)", "        return self.w(x)")
    assert new.count("mc.hint('5.1')") == 2 and new.count("mc.hint('5.2')") == 1


def test_a_cell_without_regions_is_unchanged():
    source = "x = 1\n# ### BEGIN SOLUTION mentioned in a comment is not a marker\nprint(x)\n"
    assert se.strip_solutions(source, notebook="03_x", cell=0) == (source, [])


def test_the_raise_is_valid_python_that_points_at_the_hint_ladder():
    source = f"def f(x):\n    {BEGIN}\n    return x\n    {END}\n"
    new, (exercise,) = se.strip_solutions(source, notebook="10_x", cell=0)
    namespace: dict = {}
    exec(compile(new, "<student cell>", "exec"), namespace)
    with pytest.raises(NotImplementedError) as info:
        namespace["f"](1)
    assert str(info.value) == "Exercise 10.1: your code here — mc.hint('10.1') gives a hint, one step at a time"
    assert exercise.number == "10.1"


def test_a_deeply_indented_raise_is_wrapped_as_ruff_format_would_and_stays_valid():
    indent = " " * 48
    source = f"def f(x):\n    if x:\n{indent}{BEGIN}\n{indent}return x\n{indent}{END}\n"
    source = "def f(x):\n" + "".join(f"{' ' * (4 * i)}if x:\n" for i in range(1, 12)) + f"{indent}{BEGIN}\n"
    source += f"{indent}return x\n{indent}{END}\n"
    new, _ = se.strip_solutions(source, notebook="02_x", cell=0)
    assert f"{indent}raise NotImplementedError(" in new.splitlines()
    compile(new, "<student cell>", "exec")
    ruff = Path(sys.executable).parent / "ruff"
    if ruff.exists():  # the wrapped form is what ruff itself would write
        done = subprocess.run(
            [str(ruff), "format", "--check", "--line-length", "120", "-"], input=new, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    "source, words",
    [
        (f"def f():\n    {BEGIN} hint: return 1\n    return 1\n    {END}\n", "text after"),
        (f"def f():\n    {BEGIN}\n    return 1\n", "without an END"),
        (f"def f():\n    return 1\n    {END}\n", "without a BEGIN"),
        (f"def f():\n    {BEGIN}\n    {BEGIN}\n    {END}\n    {END}\n", "second BEGIN"),
        (f"{BEGIN}\nx = 1\n{END}\n", "top level"),
    ],
)
def test_malformed_markup_is_an_error_naming_the_notebook_and_the_cell(source, words):
    with pytest.raises(se.SolutionMarkupError) as info:
        se.strip_solutions(source, notebook="05_masks", cell=17)
    message = str(info.value)
    assert words in message and "05_masks" in message and "cell 17" in message


def _toy_notebook():
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell(
            "# 07 · Toy\n\n"
            + notebook_tools.badge_for("notebooks/07_toy.ipynb")
            + "\n\nSee [the authoring guide](../docs/authoring.md), [notebook 01](01_single_head_attention.ipynb)"
            ' and `f["q"](../docs/authoring.md)`.'
        ),
        _code_cell("x = 1\nprint(x)", [_stream("1\n")], count=1),
        _code_cell(
            f"def f(x):\n    {BEGIN}\n    return x\n    {END}\n\n\nmc.check.f(f)",
            [_stream("✅ f: correct\n")],
            count=2,
            tags=["exercise"],
        ),
        _code_cell("print('the answer is 42')", [_stream("the answer is 42\n")], count=3, tags=["solution"]),
        nbformat.v4.new_markdown_cell("Solution-only prose", metadata={"tags": ["solution"]}),
        _code_cell("print(x + 1)", [_stream("2\n")], count=4),
    ]
    return nb


def test_student_notebook_removes_solutions_and_clears_only_changed_cells():
    nb = _toy_notebook()
    before = copy.deepcopy(nb)
    student, found = se.student_notebook(nb, notebook="07_toy")
    assert nb == before, "the solution notebook must not be modified"
    sources = [_src(c) for c in student.cells]
    assert len(student.cells) == 5 and not any("answer is 42" in s or "Solution-only" in s for s in sources)
    kept, changed, check_cell, after = student.cells[1:]
    assert (kept.execution_count, kept.outputs) == (1, nb.cells[1].outputs)
    assert (after.execution_count, after.outputs) == (4, nb.cells[5].outputs)
    assert changed.execution_count is None and changed.outputs == []
    assert changed.metadata["tags"] == ["exercise"]
    assert "raise NotImplementedError(" in changed.source and "mc.hint('7.1')" in changed.source
    # nbgrader's layout, so that a saved student notebook autogrades: the learner's function (a
    # solution cell), then the checker in a read-only autograded cell worth one point
    assert "mc.check" not in changed.source and changed.metadata["nbgrader"]["grade_id"] == "exercise_7_1_answer"
    assert changed.metadata["nbgrader"]["solution"] and not changed.metadata["nbgrader"]["grade"]
    assert check_cell.source == "mc.check.f(f)" and check_cell.outputs == []
    grade = check_cell.metadata["nbgrader"]
    assert (grade["grade_id"], grade["grade"], grade["locked"], grade["points"]) == ("exercise_7_1", True, True, 1)
    assert check_cell.metadata["editable"] is False and check_cell.metadata["deletable"] is False
    assert check_cell.id != changed.id
    assert [e.number for e in found] == ["7.1"]
    title = student.cells[0].source
    assert notebook_tools.badge_for("notebooks/student/07_toy.ipynb") in title
    assert "notebooks/07_toy.ipynb)" not in title and se.NOTE in title
    assert "(../../docs/authoring.md)" in title, "a link out of the folder must still work one level down"
    assert "(01_single_head_attention.ipynb)" in title, "a sibling notebook's student copy sits next to it"
    assert '`f["q"](../docs/authoring.md)`' in title, "code spans are left alone"


def test_build_writes_every_notebook_and_check_detects_staleness(tmp_path):
    out = tmp_path / "student"
    assert se.main([str(out), "--check"]) == 1  # nothing there yet
    assert se.main([str(out)]) == 0
    assert sorted(p.name for p in out.glob("*.ipynb")) == [p.name for p in SOLUTIONS]
    assert se.stale(out) == [] and se.main([str(out), "--check"]) == 0
    (out / "99_orphan.ipynb").write_text("{}")
    victim = out / SOLUTIONS[0].name
    victim.write_text(victim.read_text(encoding="utf-8").replace("Student edition", "Edition"), encoding="utf-8")
    problems = se.stale(out)
    assert any("99_orphan" in p for p in problems) and any(SOLUTIONS[0].name in p for p in problems)
    se.build(out)  # a full build repairs the copy and removes notebooks without a source
    assert se.stale(out) == [] and not (out / "99_orphan.ipynb").exists()


def test_checker_diagnoses_are_the_mistake_lists_of_the_checkers():
    import importlib
    import inspect

    from mha_course.check import attention

    for name, fn in check.CHECKERS.items():  # every checker built on run_check keeps its mistakes as data
        module = importlib.import_module(fn.__module__)
        if "run_check(" in inspect.getsource(fn):
            assert hasattr(module, f"{name.upper()}_MISTAKES"), f"{module.__name__}: no {name.upper()}_MISTAKES"
            assert se.checker_diagnoses(name), name

    assert se.checker_diagnoses("scaled_dot_product_attention") == [
        m.diagnosis for m in attention.SCALED_DOT_PRODUCT_ATTENTION_MISTAKES
    ]
    diagnoses = se.checker_diagnoses("causal_mask")
    assert len(diagnoses) >= 3 and any("diagonal" in d for d in diagnoses)
    assert se.checker_diagnoses("address_book_query") == []  # a hand-written checker without run_check


# ---------------------------------------------------------------------------------------------
# the committed student edition


def test_committed_student_edition_is_fresh(tmp_path):
    """Rebuilt into a temporary folder, the edition equals the committed copy byte for byte."""
    se.build(tmp_path)
    built = sorted(p.name for p in tmp_path.glob("*.ipynb"))
    committed = sorted(p.name for p in STUDENT.glob("*.ipynb"))
    assert committed == built, "run `python -m authoring student-edition notebooks/student`"
    for name in built:
        assert (STUDENT / name).read_bytes() == (tmp_path / name).read_bytes(), (
            f"notebooks/student/{name} is stale: run `python -m authoring student-edition notebooks/student`"
        )
    assert se.stale(STUDENT_ZH, ZH_SOLUTIONS) == [], "run `python -m authoring student-edition notebooks/student`"
    assert len(ZH_SOLUTIONS) == len(SOLUTIONS), "every notebook has its Chinese twin"


def _solution_parts(nb):
    """(lines inside solution regions and solution-tagged cells, the number of regions, the solution
    notebook's text outside them) — parsed here independently of the builder."""
    secret, regions, allowed = [], 0, []
    for cell in nb["cells"]:
        source = _src(cell)
        if "solution" in cell.get("metadata", {}).get("tags", []):
            secret += source.splitlines() + [line for t in _output_texts(cell) for line in t.splitlines()]
            continue
        inside, has_region = False, False
        for line in source.splitlines():
            stripped = line.strip()
            if stripped.startswith(BEGIN):
                inside, has_region = True, True
                regions += 1
            elif stripped.startswith(END):
                inside = False
            elif inside:
                secret.append(line)
            else:
                allowed.append(line)
        if not has_region:  # an exercise cell's outputs show the solution at work
            allowed += _output_texts(cell)
    return secret, regions, "\n".join(allowed)


def leaks(solution_nb: dict, student_nb: dict) -> list[str]:
    """Pieces of the solutions found in the student notebook: a whole line of a solution region
    (whitespace-normalised), the code of a line (≥ 12 characters) or its comment (≥ 8 characters)
    anywhere in its sources or outputs — unless the piece also occurs in the solution notebook
    outside the regions (then the notebook shows it anyway) or in an author's hint."""
    secret, _, allowed = _solution_parts(solution_nb)
    allowed_lines = {_norm(line) for line in allowed.splitlines()}
    allowed_flat = _norm(allowed)
    texts = [_src(c) for c in student_nb["cells"]] + [t for c in student_nb["cells"] for t in _output_texts(c)]
    student_lines = {_norm(line) for t in texts for line in t.splitlines()}
    student_flat = _norm("\n".join(texts))
    found = []
    for line in secret:
        whole = _norm(line)
        code, _, comment = line.partition("#")
        code, comment = _norm(code), _norm(comment)
        if whole and whole in student_lines and whole not in allowed_lines:
            found.append(f"line {whole!r}")
        elif len(code) >= 12 and code in student_flat and code not in allowed_flat:
            found.append(f"code {code!r}")
        elif len(comment) >= 8 and comment in student_flat and comment not in allowed_flat:
            found.append(f"comment {comment!r}")
    return found


def test_leak_detector_finds_solutions_left_behind():
    nb = _toy_notebook()
    nb.cells[2].source = f"def f(x):\n    {BEGIN} hint: h\n    y = x.clone().mul_(3)  # triple it in place\n    {END}\n"
    nb.cells[3].source = "print(x + 1)  # a line of the solution-only cell"
    solution = json.loads(nbformat.writes(nb))
    student = copy.deepcopy(solution)
    student["cells"] = [c for c in student["cells"] if "solution" not in c["metadata"].get("tags", [])]
    assert leaks(solution, student) == ["line 'y = x.clone().mul_(3) # triple it in place'"]
    student["cells"][2]["source"] = "raise NotImplementedError"
    assert leaks(solution, student) == []
    student["cells"].append(nbformat.v4.new_markdown_cell("Remember: triple it in place."))
    assert leaks(solution, student) == ["comment 'triple it in place'"]
    student["cells"][-1]["source"] = "y = x.clone().mul_(3)"
    assert leaks(solution, student) == ["code 'y = x.clone().mul_(3)'"]
    student["cells"].pop()
    student["cells"].append(nbformat.v4.new_markdown_cell("`print(x + 1)` would print 2"))
    assert leaks(solution, student) == [], "a line shown outside the solution anyway is no leak"


def _pairs():
    return [(p, STUDENT / p.name) for p in SOLUTIONS] + [(p, STUDENT_ZH / p.name) for p in ZH_SOLUTIONS]


@pytest.mark.parametrize("solution, student", _pairs(), ids=_id)
def test_no_solution_survives(solution, student):
    solution_nb = json.loads(solution.read_text(encoding="utf-8"))
    student_nb = json.loads(student.read_text(encoding="utf-8"))
    assert leaks(solution_nb, student_nb) == []
    code = "\n".join(_src(c) for c in student_nb["cells"] if c["cell_type"] == "code")
    assert BEGIN not in code and END not in code
    assert not any("solution" in c["metadata"].get("tags", []) for c in student_nb["cells"])
    # one raise per region, numbered N.1, N.2, ..., pointing at the hint ladder
    secret, regions, _ = _solution_parts(solution_nb)
    n = int(solution.stem[:2])
    pattern = r'raise NotImplementedError\(\s*"Exercise (\d+)\.(\d+): your code here — mc\.hint\(\'(\d+\.\d+)\'\)'
    raised = re.findall(pattern, code)
    for shown in re.findall(pattern, "\n".join(_src(c) for c in solution_nb["cells"] if c["cell_type"] == "code")):
        raised.remove(shown)  # a raise the solution notebook shows itself (notebook 00's example)
    assert len(raised) == regions  # one raise per region; a class's methods share their exercise's number
    numbers = list(dict.fromkeys((int(a), int(b)) for a, b, _ in raised))
    assert numbers == [(n, m) for m in range(1, len(numbers) + 1)]
    assert [h for _, _, h in raised] == [f"{a}.{b}" for a, b, _ in raised]
    # the exercise cells and every checker call lost their outputs and counts (a stored ✅ would say
    # "done" before the learner wrote a line); every other code cell kept them
    # (an exercise cell becomes two, nbgrader's layout: the learner's function, then its check cell)
    kept = [c for c in solution_nb["cells"] if "solution" not in c["metadata"].get("tags", [])]
    cells = iter(student_nb["cells"])
    pairs = []
    for before in kept:
        pairs.append((before, next(cells)))
        if BEGIN in _src(before) and re.search(r"^mc\.check\.\w+\(.*\)$", _src(before), re.M):
            check_cell = next(cells)
            assert check_cell["metadata"]["nbgrader"]["grade"]
            assert re.fullmatch(r"mc\.check\.\w+\(.*\)", _src(check_cell))
            assert _src(check_cell) in _src(before) and "mc.check" not in _src(pairs[-1][1])
            pairs.append((before, check_cell))
    assert next(cells, None) is None, "the student edition has cells the solved notebook does not"
    for before, after in pairs:
        if after["cell_type"] != "code":
            continue
        if BEGIN in _src(before) or re.search(r"\bmc\.check\.\w+\(", _src(before)):
            assert (after["outputs"], after["execution_count"]) == ([], None)
            assert not any(mark in t for t in _output_texts(after) for mark in ("✅", "❌"))
        else:
            assert _src(after) == _src(before)
            assert (after["outputs"], after["execution_count"]) == (before["outputs"], before["execution_count"])


def test_every_exercise_has_a_hint_ladder_and_an_existing_checker():
    from mha_course.kit import hint_ladder as hints

    found = se.exercises()
    for e in found:
        assert e.checker, f"Exercise {e.number} ({e.notebook}) needs a mc.check call after its function"
        assert e.checker in check.available(), f"Exercise {e.number}: mc.check.{e.checker} does not exist"
        ladders = hints.load(e.notebook[:2])
        assert e.number in ladders, (
            f"Exercise {e.number} has no hint ladder in mha_course/kit/hints/{e.notebook[:2]}.json"
        )
        assert ladders[e.number]["function"] == e.function, f"hints {e.number}: the exercise's function is {e.function}"
        assert len(hints.ladder(e.number)) >= 3
    numbered = {e.number for e in found}
    assert len(numbered) == len(found)
    for path in sorted((ROOT / "mha_course" / "kit" / "hints").glob("*.json")):
        extra = set(hints.load(path.stem)) - numbered
        assert not extra, f"{path.name}: ladders for exercises that do not exist: {sorted(extra)}"


# ---------------------------------------------------------------------------------------------
# every student notebook runs top to bottom


@pytest.mark.slow
@pytest.mark.executes_notebooks
@pytest.mark.parametrize(
    "path", [STUDENT / p.name for p in SOLUTIONS] + [STUDENT_ZH / p.name for p in ZH_SOLUTIONS], ids=_id
)
def test_student_notebook_runs_top_to_bottom(path):
    """Executed in a fresh kernel (PYTHONHASHSEED=0, set by conftest.py): no error, every exercise
    check says "not attempted", and every cell the build left unchanged prints what it printed in
    the solution notebook — so nothing after an exercise depends on the learner's function. In the
    English notebooks with an explorer, every control of every explorer is then changed in the same
    kernel (tests/explorer_driver.py): each must redraw once, with the current values, to a new figure."""
    import ipywidgets

    assert path.exists(), "run `python -m authoring student-edition notebooks/student`"
    stored = nbformat.read(path, as_version=4)
    nb = copy.deepcopy(stored)
    report = explorer_driver.execute(nb, path.parent, drive=path in DRIVEN)
    found = student_run.problems(stored, nb, chinese=path.parent.name == "zh")
    assert not found, f"{path.name}:\n" + "\n".join(found)
    if report is not None:
        found = explorer_driver.problems(report, path.name, ipywidgets.__version__)
        assert not found, "\n".join(found)


def test_the_student_run_checks_name_an_error_a_wrong_check_and_a_changed_output():
    """tests/student_run.py, which both the kernel-only run and JupyterLab's use, is not blind."""
    check = _code_cell("mc.check.attention(attention)", count=None)
    check.metadata["nbgrader"] = {"grade": True, "grade_id": "exercise_1_1"}
    stored = nbformat.v4.new_notebook()
    stored.cells = [
        nbformat.v4.new_markdown_cell("# title"),
        _code_cell("print(1)", [_stream("1\n")], count=1),
        check,
        _code_cell("print(2)", [_stream("2\n")], count=3),
    ]
    good = copy.deepcopy(stored)
    good.cells[2].outputs = [_stream("Exercise 1.1: not attempted\n")]
    assert student_run.problems(stored, good, chinese=False) == []
    assert student_run.problems(stored, good, chinese=True) != []  # the Chinese check says 未尝试

    bad = copy.deepcopy(good)
    bad.cells[1].outputs = [nbformat.v4.new_output("error", ename="NameError", evalue="x", traceback=[])]
    bad.cells[2].outputs = [_stream("✅ Exercise 1.1 passed\n")]
    bad.cells[3].outputs = [_stream("3\n")]
    found = "\n".join(student_run.problems(stored, bad, chinese=False))
    assert "cell 1 raised NameError" in found and "cell 2: the check should say" in found
    assert "cell 3 prints something else" in found
    bad.cells.pop()
    assert student_run.problems(stored, bad, chinese=False) == ["the run has 3 cells, the student notebook 4"]


def test_an_english_student_run_is_left_out_only_where_jupyterlab_runs_the_notebook(monkeypatch):
    """tests/browser/conftest.py: JupyterLab's run of the English student edition makes its checks,
    so its kernel-only run is deselected, for the notebooks the session runs in JupyterLab only,
    never the Chinese runs, and not at all without a browser."""
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("browser_conftest", ROOT / "tests" / "browser" / "conftest.py")
    browser_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(browser_conftest)

    def items(*ids):
        return [SimpleNamespace(nodeid=i) for i in ids]

    lab, run = browser_conftest.LAB_RUN, browser_conftest.STUDENT_RUN
    collected = items(f"{lab}01_a]", f"{run}01_a]", f"{run}zh_01_a]", f"{run}02_b]", "tests/test_x.py::test_y")
    dropped = []
    config = SimpleNamespace(hook=SimpleNamespace(pytest_deselected=lambda items: dropped.extend(items)))
    for lacking, expected in ((None, [f"{run}01_a]"]), ("Chromium", [])):
        monkeypatch.setattr(browser_conftest, "missing", lambda lacking=lacking: lacking)
        kept, dropped[:] = list(collected), []
        browser_conftest.pytest_collection_modifyitems(config, kept)
        assert [i.nodeid for i in dropped] == expected
        assert [i.nodeid for i in kept] == [i.nodeid for i in collected if i.nodeid not in expected]


# ---------------------------------------------------------------------------------------------
# the instructor guide


def test_instructor_guide_exercise_reference_is_current():
    assert se.GUIDE.read_text(encoding="utf-8") == se.guide_text(), (
        "docs/instructor_guide.md's exercise reference is stale: run "
        "`python -m authoring student-edition notebooks/student`"
    )


def test_instructor_guide_has_teaching_notes_for_every_exercise_and_covers_every_notebook():
    guide = se.GUIDE.read_text(encoding="utf-8")
    generated = guide.split("<!-- exercise-reference:start -->")[1].split("<!-- exercise-reference:end -->")[0]
    notes = guide.replace(generated, "")
    numbers = re.findall(r"^### Exercise (\d+\.\d+)\b", notes, re.M)
    assert sorted(numbers) == sorted(e.number for e in se.exercises()), "one '### Exercise N.M' section each"
    for section in re.split(r"^### ", notes, flags=re.M)[1:]:
        if section.startswith("Exercise"):
            for word in ("Unblock", "Discuss"):
                assert f"**{word}" in section, f"### {section.splitlines()[0]}: no **{word}…** part"
    for path in SOLUTIONS:
        assert path.stem in notes, f"the guide's agendas do not mention {path.stem}"


def test_readme_course_map_links_both_editions_of_every_notebook():
    """The generated course map (README.md, kept current by test_project) has, per notebook, the
    solved and the student edition, each with its Colab link."""
    text = notebook_tools.readme_text()
    course_map = text.split("<!-- course-map:start -->")[1].split("<!-- course-map:end -->")[0]
    rows = {line.split("|")[1].strip(): line for line in course_map.splitlines()[2:] if line.startswith("|")}
    for path in SOLUTIONS:
        row = rows[path.name[:2]]
        for rel in (f"notebooks/{path.name}", f"notebooks/student/{path.name}"):
            assert f"]({rel})" in row and f"({notebook_tools.colab_url_for(rel)})" in row, f"{path.stem}: {rel}"
