"""course.py's `class` commands and both command lines' help: every command is listed, the class
tools run in .venv/ with its programs on PATH, an extra is installed on first use only, and the
README and the instructor guide give exactly these commands."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from authoring import __main__ as authoring_main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def course():
    spec = importlib.util.spec_from_file_location("course_script", ROOT / "course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_course_help_lists_every_command_and_every_class_command(course, capsys):
    assert course.main(["--help"]) == 0
    text = capsys.readouterr().out
    for command in course.COMMANDS:
        assert f"python3 course.py {command}" in text, command
    for command in course.CLASS_COMMANDS:
        assert f"class {command} " in text, command
    assert "--fast" in text and "--slowest" in text and "--cpu-torch" in text
    assert course.main(["class", "--help"]) == 0
    listed = capsys.readouterr().out
    assert all(re.search(rf"^  {re.escape(c)} ", listed, re.M) for c in course.CLASS_COMMANDS), listed
    assert course.main(["class", "grade-everything"]) == 2, "an unknown class command prints the list"
    assert "autograde" in capsys.readouterr().out


def test_authoring_help_lists_every_command_and_each_runs_its_own_help():
    out = subprocess.run([sys.executable, "-m", "authoring", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    listed = re.findall(r"^  (\S+) ", out.stdout, re.M)
    assert listed == list(authoring_main.COMMANDS)
    for name in ("nbgrader", "autograde", "feedback", "progress", "hub-links", "emulate", "suite-times"):
        assert name in listed
    for name in ("nbgrader", "autograde", "feedback", "progress", "hub-links", "student-edition", "suite-times"):
        run = subprocess.run(
            [sys.executable, "-m", "authoring", name, "--help"], cwd=ROOT, capture_output=True, text=True
        )
        assert run.returncode == 0 and "usage:" in run.stdout, f"{name}: {run.stdout}{run.stderr}"
    unknown = subprocess.run([sys.executable, "-m", "authoring", "grade"], cwd=ROOT, capture_output=True, text=True)
    assert unknown.returncode == 2 and "no command 'grade'" in unknown.stdout and "hub-links" in unknown.stdout


def test_class_commands_run_in_the_venv_with_its_programs_first_on_path(course, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    cmd, env = course.class_command(["autograde", "mha-class", "01_single_head_attention"])
    assert cmd == [str(course.PY), "-m", "authoring", "autograde", "mha-class", "01_single_head_attention"]
    assert env["PATH"].split(":")[0] == str(course.BIN) and env["PATH"].endswith("/usr/bin:/bin")
    assert env["PYTHONPATH"] == str(course.ROOT) and env["VIRTUAL_ENV"] == str(course.VENV)


def test_an_extra_is_installed_on_first_use_and_only_then(course, monkeypatch, tmp_path):
    monkeypatch.setattr(course, "VENV", tmp_path)
    installed: list[list[str]] = []
    missing = {"nbgrader"}
    monkeypatch.setattr(course, "missing_distributions", lambda names: [n for n in names if n in missing])
    monkeypatch.setattr(course, "check_requirements_index", lambda: None)

    def pip_install(args, what):
        installed.append(args)
        missing.clear()

    monkeypatch.setattr(course, "pip_install", pip_install)
    assert course.extra_requirements("nbgrader") == ["nbgrader"]
    assert "sphinx" in course.extra_requirements("site") and "fonttools" in course.extra_requirements("site")
    course.ensure_extra("nbgrader")
    assert installed == [["-e", f"{course.ROOT}[nbgrader]"]]
    course.ensure_extra("nbgrader")  # the stamp says it is there
    (tmp_path / ".mha-course-nbgrader-installed").unlink()
    course.ensure_extra("nbgrader")  # no stamp, but installed: nothing to do
    assert len(installed) == 1
    course.ensure_extra("site")  # everything the extra names is installed already (missing = {})
    assert len(installed) == 1 and (tmp_path / ".mha-course-site-installed").exists()


@pytest.mark.parametrize("doc", ["README.md", "docs/instructor_guide.md"])
def test_the_docs_give_the_class_commands_that_need_no_activated_environment(course, doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    generated = re.sub(r"<!-- (\S+):start -->.*?<!-- \1:end -->", "", text, flags=re.S)
    for command in ("hub-links", "nbgrader", "autograde", "feedback", "progress"):
        assert f"python3 course.py class {command} " in generated, f"{doc}: no `python3 course.py class {command}`"
    stale = re.findall(r"python -m authoring (?:nbgrader|progress|hub-links|autograde|feedback)\b", generated)
    assert not stale, f"{doc} still gives commands that need the environment activated: {stale}"
    assert not re.search(r"^nbgrader (?:generate_assignment|autograde|generate_feedback)", generated, re.M), doc
    assert "pip install -e '.[nbgrader]'" not in generated, f"{doc}: pip as written installs into the system Python"


def test_the_full_test_command_installs_both_extras_and_the_fast_one_neither(course, monkeypatch):
    extras: list[str] = []
    monkeypatch.setattr(course, "ensure_environment", lambda **_: None)
    monkeypatch.setattr(course, "ensure_extra", extras.append)
    ran: list[list[str]] = []
    monkeypatch.setattr(course, "run_forwarding_signals", lambda cmd, env: ran.append(cmd) or 0)
    assert course.main(["test", "-k", "masks"]) == 0
    assert extras == ["site", "nbgrader"] and ran[-1][-3:] == ["pytest", "-k", "masks"]
    extras.clear()
    assert course.main(["test", "--fast"]) == 0
    assert extras == [] and ran[-1][-len(course.FAST) :] == course.FAST
    assert course.main(["test", "--slowest", "tests/test_masks.py"]) == 0
    assert ran[-1][-3:] == ["authoring", "suite-times", "tests/test_masks.py"]


def test_suite_times_reports_the_slowest_tests_of_a_run(tmp_path):
    """The script on a tiny suite of its own: two tests that sleep 0.3 s and 0.1 s, one quick."""
    (tmp_path / "test_tiny.py").write_text(
        "import time\n\n"
        "def test_slow():\n    time.sleep(0.3)\n\n"
        "def test_medium():\n    time.sleep(0.1)\n\n"
        "def test_quick():\n    pass\n",
        encoding="utf-8",
    )
    out = subprocess.run(
        [sys.executable, "-m", "authoring", "suite-times", "--top", "2", str(tmp_path / "test_tiny.py"), "-n", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = out.stdout.split("\n3 tests in ", 1)[1].splitlines()
    assert report[1] == "the 2 slowest:"
    names = [line.split("  ")[-1] for line in report[2:4]]
    assert [n.split("::")[-1] for n in names] == ["test_slow", "test_medium"], report
    assert float(report[2].split()[0]) >= 0.3 and float(report[3].split()[0]) >= 0.1


def test_the_progress_view_flags_where_checker_and_points_disagree():
    from authoring import classroom

    progress = classroom.Progress(
        exercises=["1.1", "1.2"],
        status={"ada": {"1.1": "passed", "1.2": "passed"}, "ben": {"1.1": "attempted", "1.2": "passed"}},
        mistakes={"1.1": ["forgot to scale"]},
        problems=[],
        scores={"ada": (1.0, 2.0), "ben": (2.0, 2.0)},
        grades={"ada": {"1.1": (1.0, 1.0), "1.2": (0.0, 1.0)}, "ben": {"1.1": (1.0, 1.0), "1.2": (1.0, 1.0)}},
        ungraded={"ada": {"1.2"}},
    )
    assert progress.disagreements() == [
        ("ada", "1.2", "the checker says passed, nbgrader gave 0/1 (its notebook lacks nbgrader's cell metadata)"),
        ("ben", "1.1", "the checker says failed, nbgrader gave 1/1"),
    ]
    text = classroom.table_text(progress)
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line[:3] in ("ada", "ben")}
    assert rows == {"ada": ["✅", "1/1", "✅", "0/1≠", "1/2"], "ben": ["❌", "1/1≠", "✅", "1/1", "2/2"]}
    assert "disagree · ben, exercise 1.1: the checker says failed, nbgrader gave 1/1" in text
