"""authoring/grading.py: the course's exercises as an nbgrader course, and nbgrader's own round trip.

The round trip runs nbgrader itself (the `nbgrader` extra; .ci/run installs it): generate the
release of notebook 01, autograde three submissions — the release untouched, the solved notebook,
and the solved notebook with √d_k forgotten — and read the scores and the feedback.
"""

from __future__ import annotations

import importlib.util
import json
import os
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


def _nbgrader_available() -> None:
    if importlib.util.find_spec("nbgrader") is None:
        reason = "the nbgrader round trip needs the `nbgrader` extra: pip install -e '.[nbgrader]'"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


def _nbgrader(course: Path, *args: str) -> str:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    out = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout + out.stderr


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


@pytest.mark.slow
def test_nbgrader_round_trip_scores_untouched_solved_and_planted_submissions(tmp_path):
    _nbgrader_available()
    course = tmp_path / "course"
    grading.write_course(course, [ROOT / "notebooks" / f"{ASSIGNMENT}.ipynb"])
    _nbgrader(course, "generate_assignment", ASSIGNMENT, "--force")
    release = course / "release" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    solved = (course / "source" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text(encoding="utf-8")
    assert "### BEGIN SOLUTION" not in release.read_text(encoding="utf-8")
    assert PLANTED[0] in solved
    submissions = {
        "untouched": release.read_text(encoding="utf-8"),
        "solved": solved,
        "planted": solved.replace(*PLANTED),
    }
    for learner, text in submissions.items():
        folder = course / "submitted" / learner / ASSIGNMENT
        folder.mkdir(parents=True)
        (folder / f"{ASSIGNMENT}.ipynb").write_text(text, encoding="utf-8")
    _nbgrader(course, "autograde", ASSIGNMENT, "--create", "--force")
    _nbgrader(course, "generate_feedback", ASSIGNMENT, "--force")
    scores = _scores(course / "gradebook.db", list(submissions))
    assert scores == {
        "untouched": {"exercise_1_1": 0, "exercise_1_2": 0},
        "solved": {"exercise_1_1": 1, "exercise_1_2": 1},
        "planted": {"exercise_1_1": 0, "exercise_1_2": 1},
    }
    feedback = (course / "feedback" / "planted" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text(encoding="utf-8")
    assert "likely mistake — forgot to scale" in feedback
    untouched = (course / "feedback" / "untouched" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text(encoding="utf-8")
    assert "not attempted" in untouched
    # the progress view reads nbgrader's autograded notebooks and its gradebook
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "authoring",
            "progress",
            str(course / "autograded"),
            "--gradebook",
            str(course / "gradebook.db"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "planted" in out.stdout and "1/2" in out.stdout and "forgot to scale" in out.stdout
    shutil.rmtree(course, ignore_errors=True)
