"""The student edition: every numbered notebook with its exercise solutions taken out.

    python -m authoring student-edition OUT_DIR           build (the committed copy: notebooks/student)
    python -m authoring student-edition OUT_DIR --check   exit 1 if OUT_DIR is not what a build would write

What a build does to each solution notebook ``notebooks/NN_*.ipynb`` (see docs/authoring.md):

* in code cells, each region ``### BEGIN SOLUTION`` … ``### END SOLUTION`` becomes
  ``raise NotImplementedError("Exercise N.M: your code here — mc.hint("N.M") gives a hint, ...")``,
  indented like the BEGIN line (N: the notebook's number without the leading zero; M: 1, 2, … in
  the notebook's order); the hints themselves are ladders in ``mha_course/kit/hints/NN.json``;
  regions in the methods of one class (``__init__`` and ``forward`` of a module the learner
  writes) are one exercise, named after the class;
* cells tagged ``solution`` are removed;
* changed code cells lose their outputs and execution counts, and so does every cell that calls a
  checker (a stored ✅ would tell a learner the exercise is done); other cells keep theirs;
* the Colab badge points at the student copy (``notebooks/student/NAME.ipynb``) and a line under
  it says that this is the student edition;
* relative links in markdown that leave the folder are rewritten for the folder one level down.

A malformed region (text after BEGIN SOLUTION, no END, an END without a BEGIN, nested regions, a region at the top
level of a cell, where the raise would stop the notebook) is an error that names the notebook and
the cell. Building the committed copy (OUT_DIR = notebooks/student) also brings the generated
exercise reference of ``docs/instructor_guide.md`` up to date (exercises, hint ladders, and each
checker's list of diagnosed mistakes).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import re
import unicodedata
from collections.abc import Iterable
from pathlib import Path

from . import notebooks as notebook_tools

SOLUTION_TAG = "solution"
#: where the committed student edition lives (its Colab badges point here)
STUDENT_DIR = notebook_tools.NOTEBOOKS / "student"
GUIDE = notebook_tools.ROOT / "docs" / "instructor_guide.md"
NOTE = (
    "> **Student edition.** Each exercise raises `NotImplementedError` until you replace the raise "
    "with your code; the checker under it then tells you whether you are right (or which mistake you "
    "likely made). Everything else runs as it is."
)
#: the same note in the Chinese edition (notebooks/student/zh)
NOTE_ZH = (
    "> **学生版。** 每个练习在你把 raise 换成自己的代码之前都会抛出 `NotImplementedError`；"
    "练习下方的检查器随后会告诉你是否正确（或你可能犯了哪个错误）。其余部分可以照常运行。"
)
#: the Chinese edition's student copy
STUDENT_ZH_DIR = STUDENT_DIR / "zh"
LINE_LENGTH = 120  # the project's ruff line length: longer raise lines are wrapped as ruff would

_BEGIN = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION\b(?P<rest>.*)$")
_END = re.compile(r"^[ \t]*### END SOLUTION\b")
_DEF = re.compile(r"^(?P<indent>[ \t]*)(?:async\s+)?def\s+(?P<name>\w+)\s*\(")
_CLASS = re.compile(r"^(?P<indent>[ \t]*)class\s+(?P<name>\w+)\b")
_CHECK = re.compile(r"\bmc\.check\.(?P<name>\w+)\s*\(")
_LINK = re.compile(r"(\]\()(?P<target>[^)\s]+)(\))")


class SolutionMarkupError(ValueError):
    """A solution region the student edition cannot be built from (names notebook and cell)."""


@dataclasses.dataclass(frozen=True)
class Exercise:
    """One exercise of a solution notebook.

    ``number``: "N.M"; ``notebook``: the file stem; ``cell``: the cell's index in the solution
    notebook (0-based); ``function``: the function the region sits in (None at other places);
    ``checker``: the ``mc.check.<name>`` the cell calls after the region (None if none);
    ``solution``: the removed lines, markers excluded.
    """

    number: str
    notebook: str
    cell: int
    function: str | None
    checker: str | None
    solution: tuple[str, ...]

    @property
    def message(self) -> str:
        """The text of the student edition's ``NotImplementedError``."""
        return exercise_message(self.number)


