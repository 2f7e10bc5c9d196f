"""nbgrader for a class: the course's exercises as an nbgrader course, from the same source.

    python -m authoring nbgrader COURSE_DIR [NOTEBOOK ...] [--points N.M=P ...]

writes an nbgrader course directory: ``COURSE_DIR/nbgrader_config.py`` and, per numbered notebook
(default: all), ``COURSE_DIR/source/NN_topic/NN_topic.ipynb``. Then, in COURSE_DIR::

    nbgrader generate_assignment NN_topic      # the release learners get (solutions removed)
    nbgrader autograde NN_topic --create       # grade submitted/<learner>/NN_topic/NN_topic.ipynb
    nbgrader generate_feedback NN_topic        # feedback/<learner>/NN_topic/NN_topic.html

The source notebook is the solved notebook with nbgrader's cell metadata added, so the student
edition (``python -m authoring student-edition``) and nbgrader's release come from one file:

* each exercise cell becomes two cells: the learner's function (an nbgrader *solution* cell: its
  ``### BEGIN SOLUTION`` … ``### END SOLUTION`` region is what nbgrader clears) and, after it, a
  read-only *autograded test* cell that runs the exercise's checker and fails with the checker's own
  message (``likely mistake — forgot to scale by √d_k``), worth :data:`DEFAULT_POINTS` points
  (``--points`` changes one exercise's);
* the setup cell is read-only (editing it breaks every cell below);
* cells tagged ``solution`` are left out, as in the student edition; outputs are cleared.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
from pathlib import Path

from . import notebooks as notebook_tools
from .student_edition import SOLUTION_TAG, Exercise, strip_solutions

#: points of an exercise unless ``--points`` says otherwise (the instructor guide states them)
DEFAULT_POINTS = 1
SCHEMA_VERSION = 3
_CHECK_LINE = re.compile(r"^mc\.check\.(?P<name>\w+)\s*\((?P<args>.*)\)\s*$")
#: what nbgrader puts where a solution was (the course's checkers read NotImplementedError as "not attempted")
CODE_STUB = "# your code here (mc.hint gives a hint, one step at a time)\nraise NotImplementedError()"

CONFIG = """\
# nbgrader configuration of the mha-course class (written by `python -m authoring nbgrader`).
c = get_config()  # noqa: F821 (nbgrader provides it)
c.CourseDirectory.course_id = "mha-course"
# what a cleared solution region becomes: the course's checkers report NotImplementedError as
# "not attempted" (0 points)
c.ClearSolutions.code_stub = {{"python": {stub}}}
# the slowest notebook takes about 90 s on a 2-core laptop
c.ExecutePreprocessor.timeout = 600
c.Execute.timeout = 600
"""


def _meta(grade_id: str, *, solution=False, grade=False, locked=False, points=None) -> dict:
    meta = {
        "grade": grade,
        "grade_id": grade_id,
        "locked": locked,
        "schema_version": SCHEMA_VERSION,
        "solution": solution,
        "task": False,
    }
    if grade:
        meta["points"] = points
    return meta


def test_source(checker: str, args: str) -> str:
    """The autograded test cell of one checker call: the checker's verdict shown, then asserted,
    so nbgrader's feedback shows the checker's message (the likely mistake) when it fails."""
    return (
        "# Autograded: the exercise's checker (read-only). Its message names the likely mistake.\n"
        f"result = mc.check.{checker}({args})\n"
        "display(result)\n"
        "assert result.passed, result.message"
    )


def grade_id(number: str) -> str:
    """nbgrader's id of exercise ``number`` ("1.2" -> "exercise_1_2"); ids allow [A-Za-z0-9_-]."""
    return "exercise_" + number.replace(".", "_")


def source_notebook(nb, *, notebook: str, points: dict[str, int] | None = None):
    """(nbgrader source version of the solved notebook ``nb``, its exercises).

    ``notebook``: the file stem; ``points``: exercise number -> points (default
    :data:`DEFAULT_POINTS` each). ``nb`` is not modified."""
    import nbformat

    points = points or {}
    out = copy.deepcopy(nb)
    cells, exercises = [], []
    for index, cell in enumerate(nb.cells):
        tags = cell.get("metadata", {}).get("tags", [])
        if SOLUTION_TAG in tags:
            continue
        new = copy.deepcopy(cell)
        if cell.cell_type == "code":
            new.outputs, new.execution_count = [], None
            new.metadata.pop("execution", None)
            source = "".join(cell.source) if isinstance(cell.source, list) else cell.source
            _, found = strip_solutions(source, notebook=notebook, cell=index, first_number=len(exercises) + 1)
            if "setup" in tags:
                new.metadata["nbgrader"] = _meta("setup", locked=True)
            if found:
                cells += _split_exercise_cell(new, source, found, points, notebook)
                exercises += found
                continue
        cells.append(new)
    out.cells = cells
    nbformat.validate(out)
    return out, exercises


