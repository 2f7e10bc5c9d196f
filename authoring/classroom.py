"""A class at a glance: hub links for every notebook, and where the room is stuck.

    python3 course.py class hub-links --hub https://hub.example.edu [--edition student|solved]
    python3 course.py class progress FOLDER [--figure progress.png] [--gradebook gradebook.db]

(``python -m authoring hub-links|progress`` inside the course's environment is the same.)

``hub-links`` prints, per notebook, an nbgitpuller link (a JupyterHub with nbgitpuller clones or
updates the course in the learner's home and opens the notebook) and the notebook's Colab link. The
repository comes from one place, ``[project.urls] Repository`` in ``pyproject.toml``.

``progress`` reads a folder of learners' notebooks — one sub-folder per learner (nbgrader's
``submitted/`` or ``autograded/`` folders have that layout) or one file per learner named
``<learner>-NN_topic.ipynb`` — and shows, per learner and exercise, whether the checker said
passed (✅), attempted but not passed (❌) or not attempted (·), with the most common diagnosed mistake
per exercise: a table in the terminal and, with ``--figure``, a heatmap. It reads the checkers'
stored outputs, so learners save their notebooks after running them. ``--gradebook`` puts
nbgrader's points beside each verdict and flags (``≠``, ``disagree · …``) where the two differ; a
notebook without nbgrader's cell metadata, which nbgrader cannot grade, is named (``not gradable ·
…``). A file that is not a readable notebook of this course is named and skipped; the others are
still read.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import re
import sys
from pathlib import Path
from urllib.parse import quote, urlencode, urlsplit

from . import grading
from . import notebooks as notebook_tools

EDITIONS = {"student": "notebooks/student", "solved": "notebooks"}
EXAMPLE_HUB = "https://hub.example.edu"

# ---------------------------------------------------------------------------------------------
# hub links


def repository_url() -> str:
    owner, repo = notebook_tools.repository()
    return f"https://github.com/{owner}/{repo}"


def check_hub(hub: str) -> str:
    """The hub's base URL without a trailing slash; a clear error for anything else."""
    parts = urlsplit(hub)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(f"--hub must be the JupyterHub's address, like {EXAMPLE_HUB}, got {hub!r}")
    return hub.rstrip("/")


def nbgitpuller_link(hub: str, rel: str, *, branch: str = "main") -> str:
    """The nbgitpuller link that opens ``rel`` (a repository-relative notebook path) on ``hub`` in
    JupyterLab; nbgitpuller clones the repository into a folder named like it."""
    _, repo = notebook_tools.repository()
    query = urlencode(
        {"repo": repository_url(), "urlpath": f"lab/tree/{repo}/{rel}", "branch": branch}, quote_via=quote
    )
    return f"{check_hub(hub)}/hub/user-redirect/git-pull?{query}"


def hub_links(hub: str, *, edition: str = "student") -> list[tuple[str, str, str]]:
    """(notebook stem, nbgitpuller link, Colab link) for every numbered notebook."""
    folder = EDITIONS[edition]
    rows = []
    for path in notebook_tools.numbered_notebooks():
        rel = f"{folder}/{path.name}"
        rows.append((path.stem, nbgitpuller_link(hub, rel), notebook_tools.colab_url_for(rel)))
    return rows