def exercise_message(number: str) -> str:
    """The student edition's placeholder text for exercise ``number``: the task stays in the
    notebook; help comes from the hint ladder, one step at a time."""
    return f"Exercise {number}: your code here — mc.hint('{number}') gives a hint, one step at a time"


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _width(text: str) -> int:
    """Display width as ruff measures it (East Asian wide characters count 2)."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def raise_lines(indent: str, message: str) -> list[str]:
    """``raise NotImplementedError("<message>")`` at ``indent``, wrapped as ``ruff format`` would."""
    literal = json.dumps(message, ensure_ascii=False)  # a valid Python string literal too
    one = f"{indent}raise NotImplementedError({literal})"
    if _width(one) <= LINE_LENGTH:
        return [one]
    return [f"{indent}raise NotImplementedError(", f"{indent}    {literal}", f"{indent})"]


def _where(notebook: str, index: int, source: str) -> str:
    first = next((line.strip() for line in source.splitlines() if line.strip()), "")
    return f"{notebook}, cell {index} (0-based; it starts with {first[:60]!r})"


def strip_solutions(source: str, *, notebook: str, cell: int, first_number: int = 1) -> tuple[str, list[Exercise]]:
    """The cell ``source`` with each solution region replaced by a raise, and its exercises.

    ``notebook``: the file stem (its first two characters are the notebook's number); ``cell``:
    the cell's index (for messages); ``first_number``: M of the first region in this cell.
    Raises :class:`SolutionMarkupError` for malformed markup.
    """
    n = int(notebook[:2])
    lines = source.split("\n")
    out: list[str] = []
    exercises: list[Exercise] = []
    region: dict | None = None
    for lineno, line in enumerate(lines, 1):
        begin, end = _BEGIN.match(line), _END.match(line)
        if begin:
            where = _where(notebook, cell, source)
            if region is not None:
                raise SolutionMarkupError(f"{where}: line {lineno}: a second BEGIN SOLUTION before END SOLUTION")
            if begin.group("rest").strip():
                raise SolutionMarkupError(
                    f"{where}: line {lineno}: text after `### BEGIN SOLUTION` — the marker stands alone; "
                    "hints are ladders in mha_course/kit/hints/NN.json"
                )
            if not begin.group("indent"):
                raise SolutionMarkupError(
                    f"{where}: line {lineno}: a solution region at the top level of the cell — the "
                    "student edition's raise would stop the notebook; put the region inside a function"
                )
            function, owner = None, None
            for at, previous in enumerate(reversed(out)):
                d = _DEF.match(previous)
                if d and len(d.group("indent")) < len(begin.group("indent")):
                    function = d.group("name")
                    for earlier in reversed(out[: len(out) - at - 1]):  # a method: its class names it
                        c = _CLASS.match(earlier)
                        if c and len(c.group("indent")) < len(d.group("indent")):
                            function = owner = c.group("name")
                            break
                    break
            region = {"indent": begin.group("indent"), "function": function, "owner": owner, "body": []}
        elif end:
            if region is None:
                raise SolutionMarkupError(
                    f"{_where(notebook, cell, source)}: line {lineno}: END SOLUTION without a BEGIN SOLUTION"
                )
            last = exercises[-1] if exercises else None
            if region["owner"] and last is not None and last.function == region["owner"]:
                # another method of the same class: one exercise, the class, written in parts
                out += raise_lines(region["indent"], exercise_message(last.number))
                exercises[-1] = dataclasses.replace(last, solution=last.solution + tuple(region["body"]))
            else:
                number = f"{n}.{first_number + len(exercises)}"
                out += raise_lines(region["indent"], exercise_message(number))
                exercises.append(Exercise(number, notebook, cell, region["function"], None, tuple(region["body"])))
            region = None
        elif region is not None:
            region["body"].append(line)
        else:
            out.append(line)
    if region is not None:
        raise SolutionMarkupError(f"{_where(notebook, cell, source)}: BEGIN SOLUTION without an END SOLUTION")
    new = "\n".join(out)
    if exercises:  # the checker the cell calls after the region(s)
        check = _CHECK.search(new)
        checker = check.group("name") if check else None
        exercises = [dataclasses.replace(e, checker=checker) for e in exercises]
    return new, exercises


def _rewrite_links(text: str, src_dir: Path, out_rel: str) -> str:
    """Relative links/images that point at existing files outside the notebooks folder, rewritten
    so they still work from ``out_rel`` (repo-relative folder); code spans are left alone."""
    depth = len(Path(out_rel).parts)

    def fix(m: re.Match) -> str:
        target = m.group("target")
        path, _, anchor = target.partition("#")
        if not path or re.match(r"^[a-zA-Z][\w+.-]*:", path) or path.startswith("/"):
            return m.group(0)
        resolved = (src_dir / path).resolve()
        if not resolved.exists():
            return m.group(0)
        if resolved.parent == src_dir.resolve() and re.match(r"^\d\d_.*\.ipynb$", resolved.name):
            return m.group(0)  # a sibling notebook: its student copy sits next to this one
        rel = os.path.relpath(resolved, notebook_tools.ROOT)
        new = Path(*([".."] * depth)) / rel
        return f"{m.group(1)}{new.as_posix()}{'#' + anchor if anchor else ''}{m.group(3)}"

    parts = re.split(r"(`+[^`]*`+)", text)  # keep inline code untouched
    return "".join(p if p.startswith("`") else _LINK.sub(fix, p) for p in parts)


def _lock(cell):
    """A cell nbgrader marks read-only gets the flags JupyterLab honours, as nbgrader's release has."""
    if cell.metadata.get("nbgrader", {}).get("locked"):
        cell.metadata["editable"] = False
        cell.metadata["deletable"] = False
    return cell


def student_notebook(nb, *, notebook: str, out_rel: str = "notebooks/student", src_dir: Path | None = None):
    """(student copy of ``nb``, its exercises). ``nb``: an nbformat v4 notebook (not modified);
    ``notebook``: its file stem; ``out_rel``: the repo-relative folder the copy will live in.

    The copy carries nbgrader's cell metadata, the same as ``python -m authoring nbgrader``'s source
    notebook: each exercise is a solution cell (the learner's function) followed by a read-only
    autograded cell (its checker), and the setup cell is read-only; so a notebook learners saved
    from this edition (from a hub link, say) is autograded by ``nbgrader autograde``."""
    import nbformat

    from . import grading

    src_dir = notebook_tools.NOTEBOOKS if src_dir is None else src_dir
    student = copy.deepcopy(nb)
    cells, exercises = [], []
    for index, cell in enumerate(nb.cells):
        tags = cell.get("metadata", {}).get("tags", [])
        if SOLUTION_TAG in tags:
            continue
        new = copy.deepcopy(cell)
        source = _source(cell)
        if cell.cell_type == "code":
            stripped, found = strip_solutions(source, notebook=notebook, cell=index, first_number=len(exercises) + 1)
            exercises += found
            if stripped != source or _CHECK.search(source):
                new.source, new.outputs, new.execution_count = stripped, [], None
                new.metadata.pop("execution", None)
            if "setup" in tags:
                new.metadata["nbgrader"] = grading.nbgrader_meta("setup", locked=True)
            if found and grading.CHECK_LINE.search(stripped):
                # nbgrader's layout: the learner's function, then the read-only check cell
                split = grading.split_exercise_cell(new, stripped, found, {}, notebook, graded=False)
                cells += [_lock(c) for c in split]
                continue
            _lock(new)
        elif cell.cell_type == "markdown":
            rewritten = _rewrite_links(source, src_dir, out_rel)
            if rewritten != source:
                new.source = rewritten
        cells.append(new)
    student.cells = cells
    first_md = next((c for c in student.cells if c.cell_type == "markdown"), None)
    if first_md is None:
        raise SolutionMarkupError(f"{notebook}: needs a markdown title cell first")
    badge = notebook_tools.badge_for(f"{out_rel}/{notebook}.ipynb")
    src = _source(first_md)
    src = (
        notebook_tools.BADGE_RE.sub(badge, src) if notebook_tools.BADGE_RE.search(src) else f"{src.rstrip()}\n\n{badge}"
    )
    note = NOTE_ZH if Path(out_rel).name == "zh" else NOTE
    if note not in src:
        src = notebook_tools.BADGE_RE.sub(lambda m: f"{m.group(0)}\n\n{note}", src, count=1)
    first_md.source = src
    nbformat.validate(student)
    return student, exercises


def _out_rel(out_dir: Path) -> str:
    """The repo-relative folder the badges name: OUT_DIR if inside the repository, else the
    committed location (so a build into a temporary folder equals the committed copy)."""
    try:
        return Path(out_dir).resolve().relative_to(notebook_tools.ROOT).as_posix()
    except ValueError:
        return STUDENT_DIR.relative_to(notebook_tools.ROOT).as_posix()


def _render(nb) -> str:
    import nbformat

    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"  # exactly what nbformat.write puts on disk


def editions(sources: Iterable[Path] | None = None, out_rel: str = "notebooks/student") -> dict[str, tuple]:
    """name -> (student notebook text, exercises) for each solution notebook (default: all)."""
    import nbformat

    result = {}
    for path in sources or notebook_tools.numbered_notebooks():
        path = Path(path)
        nb = nbformat.read(path, as_version=4)
        student, exercises = student_notebook(nb, notebook=path.stem, out_rel=out_rel, src_dir=path.parent)
        result[path.name] = (_render(student), exercises)
    return result


def exercises(sources: Iterable[Path] | None = None) -> list[Exercise]:
    """Every exercise of the solution notebooks (default: all numbered notebooks), in order."""
    return [e for _, found in editions(sources).values() for e in found]


def build(out_dir: Path, sources: Iterable[Path] | None = None) -> list[Exercise]:
    """Write the student edition of ``sources`` (default: every numbered notebook) into
    ``out_dir``; with the default, numbered notebooks in ``out_dir`` without a source are removed.
    Returns the exercises."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    built = editions(sources, _out_rel(out_dir))
    for name, (text, _) in built.items():
        target = out_dir / name
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
    if sources is None:
        for stale in out_dir.glob("[0-9][0-9]_*.ipynb"):
            if stale.name not in built:
                stale.unlink()
    return [e for _, found in built.values() for e in found]


def zh_sources() -> list[Path]:
    """The Chinese notebooks (notebooks/zh/), the sources of notebooks/student/zh/."""
    return sorted((notebook_tools.NOTEBOOKS / "zh").glob("[0-9][0-9]_*.ipynb"))


def stale(out_dir: Path, sources: Iterable[Path] | None = None) -> list[str]:
    """What differs between ``out_dir`` and a fresh build of every numbered notebook (or of ``sources``)."""
    out_dir = Path(out_dir)
    built = editions(sources, _out_rel(out_dir))
    problems = []
    for name, (text, _) in built.items():
        target = out_dir / name
        if not target.exists():
            problems.append(f"{target}: missing")
        elif target.read_text(encoding="utf-8") != text:
            problems.append(f"{target}: stale")
    problems += [f"{p}: has no solution notebook" for p in out_dir.glob("[0-9][0-9]_*.ipynb") if p.name not in built]
    return problems


# ---------------------------------------------------------------------------------------------
# the instructor guide's generated exercise reference


def checker_diagnoses(name: str) -> list[str]:
    """The mistakes ``mc.check.<name>`` can name: the diagnoses of its module's
    ``<NAME>_MISTAKES`` list, in order; [] for a hand-written checker without one."""
    import importlib

    from mha_course import check

    module = importlib.import_module(check.CHECKERS[name].__module__)
    mistakes = getattr(module, f"{name.upper()}_MISTAKES", [])
    return list(dict.fromkeys(m.diagnosis for m in mistakes))


def guide_reference_markdown(found: list[Exercise] | None = None) -> str:
    """The generated part of docs/instructor_guide.md: per exercise its hint ladder, the checker
    and the checker's diagnosis list."""
    from mha_course.kit import hint_ladder as hints

    found = exercises() if found is None else found
    lines = []
    for e in found:
        where = f"`{e.function}`" if e.function else "(no function)"
        lines += [f"#### Exercise {e.number} — {where} ({e.notebook})", ""]
        try:
            ladder = hints.ladder(e.number)
        except ValueError:
            ladder = []
        if ladder:
            lines.append(f'- **Hint ladder** (`mc.hint("{e.number}")`, one rung per call):')
            lines += [f"  {i}. {rung}" for i, rung in enumerate(ladder, 1)]
        else:
            lines.append(f"- **Hint ladder:** none yet (mha_course/kit/hints/{e.notebook[:2]}.json)")
        diagnoses = checker_diagnoses(e.checker) if e.checker else []
        if diagnoses:
            lines.append(f"- **Checker:** `mc.check.{e.checker}` — the mistakes it names:")
            lines += [f"  - {d}" for d in diagnoses]
        elif e.checker:
            lines.append(f"- **Checker:** `mc.check.{e.checker}` — hand-written (no list of mistakes): see the notes")
        else:
            lines.append("- **Checker:** none in the exercise cell")
        lines.append("")
    return "\n".join(lines).rstrip()


def guide_text(found: list[Exercise] | None = None) -> str:
    """docs/instructor_guide.md with its generated blocks brought up to date: the exercise
    reference, the nbgrader points per exercise and the hub links per notebook."""
    from . import classroom, grading

    found = exercises() if found is None else found
    text = GUIDE.read_text(encoding="utf-8")
    text = notebook_tools.replace_block(text, "exercise-reference", guide_reference_markdown(found))
    text = notebook_tools.replace_block(text, "nbgrader-points", grading.points_table(found))
    return notebook_tools.replace_block(text, "hub-links", classroom.hub_links_markdown())


# ---------------------------------------------------------------------------------------------
# command line


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m authoring student-edition", description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="folder for the student notebooks (committed: notebooks/student)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if OUT_DIR is stale")
    args = parser.parse_args(argv)
    try:
        committed = args.out_dir.resolve() == STUDENT_DIR.resolve()
        if args.check:
            problems = stale(args.out_dir)
            if committed:
                problems += stale(STUDENT_ZH_DIR, zh_sources())
            for p in problems:
                print(p)
            if problems:
                print(f"the student edition is stale: run `python -m authoring student-edition {args.out_dir}`")
            return 1 if problems else 0
        found = build(args.out_dir)
        if committed and zh_sources():  # the Chinese edition's student copy, from notebooks/zh
            build(STUDENT_ZH_DIR, zh_sources())
            print(f"{STUDENT_ZH_DIR.relative_to(notebook_tools.ROOT)}: {len(zh_sources())} notebooks")
    except SolutionMarkupError as err:
        print(f"error: {err}")
        return 1
    by_notebook: dict[str, list[Exercise]] = {}
    for e in found:
        by_notebook.setdefault(e.notebook, []).append(e)
    for path in notebook_tools.numbered_notebooks():
        mine = by_notebook.get(path.stem, [])
        print(f"{args.out_dir / path.name}: {len(mine)} exercise{'s' * (len(mine) != 1)}")
        for e in mine:
            print(f"    {e.message}")
    if GUIDE.exists() and args.out_dir.resolve() == STUDENT_DIR.resolve():  # the committed copy
        new = guide_text(found)
        changed = new != GUIDE.read_text(encoding="utf-8")
        if changed:
            GUIDE.write_text(new, encoding="utf-8")
        print(f"{GUIDE.relative_to(notebook_tools.ROOT)}: {'updated' if changed else 'up to date'}")
    return 0
