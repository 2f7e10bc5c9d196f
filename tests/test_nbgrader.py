"""authoring/grading.py: the course's exercises as an nbgrader course, and a class run end to end.

The class's flow runs nbgrader itself (the `nbgrader` extra, which `python3 course.py class`
installs on first use) through the commands the instructor guide gives, from a shell that does
not have the course's environment on PATH.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from authoring import grading, student_edition
from authoring import notebooks as notebook_tools

ROOT = Path(__file__).resolve().parent.parent
ASSIGNMENT = "01_single_head_attention"
PLANTED = (" / math.sqrt(q.shape[-1])", "")  # exercise 1.1 with the scaling forgotten


def _cells(path: Path):
    source, found = grading.source_notebook(nbformat.read(path, as_version=4), notebook=path.stem)
    return source.cells, found


@pytest.mark.parametrize("path", notebook_tools.numbered_notebooks(), ids=lambda p: p.stem[:2])
def test_every_exercise_becomes_a_solution_cell_and_a_locked_autograded_checker_cell(path):
    cells, found = _cells(path)
    meta = [c.metadata.get("nbgrader") for c in cells]
    ids = [m["grade_id"] for m in meta if m]
    assert len(ids) == len(set(ids)), f"{path.stem}: grade ids repeat: {ids}"
    tests = [(c, m) for c, m in zip(cells, meta, strict=False) if m and m["grade"]]
    solutions = [(c, m) for c, m in zip(cells, meta, strict=False) if m and m["solution"]]
    assert len(tests) == len(found) == len(solutions), path.stem
    for (test, m), exercise in zip(tests, found, strict=False):
        assert (
            m["locked"] and m["points"] == grading.DEFAULT_POINTS and m["grade_id"] == grading.grade_id(exercise.number)
        )
        assert f"mc.check.{exercise.checker}(" in test.source and "assert result.passed, result.message" in test.source
        assert "BEGIN SOLUTION" not in test.source
    for sol, _ in solutions:
        assert "### BEGIN SOLUTION" in sol.source and "mc.check." not in sol.source
    setup = [m for m in meta if m and m["grade_id"] == "setup"]
    assert setup and setup[0]["locked"], f"{path.stem}: the setup cell is not read-only"
    assert all(not c.get("outputs") for c in cells if c.cell_type == "code")
    assert not any("solution" in c.metadata.get("tags", []) for c in cells)


def test_points_can_be_set_per_exercise_and_the_guide_states_them():
    path = ROOT / "notebooks" / f"{ASSIGNMENT}.ipynb"
    source, _ = grading.source_notebook(nbformat.read(path, as_version=4), notebook=path.stem, points={"1.2": 3})
    worth = {
        c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"]["points"]
        for c in source.cells
        if c.metadata.get("nbgrader", {}).get("grade")
    }
    assert worth == {"exercise_1_1": 1, "exercise_1_2": 3}
    guide = student_edition.GUIDE.read_text(encoding="utf-8")
    assert grading.points_table(student_edition.exercises()) in guide
    with pytest.raises(SystemExit, match="N.M=POINTS"):
        grading._parse_points(["1.2:3"])


SCORES = """
import json, sys
from nbgrader.api import Gradebook
with Gradebook("sqlite:///" + sys.argv[1]) as gb:
    out = {}
    for learner in sys.argv[2:]:
        sub = gb.find_submission("%s", learner)
        out[learner] = {"max": sub.max_score, **{g.name: g.score for nb in sub.notebooks for g in nb.grades}}
print(json.dumps(out))
"""


def _scores(gradebook: Path, learners: list[str]) -> dict:
    """learner -> {grade cell: score} from nbgrader's gradebook, read in a fresh interpreter (nbgrader
    imports setuptools, whose distutils shim fails in a process that has imported distutils already)."""
    out = subprocess.run(
        [sys.executable, "-c", SCORES % ASSIGNMENT, str(gradebook), *learners],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    scores = json.loads(out.stdout)
    assert all(s.pop("max") == 2 for s in scores.values())
    return scores


def _solve(student_text: str, exercises, planted: tuple[str, str] | None = None) -> str:
    """The student edition with each exercise's raise replaced by its solution (as a learner who
    solved it saves it), optionally with a mistake planted in the solutions."""
    nb = json.loads(student_text)
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        for e in exercises:
            body = "\n".join(e.solution)
            body = body.replace(*planted) if planted else body
            raise_ = rf'^[ \t]*raise NotImplementedError\(\s*"Exercise {re.escape(e.number)}: .*?"\s*\)'
            source = re.sub(raise_, lambda _m, body=body: body, source, flags=re.M | re.S)
        cell["source"] = source
    return json.dumps(nb)


def _shell_without_venv() -> dict:
    """A fresh shell's environment: no .venv/bin on PATH, nothing activated."""
    venv_bin = (ROOT / ".venv" / "bin").resolve()
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != venv_bin]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(path or ["/usr/bin", "/bin"])
    return env


DECLINED = (
    "import sys, json, nbformat\n"
    "nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('1 + 1')])\n"
    "nbformat.validate(nb)\n"
    "broken = json.loads(nbformat.writes(nb))\n"
    "broken['cells'][0]['cell_type'] = 'kode'\n"
    "try:\n"
    "    nbformat.validate(nbformat.from_dict(broken))\n"
    "except nbformat.ValidationError:\n"
    "    print('a broken notebook is refused')\n"
    "print('declined:', sorted(n for n in sys.modules if n.startswith('rfc3987') and sys.modules[n] is None))\n"
)