def hub_links_markdown(hub: str = EXAMPLE_HUB, *, edition: str = "student") -> str:
    lines = ["| notebook | JupyterHub (nbgitpuller) | Colab |", "|---|---|---|"]
    for stem, hub_link, colab in hub_links(hub, edition=edition):
        lines.append(f"| {stem} | [open on the hub]({hub_link}) | [open in Colab]({colab}) |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the class's progress

PASSED, ATTEMPTED, NOT_ATTEMPTED = "passed", "attempted", "not attempted"
MARKS = {PASSED: "✅", ATTEMPTED: "❌", NOT_ATTEMPTED: "·"}
_DIAGNOSIS = re.compile(r"likely mistake — (?P<what>.+)")


@dataclasses.dataclass
class Progress:
    """What a folder of notebooks says: ``status[learner][exercise]`` ∈ passed / attempted / not
    attempted, ``mistakes[exercise]`` the diagnosed mistakes (one per failing learner),
    ``problems`` one line per file that was skipped, ``scores[learner]`` nbgrader's (score, max)."""

    exercises: list[str]
    status: dict[str, dict[str, str]]
    mistakes: dict[str, list[str]]
    problems: list[str]
    scores: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    #: learner -> exercise -> nbgrader's (score, max score) of that exercise's autograded cell
    grades: dict[str, dict[str, tuple[float, float]]] = dataclasses.field(default_factory=dict)
    #: learner -> the exercises whose notebook lacks nbgrader's cell metadata (nbgrader scores them 0)
    ungraded: dict[str, set[str]] = dataclasses.field(default_factory=dict)

    def disagreements(self) -> list[tuple[str, str, str]]:
        """(learner, exercise, why) wherever the checker's verdict and nbgrader's score differ:
        passed but short of full marks, or not passed but full marks."""
        found = []
        for learner, by_exercise in sorted(self.grades.items()):
            for number in self.exercises:
                if number not in by_exercise or learner not in self.status:
                    continue
                score, most = by_exercise[number]
                state = self.status[learner].get(number, NOT_ATTEMPTED)
                if (state == PASSED) != (score >= most > 0):
                    verdict = "passed" if state == PASSED else ("failed" if state == ATTEMPTED else state)
                    why = f"the checker says {verdict}, nbgrader gave {score:g}/{most:g}"
                    if number in self.ungraded.get(learner, set()):
                        why += " (its notebook lacks nbgrader's cell metadata)"
                    found.append((learner, number, why))
        return found

    def most_common_mistake(self, exercise: str) -> tuple[str, int] | None:
        found = collections.Counter(self.mistakes.get(exercise, [])).most_common(1)
        return found[0] if found else None


def course_exercises() -> dict[str, list[tuple[str, str, str]]]:
    """notebook stem -> [(exercise number, checker name, function name)] of the solved notebooks."""
    from . import student_edition

    table: dict[str, list[tuple[str, str, str]]] = {}
    for e in student_edition.exercises():
        table.setdefault(e.notebook, []).append((e.number, e.checker, e.function or ""))
    return table


def _text(output) -> str:
    if output.get("output_type") == "stream":
        text = output.get("text", "")
    elif output.get("output_type") == "error":
        text = "\n".join([output.get("ename", ""), output.get("evalue", "")])
    else:
        text = output.get("data", {}).get("text/plain", "")
    return "".join(text) if isinstance(text, list) else text


def _cell_status(cell) -> tuple[str, str | None] | None:
    """(status, diagnosis) from a checker cell's stored outputs; None if it has none."""
    texts = [_text(o) for o in cell.get("outputs", [])]
    joined = "\n".join(texts)
    if "✅" in joined:
        return PASSED, None
    if "❌" in joined:
        m = _DIAGNOSIS.search(joined)
        return ATTEMPTED, (m.group("what").strip() if m else "another error (no known mistake matched)")
    if "⏳" in joined:
        return NOT_ATTEMPTED, None
    return None


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def read_notebook(
    path: Path, known: dict[str, list[tuple[str, str, str]]]
) -> tuple[str, dict[str, tuple[str, str | None]]]:
    """(notebook stem, exercise -> (status, diagnosis)) of one learner's notebook.
    Raises ValueError with a message a person can act on."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not a readable notebook ({type(e).__name__}: {str(e)[:80]})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError("not a Jupyter notebook (no list of cells)")
    cells = [c for c in nb["cells"] if isinstance(c, dict)]
    code = [c for c in cells if c.get("cell_type") == "code"]
    if not any("mha_course" in _source(c) for c in code):
        raise ValueError("not a notebook of this course (it never imports mha_course)")
    stem = next((s for s in known if s in path.stem), None)
    if stem is None:
        raise ValueError(f"its name names none of the course's notebooks ({', '.join(sorted(known)[:2])}, …)")
    expected = known[stem]
    found: dict[str, tuple[str, str | None]] = {}
    previous = ""
    for cell in code:
        source = _source(cell)
        for number, checker, function in expected:
            # the exercise's own call: its checker on its function (a notebook may demo a checker
            # on other functions elsewhere)
            if number not in found and re.search(rf"\bmc\.check\.{checker}\(\s*{function}\b", source):
                # the learner's function sits in the checker's cell (the course's layout) or in
                # the cell before it (nbgrader's release)
                code_before = source if f"def {function}" in source else previous
                status = _cell_status(cell)
                if status is None:  # never run: attempted once the placeholder raise is gone
                    status = (NOT_ATTEMPTED if "raise NotImplementedError" in code_before else ATTEMPTED, None)
                found[number] = status
        previous = source
    for number, _, _ in expected:
        found.setdefault(number, (NOT_ATTEMPTED, None))
    return stem, found


def _learner(path: Path, folder: Path, stem: str | None) -> str:
    rel = path.relative_to(folder)
    if len(rel.parts) > 1:
        return rel.parts[0]
    name = path.stem
    if stem and stem in name:
        name = name.replace(stem, "").strip("-_ ")
    return name or path.stem


def collect(folder: Path, *, gradebook: Path | None = None) -> Progress:
    """Read every ``*.ipynb`` under ``folder`` (checkpoints left out) into a :class:`Progress`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder")
    paths = sorted(p for p in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    if not paths:
        raise ValueError(f"{folder} holds no notebooks (*.ipynb), nor do its sub-folders")
    known = course_exercises()
    status: dict[str, dict[str, str]] = {}
    mistakes: dict[str, list[str]] = {}
    problems: list[str] = []
    numbers: set[str] = set()
    ungraded: dict[str, set[str]] = {}
    for path in paths:
        try:
            stem, found = read_notebook(path, known)
        except ValueError as e:
            problems.append(f"skipped {path.relative_to(folder)}: {e}")
            continue
        learner = _learner(path, folder, stem)
        graded = {grading.exercise_number(g) for g in grading._grade_ids(path)}
        lacking = [n for n in found if n not in graded]
        if lacking:
            ungraded.setdefault(learner, set()).update(lacking)
            problems.append(
                f"not gradable · {learner}: {path.name} lacks nbgrader's cell metadata of exercise(s) "
                f"{', '.join(lacking)} (not saved from the student edition or nbgrader's release): "
                "nbgrader scores them 0 whatever the checkers say"
            )
        for number, (state, diagnosis) in found.items():
            numbers.add(number)
            status.setdefault(learner, {})[number] = state
            if diagnosis:
                mistakes.setdefault(number, []).append(diagnosis)
    order = [n for table in known.values() for n, _, _ in table]
    progress = Progress(sorted(numbers, key=order.index), status, mistakes, problems, ungraded=ungraded)
    if gradebook is not None:
        progress.scores, progress.grades = read_scores(gradebook, problems)
    return progress


def read_scores(
    gradebook: Path, problems: list[str]
) -> tuple[dict[str, tuple[float, float]], dict[str, dict[str, tuple[float, float]]]]:
    """(learner -> (score, max score) over every assignment, learner -> exercise -> (score, max))
    from nbgrader's gradebook."""
    try:
        from nbgrader.api import Gradebook
    except ImportError:
        problems.append("no scores: reading a gradebook needs nbgrader (python3 course.py class progress installs it)")
        return {}, {}
    if not Path(gradebook).is_file():
        problems.append(f"no scores: {gradebook} is not a file")
        return {}, {}
    scores: dict[str, tuple[float, float]] = {}
    grades: dict[str, dict[str, tuple[float, float]]] = {}
    try:
        with Gradebook(f"sqlite:///{Path(gradebook).resolve()}") as gb:
            for student in gb.students:
                total = [0.0, 0.0]
                for assignment in gb.assignments:
                    try:
                        sub = gb.find_submission(assignment.name, student.id)
                    except Exception:  # noqa: BLE001 (nbgrader's MissingEntry: not submitted)
                        continue
                    total[0] += sub.score
                    total[1] += sub.max_score
                    for notebook in sub.notebooks:
                        for grade in notebook.grades:
                            number = grading.exercise_number(grade.name)
                            grades.setdefault(student.id, {})[number] = (grade.score, grade.max_score)
                scores[student.id] = (total[0], total[1])
    except Exception as e:  # noqa: BLE001 (a corrupt or foreign database)
        problems.append(f"no scores: {gradebook} is not an nbgrader gradebook ({type(e).__name__})")
    return scores, grades


def table_text(progress: Progress) -> str:
    """The terminal view: one row per learner, one column per exercise (the checker's verdict, and
    with a gradebook nbgrader's points beside it, ``≠`` where the two disagree), then one line per
    exercise and one per disagreement."""
    learners = sorted(progress.status)
    width = max([7] + [len(name) for name in learners])
    cols = progress.exercises
    disagree = {(learner, number) for learner, number, _ in progress.disagreements()}
    cell = 9 if progress.grades else 5

    def mark(name: str, number: str) -> str:
        text = MARKS[progress.status[name].get(number, NOT_ATTEMPTED)]
        if progress.grades:
            grade = progress.grades.get(name, {}).get(number)
            text += f" {grade[0]:g}/{grade[1]:g}" if grade else " —"
            text += "≠" if (name, number) in disagree else ""
        return text

    head = f"{'learner':<{width}}  " + "  ".join(f"{n:>{cell}}" for n in cols)
    if progress.scores:
        head += "  score"
    lines = [head]
    for name in learners:
        row = f"{name:<{width}}  " + "  ".join(f"{mark(name, n):>{cell}}" for n in cols)
        if progress.scores:
            score = progress.scores.get(name)
            row += f"  {score[0]:g}/{score[1]:g}" if score else "  —"
        lines.append(row)
    legend = (
        f"{MARKS[PASSED]} passed   {MARKS[ATTEMPTED]} attempted, not passed (or saved without running "
        f"its checker)   {MARKS[NOT_ATTEMPTED]} not attempted"
    )
    if progress.grades:
        legend += "   N/M nbgrader's points   ≠ checker and points disagree"
    lines += ["", legend, ""]
    for n in cols:
        states = [progress.status[name].get(n, NOT_ATTEMPTED) for name in learners]
        line = (
            f"exercise {n}: {states.count(PASSED)}/{len(learners)} passed, "
            f"{states.count(ATTEMPTED)} stuck, {states.count(NOT_ATTEMPTED)} not attempted"
        )
        common = progress.most_common_mistake(n)
        if common:
            line += f"; most common mistake ({common[1]}×): {common[0]}"
        lines.append(line)
    for learner, number, why in progress.disagreements():
        lines.append(f"disagree · {learner}, exercise {number}: {why}")
    return "\n".join(lines)


def heatmap(progress: Progress):
    """A matplotlib Figure: learners × exercises, coloured by status."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    learners = sorted(progress.status)
    codes = {NOT_ATTEMPTED: 0, ATTEMPTED: 1, PASSED: 2}
    grid = [[codes[progress.status[name].get(n, NOT_ATTEMPTED)] for n in progress.exercises] for name in learners]
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(progress.exercises) + 3), max(3, 0.4 * len(learners) + 1.8)))
    image = ax.imshow(grid, cmap=ListedColormap(["#d0d7de", "#cf222e", "#1a7f37"]), vmin=-0.5, vmax=2.5, aspect="auto")
    ax.set_xticks(range(len(progress.exercises)), progress.exercises, rotation=90)
    ax.set_yticks(range(len(learners)), learners)
    ax.set_xlabel("exercise")
    ax.set_ylabel("learner")
    stuck = {n: sum(progress.status[x].get(n) == ATTEMPTED for x in learners) for n in progress.exercises}
    worst = max(stuck, key=stuck.get)
    where = f"most stuck: {worst} ({stuck[worst]} of {len(learners)})" if stuck[worst] else "nobody stuck"
    ax.set_title(f"Class progress\n{len(learners)} learners · {len(progress.exercises)} exercises · {where}")
    bar = fig.colorbar(image, ax=ax, ticks=[0, 1, 2])
    bar.ax.set_yticklabels(["not attempted", "attempted", "passed"])
    fig.tight_layout()
    return fig


def _progress_main(args) -> int:
    try:
        progress = collect(args.folder, gradebook=args.gradebook)
    except ValueError as e:
        print(f"progress: {e}")
        return 2
    for line in progress.problems:
        print(line)
    if not progress.status:
        print(f"progress: none of the notebooks under {args.folder} could be read as this course's")
        return 1
    print(table_text(progress))
    if args.figure:
        fig = heatmap(progress)
        fig.savefig(args.figure, dpi=120)
        print(f"heatmap written to {args.figure}")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m authoring", description="a class at a glance")
    sub = parser.add_subparsers(dest="command", required=True)
    links = sub.add_parser("hub-links", help="nbgitpuller and Colab links for every notebook")
    links.add_argument("--hub", required=True, help=f"the JupyterHub's address, e.g. {EXAMPLE_HUB}")
    links.add_argument("--edition", choices=sorted(EDITIONS), default="student")
    prog = sub.add_parser("progress", help="learners x exercises from a folder of notebooks")
    prog.add_argument("folder", type=Path)
    prog.add_argument("--figure", type=Path, help="also write a heatmap (PNG)")
    prog.add_argument("--gradebook", type=Path, help="nbgrader's gradebook.db: adds each learner's score")
    args = parser.parse_args(argv)
    if args.command == "hub-links":
        try:
            rows = hub_links(args.hub, edition=args.edition)
        except ValueError as e:
            print(f"hub-links: {e}")
            return 2
        for stem, hub_link, colab in rows:
            print(f"{stem}\n  hub:   {hub_link}\n  colab: {colab}")
        return 0
    return _progress_main(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
