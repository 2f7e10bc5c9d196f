"""nbgrader for a class: the course's exercises as an nbgrader course, from the same source.

    python3 course.py class nbgrader COURSE_DIR [NOTEBOOK ...] [--points N.M=P ...] [--no-release]
    python3 course.py class autograde COURSE_DIR NN_topic [NBGRADER OPTIONS]
    python3 course.py class feedback COURSE_DIR NN_topic [NBGRADER OPTIONS]

(``python -m authoring nbgrader|autograde|feedback`` inside the course's environment is the same.)
``nbgrader`` writes an nbgrader course directory: ``COURSE_DIR/nbgrader_config.py`` and, per
numbered notebook (default: all), ``COURSE_DIR/source/NN_topic/NN_topic.ipynb``, then runs
``nbgrader generate_assignment`` for each (the release and the gradebook). ``autograde`` grades
``submitted/<learner>/NN_topic/NN_topic.ipynb`` and prints each learner's points, naming every
submission that lacks nbgrader's cell metadata (nbgrader would score it 0 without a word);
``feedback`` writes ``feedback/<learner>/NN_topic/NN_topic.html``. nbgrader runs with this
interpreter's bin folder on PATH (it starts ``alembic`` and the kernels by name).

The source notebook is the solved notebook with nbgrader's cell metadata added, so the student
edition (``python -m authoring student-edition``, which carries the same cell metadata, so a
notebook saved from it is a submission) and nbgrader's release come from one file:

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
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from . import DECLINED_IMPORTS
from . import notebooks as notebook_tools
from .student_edition import SOLUTION_TAG, Exercise, strip_solutions

#: points of an exercise unless ``--points`` says otherwise (the instructor guide states them)
DEFAULT_POINTS = 1
SCHEMA_VERSION = 3
_CHECK_LINE = CHECK_LINE = re.compile(r"^mc\.check\.(?P<name>\w+)\s*\((?P<args>.*)\)\s*$", re.M)
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


def nbgrader_meta(grade_id: str, *, solution=False, grade=False, locked=False, points=None) -> dict:
    """nbgrader's cell metadata (schema 3): a solution cell, an autograded test cell worth ``points``,
    or a read-only cell."""
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
                new.metadata["nbgrader"] = nbgrader_meta("setup", locked=True)
            if found:
                cells += split_exercise_cell(new, source, found, points, notebook)
                exercises += found
                continue
        cells.append(new)
    out.cells = cells
    nbformat.validate(out)
    return out, exercises


def student_check_source(checker: str, args: str) -> str:
    """The check cell of the student edition: the exercise's checker call, as the solved notebook
    has it. ``nbgrader autograde`` restores the read-only cells of a submission from its gradebook,
    so a submitted student edition is graded by :func:`test_source`'s cell."""
    return f"mc.check.{checker}({args})"


def split_exercise_cell(
    cell, source: str, found: list[Exercise], points: dict[str, int], notebook: str, *, graded: bool = True
) -> list:
    """An exercise cell as nbgrader wants it: the solution cell, then one test cell per checker call.

    ``graded``: the test cells assert the checker's verdict (the nbgrader source); otherwise they
    only show it (the student edition, which must run top to bottom). The cell ids, grade ids and
    points are the same either way, so a submitted student edition is graded like the release."""
    lines = source.split("\n")
    checks = [(i, m) for i, line in enumerate(lines) if (m := _CHECK_LINE.match(line))]
    if not checks:
        raise ValueError(
            f"{notebook}: exercise {found[0].number}'s cell calls no mc.check.<name>(...) on a line of its own"
        )
    rest = [line for i, line in enumerate(lines[checks[0][0] :], checks[0][0]) if line.strip()]
    if len(rest) != len(checks):
        raise ValueError(
            f"{notebook}: exercise {found[0].number}'s cell has code after its first mc.check call; "
            "end the cell with the checker call(s), each on a line of its own"
        )
    solution = copy.deepcopy(cell)
    solution.source = "\n".join(lines[: checks[0][0]]).rstrip()
    solution.metadata["nbgrader"] = nbgrader_meta(grade_id(found[0].number) + "_answer", solution=True)
    cells = [solution]
    # one test cell per checker call: paired with the exercises in order when they are as many,
    # else one test cell worth all of them
    groups = [[e] for e in found] if len(found) == len(checks) else [found]
    for n, ((_, match), group) in enumerate(zip(checks, groups, strict=False), 1):
        test = copy.deepcopy(cell)
        if "id" in cell:  # cell ids are unique within a notebook
            test.id = f"{cell.id}-check{n}"[:64]
        make = test_source if graded else student_check_source
        test.source = make(match.group("name"), match.group("args"))
        worth = sum(points.get(e.number, DEFAULT_POINTS) for e in group)
        test.metadata["nbgrader"] = nbgrader_meta(grade_id(group[0].number), grade=True, locked=True, points=worth)
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