@pytest.mark.slow
def test_the_class_tools_decline_the_slow_iri_check_and_notebooks_still_validate():
    """jsonschema's optional "iri" format check (rfc3987_syntax) costs 1.3 s per process: `python -m
    authoring` and its nbgrader runs decline that import, and nbformat still validates (and refuses
    a broken notebook)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", "import authoring\n" + DECLINED], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["a broken notebook is refused", "declined: ['rfc3987_syntax']"], out.stdout
    # nbgrader's process does not see this checkout: its code carries the names, and runs nbgrader
    without_checkout = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = grading.NBGRADER_MAIN.replace("from nbgrader.apps.nbgraderapp import main\nmain()", DECLINED)
    assert code != grading.NBGRADER_MAIN
    out = subprocess.run(
        [sys.executable, "-c", code], cwd="/", env=without_checkout, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "declined: ['rfc3987_syntax']" in out.stdout
    version = subprocess.run(
        [sys.executable, "-c", grading.NBGRADER_MAIN, "--version"],
        cwd="/",
        env=without_checkout,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert version.returncode == 0 and "nbgrader version" in version.stdout, version.stdout + version.stderr


@pytest.mark.slow
def test_a_class_end_to_end_from_a_shell_without_the_environment(tmp_path):
    """The instructor guide's flow, command for command, from a shell where .venv/bin is not on
    PATH: an nbgrader course of notebook 01; learners' notebooks saved from the student edition (the
    hub links' edition) — solved, untouched, solved with √d_k forgotten — and a copy of the solved
    notebook (no nbgrader metadata); then autograde, feedback and the progress view."""
    env = _shell_without_venv()
    python3 = shutil.which("python3", path=env["PATH"])
    assert python3 and shutil.which("nbgrader", path=env["PATH"]) is None, "the shell must not see .venv/bin"

    def course(*args: str) -> str:
        out = subprocess.run(
            [python3, str(ROOT / "course.py"), "class", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=1500,
        )
        text = out.stdout + out.stderr
        assert out.returncode == 0, f"course.py class {' '.join(args)} failed:\n{text[-4000:]}"
        assert "Traceback" not in text, text[-4000:]
        return out.stdout

    solved_nb = ROOT / "notebooks" / f"{ASSIGNMENT}.ipynb"
    released = course("nbgrader", "mha-class", "01")
    klass = tmp_path / "mha-class"
    assert "released: release/01_single_head_attention/" in released
    assert (klass / "gradebook.db").is_file()
    student = (student_edition.STUDENT_DIR / solved_nb.name).read_text(encoding="utf-8")
    exercises = student_edition.exercises([solved_nb])
    submissions = {
        "solved": _solve(student, exercises),
        "untouched": student,
        "planted": _solve(student, exercises, PLANTED),
        "copied": solved_nb.read_text(encoding="utf-8"),
    }
    assert submissions["planted"] != submissions["solved"]
    for learner, text in submissions.items():
        folder = klass / "submitted" / learner / ASSIGNMENT
        folder.mkdir(parents=True)
        (folder / solved_nb.name).write_text(text, encoding="utf-8")

    graded = course("autograde", "mha-class", ASSIGNMENT)
    for learner, points in {"solved": 2, "untouched": 0, "planted": 1, "copied": 0}.items():
        assert re.search(rf"^  {learner} +{points}/2 points", graded, re.M), graded
    assert "not gradable · copied: 01_single_head_attention.ipynb lacks nbgrader's cell metadata" in graded
    assert "Attribute 'checksum'" not in graded and "restored ·" not in graded
    assert _scores(klass / "gradebook.db", list(submissions)) == {
        "solved": {"exercise_1_1": 1, "exercise_1_2": 1},
        "untouched": {"exercise_1_1": 0, "exercise_1_2": 0},
        "planted": {"exercise_1_1": 0, "exercise_1_2": 1},
        "copied": {"exercise_1_1": 0, "exercise_1_2": 0},
    }

    course("feedback", "mha-class", ASSIGNMENT)
    feedback = klass / "feedback"
    planted = (feedback / "planted" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text(encoding="utf-8")
    assert "likely mistake — forgot to scale" in planted
    untouched = (feedback / "untouched" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text(encoding="utf-8")
    assert "not attempted" in untouched

    view = course("progress", "mha-class/autograded", "--gradebook", "mha-class/gradebook.db")
    rows = {line.split()[0]: line for line in view.splitlines() if line.split() and line.split()[0] in submissions}
    assert rows["solved"].split()[1:] == ["✅", "1/1", "✅", "1/1", "2/2"], view
    assert rows["untouched"].split()[1:] == ["·", "0/1", "·", "0/1", "0/2"], view
    assert rows["planted"].split()[1:] == ["❌", "0/1", "✅", "1/1", "1/2"], view
    assert "most common mistake (1×): forgot to scale" in view
    assert "not gradable · copied" in view
    assert "disagree · copied, exercise 1.1: the checker says passed, nbgrader gave 0/1" in view
    assert "disagree · solved" not in view and "disagree · planted" not in view
