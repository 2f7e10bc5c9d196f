"""authoring/classroom.py: hub links for a JupyterHub, and a class's progress read from its notebooks."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from authoring import classroom, student_edition
from authoring import notebooks as notebook_tools

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "instructor_guide.md"
SOLVED = ROOT / "notebooks" / "01_single_head_attention.ipynb"
STUDENT = ROOT / "notebooks" / "student" / "01_single_head_attention.ipynb"


# ---------------------------------------------------------------------------------------------
# hub links


def test_nbgitpuller_links_name_the_repository_of_pyproject_and_open_each_notebook():
    owner, repo = notebook_tools.repository()
    rows = classroom.hub_links("https://hub.uni.example/", edition="student")
    assert [stem for stem, _, _ in rows] == [p.stem for p in notebook_tools.numbered_notebooks()]
    for stem, hub, colab in rows:
        parts = urlsplit(hub)
        assert (parts.scheme, parts.netloc, parts.path) == ("https", "hub.uni.example", "/hub/user-redirect/git-pull")
        query = parse_qs(parts.query)
        assert query["repo"] == [f"https://github.com/{owner}/{repo}"] and query["branch"] == ["main"]
        urlpath = query["urlpath"][0]
        assert urlpath == f"lab/tree/{repo}/notebooks/student/{stem}.ipynb"
        assert (ROOT / urlpath.removeprefix(f"lab/tree/{repo}/")).is_file(), urlpath
        assert (
            colab == f"https://colab.research.google.com/github/{owner}/{repo}/blob/main/notebooks/student/{stem}.ipynb"
        )
    solved = classroom.hub_links("https://hub.uni.example", edition="solved")
    assert all("%2Fnotebooks%2F0" in link or "%2Fnotebooks%2F1" in link for _, link, _ in solved)


@pytest.mark.parametrize("hub", ["hub.uni.example", "ftp://hub.uni.example", "https://hub.example/?x=1", ""])
def test_a_hub_address_that_is_not_one_gets_a_clear_message(hub):
    with pytest.raises(ValueError, match="--hub must be the JupyterHub's address"):
        classroom.nbgitpuller_link(hub, "notebooks/00_setup_check.ipynb")
    out = subprocess.run(
        [sys.executable, "-m", "authoring", "hub-links", "--hub", hub], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 2 and "--hub must be" in out.stdout and "Traceback" not in out.stdout + out.stderr


def test_instructor_guide_lists_the_hub_and_colab_links_of_every_notebook():
    guide = GUIDE.read_text(encoding="utf-8")
    block = guide.split("<!-- hub-links:start -->\n")[1].split("\n<!-- hub-links:end -->")[0]
    assert block == classroom.hub_links_markdown(), (
        "docs/instructor_guide.md's hub links are stale: run `python -m authoring student-edition notebooks/student`"
    )
    assert "python3 course.py class hub-links --hub" in guide


# ---------------------------------------------------------------------------------------------
# the progress view


def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _planted(nb: dict, checker: str, diagnosis: str) -> dict:
    """A copy of a solved notebook whose exercise cell for ``checker`` shows a failed check."""
    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and f"mc.check.{checker}(" in source and "BEGIN SOLUTION" in source:
            text = f"❌ failed · {checker}: likely mistake — {diagnosis}\n   case 1 of 6: ..."
            cell["outputs"] = [
                {"output_type": "execute_result", "data": {"text/plain": text}, "metadata": {}, "execution_count": 1}
            ]
    return nb


def _class(tmp_path: Path) -> Path:
    """A class folder: four learners, one sub-folder each, plus the trouble a real folder holds."""
    solved = _read(SOLVED)
    folder = tmp_path / "class"
    for learner, nb in {
        "ada": solved,
        "ben": _planted(solved, "scaled_dot_product_attention", "forgot to scale by √d_k"),
        "cy": _planted(solved, "scaled_dot_product_attention", "forgot to scale by √d_k"),
        "dee": _read(STUDENT),
    }.items():
        (folder / learner).mkdir(parents=True)
        (folder / learner / SOLVED.name).write_text(json.dumps(nb), encoding="utf-8")
    (folder / "eve").mkdir()
    (folder / "eve" / SOLVED.name).write_text('{"cells": [', encoding="utf-8")  # a corrupt file
    (folder / "fay").mkdir()
    other = {"cells": [{"cell_type": "code", "source": "import pandas", "outputs": []}], "nbformat": 4}
    (folder / "fay" / "homework.ipynb").write_text(json.dumps(other), encoding="utf-8")
    return folder


def test_progress_reads_each_learners_checker_results_and_names_the_common_mistake(tmp_path):
    progress = classroom.collect(_class(tmp_path))
    ex = [e.number for e in student_edition.exercises([SOLVED])]
    assert progress.exercises == ex and len(ex) >= 2
    first = ex[0]
    assert {name: progress.status[name][first] for name in progress.status} == {
        "ada": "passed",
        "ben": "attempted",
        "cy": "attempted",
        "dee": "not attempted",
    }
    assert all(progress.status["ada"][n] == "passed" for n in ex)
    assert all(progress.status["dee"][n] == "not attempted" for n in ex)
    assert progress.most_common_mistake(first) == ("forgot to scale by √d_k", 2)
    assert progress.most_common_mistake(ex[1]) is None
    problems = "\n".join(progress.problems)
    assert "eve" in problems and "not a readable notebook" in problems
    assert "fay" in problems and "not a notebook of this course" in problems
    text = classroom.table_text(progress)
    assert f"exercise {first}: 1/4 passed, 2 stuck, 1 not attempted" in text
    assert "most common mistake (2×): forgot to scale by √d_k" in text


def test_a_saved_but_unrun_notebook_counts_as_attempted_once_its_raise_is_gone(tmp_path):
    nb = _read(SOLVED)
    for cell in nb["cells"]:
        cell["outputs"] = [] if cell["cell_type"] == "code" else cell.get("outputs")
        if cell["cell_type"] == "markdown":
            cell.pop("outputs", None)
    folder = tmp_path / "c"
    (folder / "gus").mkdir(parents=True)
    (folder / "gus" / SOLVED.name).write_text(json.dumps(nb), encoding="utf-8")
    (folder / "hal").mkdir()
    (folder / "hal" / SOLVED.name).write_text(STUDENT.read_text(encoding="utf-8"), encoding="utf-8")
    progress = classroom.collect(folder)
    assert set(progress.status["gus"].values()) == {"attempted"}
    assert set(progress.status["hal"].values()) == {"not attempted"}


def test_flat_folders_name_learners_by_file_and_the_heatmap_is_labelled(tmp_path):
    folder = tmp_path / "flat"
    folder.mkdir()
    (folder / f"ada-{SOLVED.name}").write_text(SOLVED.read_text(encoding="utf-8"), encoding="utf-8")
    (folder / f"ben-{SOLVED.name}").write_text(
        json.dumps(_planted(_read(SOLVED), "scaled_dot_product_attention", "softmax over the wrong axis")),
        encoding="utf-8",
    )
    progress = classroom.collect(folder)
    assert sorted(progress.status) == ["ada", "ben"]
    fig = classroom.heatmap(progress)
    ax = fig.axes[0]
    assert "Class progress" in ax.get_title() and "most stuck" in ax.get_title()
    assert ax.get_xlabel() == "exercise" and ax.get_ylabel() == "learner"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["ada", "ben"]


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p / "missing", "is not a folder"),
        (lambda p: p, "holds no notebooks"),
    ],
)
def test_progress_on_a_folder_without_notebooks_says_so_without_a_traceback(tmp_path, make, words):
    out = subprocess.run(
        [sys.executable, "-m", "authoring", "progress", str(make(tmp_path))], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 2 and words in out.stdout and "Traceback" not in out.stdout + out.stderr


def test_progress_command_prints_the_table_skips_bad_files_and_writes_the_figure(tmp_path):
    folder = _class(tmp_path)
    figure = tmp_path / "progress.png"
    out = subprocess.run(
        [sys.executable, "-m", "authoring", "progress", str(folder), "--figure", str(figure)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    assert "skipped eve" in out.stdout and "skipped fay" in out.stdout and "ada" in out.stdout
    assert figure.stat().st_size > 5_000