# ---------------------------------------------------------------------------------------------
# nbgrader's steps, run from the course's environment


def nbgrader_missing() -> str | None:
    """None when nbgrader is importable here, else what to do about it."""
    if importlib.util.find_spec("nbgrader") is None:
        return (
            "nbgrader is not installed in this environment: `python3 course.py class ...` installs it on "
            "first use (or: .venv/bin/python -m pip install -e '.[nbgrader]')"
        )
    return None


#: ``python -m nbgrader``, declining the imports these tools decline (authoring/__init__.py); the
#: nbgrader process does not see this checkout, so the names are written into the code
NBGRADER_MAIN = (
    "import sys\n"
    f"for name in {DECLINED_IMPORTS!r}:\n"
    "    sys.modules.setdefault(name, None)\n"
    "sys.argv[0] = 'nbgrader'\n"
    "from nbgrader.apps.nbgraderapp import main\n"
    "main()"
)


def run_nbgrader(course_dir: Path, *args: str, capture: bool = False) -> subprocess.CompletedProcess:
    """``nbgrader ARGS`` in ``course_dir``, by this interpreter, with its bin folder on PATH (nbgrader
    starts ``alembic`` and Jupyter kernels by name, from the PATH)."""
    bindir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=os.pathsep.join([bindir, os.environ.get("PATH", "")]))
    # course.py puts this checkout on PYTHONPATH (for `python -m authoring` from any folder); nbgrader
    # and the kernels it starts need only the installed package, and see the environment a
    # learner's kernel has (in a test session, that also lets them fork from the warm zygote)
    checkout = str(Path(__file__).resolve().parents[1])
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != checkout]
    if rest:
        env["PYTHONPATH"] = os.pathsep.join(rest)
    else:
        env.pop("PYTHONPATH", None)
    # nbgrader's own use of its database warns (SQLAlchemy's SAWarning) on every submission: noise,
    # silenced in nbgrader's process only (-W, not PYTHONWARNINGS, which its kernels would inherit)
    return subprocess.run(
        [sys.executable, "-W", "ignore::Warning:nbgrader.api", "-c", NBGRADER_MAIN, *args],
        cwd=course_dir,
        env=env,
        capture_output=capture,
        text=True,
    )


def _grade_ids(path: Path) -> list[str]:
    """The grade ids of a notebook's autograded cells, in order ([] for a file that is not a notebook)."""
    try:
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return []
    cells = nb.get("cells", []) if isinstance(nb, dict) else []
    metas = [c.get("metadata", {}).get("nbgrader", {}) for c in cells if isinstance(c, dict)]
    return [m["grade_id"] for m in metas if isinstance(m, dict) and m.get("grade") and "grade_id" in m]


def exercise_number(grade: str) -> str:
    """The exercise of an nbgrader grade id ("exercise_1_2" -> "1.2"); other ids unchanged."""
    m = re.fullmatch(r"exercise_(\d+)_(\d+)", grade)
    return f"{m.group(1)}.{m.group(2)}" if m else grade