def _split_exercise_cell(cell, source: str, found: list[Exercise], points: dict[str, int], notebook: str) -> list:
    """An exercise cell as nbgrader wants it: the solution cell, then one test cell per checker call."""
    lines = source.split("\n")
    checks = [(i, m) for i, line in enumerate(lines) if (m := _CHECK_LINE.match(line))]
    if not checks:
        raise ValueError(
            f"{notebook}: exercise {found[0].number}'s cell calls no mc.check.<name>(...) on a line of its own"
        )
    solution = copy.deepcopy(cell)
    solution.source = "\n".join(lines[: checks[0][0]]).rstrip()
    solution.metadata["nbgrader"] = _meta(grade_id(found[0].number) + "_answer", solution=True)
    cells = [solution]
    # one test cell per checker call: paired with the exercises in order when they are as many,
    # else one test cell worth all of them
    groups = [[e] for e in found] if len(found) == len(checks) else [found]
    for n, ((_, match), group) in enumerate(zip(checks, groups, strict=False), 1):
        test = copy.deepcopy(cell)
        if "id" in cell:  # cell ids are unique within a notebook
            test.id = f"{cell.id}-check{n}"[:64]
        test.source = test_source(match.group("name"), match.group("args"))
        worth = sum(points.get(e.number, DEFAULT_POINTS) for e in group)
        test.metadata["nbgrader"] = _meta(grade_id(group[0].number), grade=True, locked=True, points=worth)
        cells.append(test)
    return cells


def write_course(course_dir: Path, sources=None, *, points: dict[str, int] | None = None) -> list[Exercise]:
    """Write ``nbgrader_config.py`` and ``source/<stem>/<stem>.ipynb`` for each solved notebook
    ``sources`` (default: every numbered notebook) into ``course_dir``. Returns the exercises."""
    import nbformat

    course_dir = Path(course_dir)
    course_dir.mkdir(parents=True, exist_ok=True)
    (course_dir / "nbgrader_config.py").write_text(CONFIG.format(stub=json.dumps(CODE_STUB)), encoding="utf-8")
    found: list[Exercise] = []
    for path in sources or notebook_tools.numbered_notebooks():
        path = Path(path)
        nb = nbformat.read(path, as_version=4)
        source, exercises = source_notebook(nb, notebook=path.stem, points=points)
        folder = course_dir / "source" / path.stem
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(source, folder / path.name)
        found += exercises
    return found


def points_table(found: list[Exercise], points: dict[str, int] | None = None) -> str:
    """Markdown table: exercise, function, checker, points."""
    points = points or {}
    rows = ["| exercise | notebook | function | checker | points |", "|---|---|---|---|---|"]
    for e in found:
        rows.append(
            f"| {e.number} | {e.notebook} | `{e.function}` | `mc.check.{e.checker}` | "
            f"{points.get(e.number, DEFAULT_POINTS)} |"
        )
    return "\n".join(rows)


def _parse_points(items: list[str]) -> dict[str, int]:
    points = {}
    for item in items:
        number, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"\d+\.\d+", number) or not value.isdigit():
            raise SystemExit(f"--points takes N.M=POINTS (e.g. 1.2=3), got {item!r}")
        points[number] = int(value)
    return points


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m authoring nbgrader", description=__doc__.split("\n\n")[0])
    parser.add_argument("course_dir", type=Path, help="the nbgrader course directory to write")
    parser.add_argument("notebooks", nargs="*", help="numbered notebooks (default: all), by path or stem")
    parser.add_argument("--points", nargs="*", default=[], metavar="N.M=P", help="points of one exercise")
    args = parser.parse_args(argv)
    points = _parse_points(args.points)
    paths = []
    for name in args.notebooks:
        path = Path(name)
        if not path.exists():
            matches = [p for p in notebook_tools.numbered_notebooks() if p.stem.startswith(name)]
            if len(matches) != 1:
                print(f"no single course notebook matches {name!r}")
                return 2
            path = matches[0]
        paths.append(path)
    found = write_course(args.course_dir, paths or None, points=points)
    assignments = sorted({e.notebook for e in found} | {Path(p).stem for p in paths})
    print(
        f"{args.course_dir}: {len(found)} exercises in {len(assignments)} assignments, "
        f"{sum(points.get(e.number, DEFAULT_POINTS) for e in found)} points in all"
    )
    example = assignments[0] if assignments else "NN_topic"
    print(f"next: cd {args.course_dir} && nbgrader generate_assignment {example}")
    return 0