def ungradable(course_dir: Path, assignment: str) -> list[str]:
    """One line per submitted notebook of ``assignment`` that lacks the autograded cells of its
    source (a copy of the solved notebook, or one whose cell metadata an editor dropped): nbgrader
    would score those exercises 0, whatever the learner's code does."""
    course_dir = Path(course_dir)
    sources = sorted((course_dir / "source" / assignment).glob("*.ipynb"))
    lines = []
    for learner in sorted(p for p in (course_dir / "submitted").glob("*") if p.is_dir()):
        for source in sources:
            submitted = learner / assignment / source.name
            if not submitted.is_file():
                continue
            missing = [g for g in _grade_ids(source) if g not in set(_grade_ids(submitted))]
            if missing:
                numbers = ", ".join(exercise_number(g) for g in missing)
                lines.append(
                    f"{learner.name}: {source.name} lacks nbgrader's cell metadata of exercise(s) {numbers} "
                    "(it was not saved from the student edition or nbgrader's release), so nbgrader scores "
                    "them 0 whatever its code does; `class progress` shows what its checkers said. Have "
                    "the learner paste the functions into the student edition and submit that."
                )
    return lines


_RESTORED = re.compile(r"Attribute 'checksum' for cell \S+ has changed!")


def _cells(path: Path) -> list[dict]:
    try:
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return []
    return [c for c in nb.get("cells", []) if isinstance(c, dict)] if isinstance(nb, dict) else []


def edited_checks(course_dir: Path, assignment: str) -> list[str]:
    """One line per read-only cell a learner changed (neither the student edition's form nor the
    release's): nbgrader grades it as the gradebook has it, whatever the learner wrote."""
    course_dir = Path(course_dir)
    lines = []
    for source in sorted((course_dir / "source" / assignment).glob("*.ipynb")):
        release = course_dir / "release" / assignment / source.name
        allowed: dict[str, set[str]] = {}
        for cell in _cells(source) + _cells(release):
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if meta.get("locked"):
                text = "".join(cell.get("source", ""))
                allowed.setdefault(meta["grade_id"], set()).add(text)
                m = re.search(r"^result = (mc\.check\.\w+\(.*\))$", text, re.M)
                if m:  # the student edition's form of an autograded cell
                    allowed[meta["grade_id"]].add(m.group(1))
        for learner in sorted(p for p in (course_dir / "submitted").glob("*") if p.is_dir()):
            for cell in _cells(learner / assignment / source.name):
                meta = cell.get("metadata", {}).get("nbgrader", {})
                text = "".join(cell.get("source", ""))
                if meta.get("grade_id") in allowed and text not in allowed[meta["grade_id"]]:
                    lines.append(
                        f"{learner.name}: {source.name}'s read-only cell {meta['grade_id']} was edited; "
                        "nbgrader graded the gradebook's version of it"
                    )
    return lines


def submission_scores(course_dir: Path, assignment: str) -> dict[str, tuple[float, float]]:
    """learner -> (score, max score) of ``assignment`` in the course's gradebook."""
    from nbgrader.api import Gradebook, MissingEntry

    db = Path(course_dir) / "gradebook.db"
    scores = {}
    with Gradebook(f"sqlite:///{db.resolve()}") as gb:
        for student in gb.students:
            try:
                sub = gb.find_submission(assignment, student.id)
            except MissingEntry:
                continue
            scores[student.id] = (sub.score, sub.max_score)
    return scores


def autograde_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m authoring autograde",
        description="nbgrader autograde of one assignment, then each learner's score; a submission "
        "that lacks nbgrader's cell metadata is named, not scored 0 in silence",
    )
    parser.add_argument("course_dir", type=Path, help="the nbgrader course directory (python -m authoring nbgrader)")
    parser.add_argument("assignment", help="e.g. 01_single_head_attention")
    parser.add_argument("nbgrader_args", nargs=argparse.REMAINDER, help="more options for nbgrader (e.g. --force)")
    args = parser.parse_args(argv)
    if why := nbgrader_missing():
        print(f"autograde: {why}")
        return 2
    if not (args.course_dir / "source" / args.assignment).is_dir():
        print(f"autograde: {args.course_dir} has no assignment {args.assignment!r} (source/{args.assignment}/)")
        return 2
    problems = ungradable(args.course_dir, args.assignment)
    edited = edited_checks(args.course_dir, args.assignment)
    result = run_nbgrader(args.course_dir, "autograde", args.assignment, "--create", *args.nbgrader_args, capture=True)
    for line in (result.stdout + result.stderr).splitlines():
        # the student edition's check cells differ from the gradebook's on purpose (they show the
        # verdict, the gradebook's assert it): nbgrader restores them and says so for each; that
        # is expected, so only the cells a learner edited are reported (below)
        if not _RESTORED.search(line):
            print(line)
    if result.returncode != 0:
        print(f"autograde: nbgrader autograde {args.assignment} failed (exit {result.returncode}; see above)")
        return result.returncode
    scores = submission_scores(args.course_dir, args.assignment)
    width = max([7, *map(len, scores)])
    print(f"\n{args.assignment}: {len(scores)} submission{'s' * (len(scores) != 1)} graded")
    for learner, (score, most) in sorted(scores.items()):
        flag = "  (not gradable: see below)" if any(p.startswith(f"{learner}: ") for p in problems) else ""
        print(f"  {learner:<{width}}  {score:g}/{most:g} points{flag}")
    for line in problems:
        print(f"not gradable · {line}")
    for line in edited:
        print(f"restored · {line}")
    print(f"feedback: python3 course.py class feedback {args.course_dir} {args.assignment}")
    return 0


def feedback_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m authoring feedback", description="nbgrader generate_feedback of one assignment"
    )
    parser.add_argument("course_dir", type=Path)
    parser.add_argument("assignment")
    parser.add_argument("nbgrader_args", nargs=argparse.REMAINDER, help="more options for nbgrader (e.g. --force)")
    args = parser.parse_args(argv)
    if why := nbgrader_missing():
        print(f"feedback: {why}")
        return 2
    result = run_nbgrader(args.course_dir, "generate_feedback", args.assignment, *args.nbgrader_args)
    if result.returncode != 0:
        print(f"feedback: nbgrader generate_feedback {args.assignment} failed (exit {result.returncode}; see above)")
        return result.returncode
    written = sorted((args.course_dir / "feedback").glob(f"*/{args.assignment}/*.html"))
    print(f"{len(written)} feedback file(s) under {args.course_dir / 'feedback'} (one per learner and notebook)")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m authoring nbgrader", description=__doc__.split("\n\n")[0])
    parser.add_argument("course_dir", type=Path, help="the nbgrader course directory to write")
    parser.add_argument("notebooks", nargs="*", help="numbered notebooks (default: all), by path or stem")
    parser.add_argument("--points", nargs="*", default=[], metavar="N.M=P", help="points of one exercise")
    parser.add_argument(
        "--no-release", action="store_true", help="write the source notebooks only (no nbgrader generate_assignment)"
    )
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
    if args.no_release:
        print(f"next: python3 course.py class nbgrader {args.course_dir} (without --no-release) generates the releases")
        return 0
    if why := nbgrader_missing():
        print(f"the releases were not generated: {why}")
        return 2
    for assignment in assignments:  # the release, and the gradebook autograde compares submissions with
        result = run_nbgrader(args.course_dir, "generate_assignment", assignment, "--force", capture=True)
        if result.returncode != 0:
            print(result.stdout[-3000:] + result.stderr[-3000:])
            print(f"nbgrader generate_assignment {assignment} failed (exit {result.returncode}; its log is above)")
            return result.returncode
    print(f"released: {', '.join(f'release/{a}/' for a in assignments)} (and the gradebook, gradebook.db)")
    print(
        "learners open the student edition (hub links: python3 course.py class hub-links --hub URL); "
        f"put each one's saved notebook at submitted/<learner>/{example}/{example}.ipynb, then: "
        f"python3 course.py class autograde {args.course_dir} {example}"
    )
    return 0
