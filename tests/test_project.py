"""The project's promises about itself: install files in sync, README commands, Colab badges and
setup cells, the committed state of the notebooks, and a documented public API."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import mha_course as mc
from authoring import notebooks as notebook_tools
from mha_course.kit import course_map

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = notebook_tools.numbered_notebooks()


def _requirement_lines(text: str) -> list[str]:
    return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]


def _name(spec: str) -> str:
    return re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0].lower().replace("_", "-")


def test_requirements_and_environment_yml_agree():
    reqs = _requirement_lines((ROOT / "requirements.txt").read_text())
    env = (ROOT / "environment.yml").read_text()
    pip_section = env.split("- pip:", 1)[1]
    env_reqs = [m.group(1).strip() for m in re.finditer(r"^\s+- (\S.*)$", pip_section, re.M)]
    assert sorted(reqs) == sorted(env_reqs), "requirements.txt and environment.yml list different packages"


def test_requirements_are_ranges_without_local_paths():
    for spec in _requirement_lines((ROOT / "requirements.txt").read_text()):
        assert "==" not in spec, f"{spec}: pin to this machine; use a range"
        assert not spec.startswith(("-e", ".", "/", "file:")), f"{spec}: no local paths"
        assert re.search(r">=", spec), f"{spec}: give a lower bound"


def test_runtime_dependencies_are_in_requirements():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
        import tomli as tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = {_name(s): s for s in _requirement_lines((ROOT / "requirements.txt").read_text())}
    for dep in project["dependencies"]:
        assert reqs.get(_name(dep)) == dep, f"{dep} differs from requirements.txt ({reqs.get(_name(dep))})"
    assert project["requires-python"] == ">=3.10"
    assert "torch>=2.6" in project["dependencies"] and "ipywidgets>=7.7" in project["dependencies"]


def test_readme_gives_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    assert "python3 course.py lab" in readme and "python3 course.py test" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands[-1] == "python3 course.py test", "the last thing CI does is the README's test command"
    assert "torch==2.13.0" in ci


def test_readme_generated_blocks_are_current():
    assert (ROOT / "README.md").read_text(encoding="utf-8") == notebook_tools.readme_text(), (
        "README.md is stale: run `python -m authoring sync`"
    )


def test_course_map_lists_every_notebook():
    stems = {stem for stem, _, _ in course_map.NOTEBOOKS}
    for path in NOTEBOOKS:
        assert path.stem in stems, f"{path.name} is missing from mha_course/kit/course_map.py NOTEBOOKS"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_badge_points_at_its_own_notebook(path):
    owner, repo = notebook_tools.repository()
    nb = json.loads(path.read_text(encoding="utf-8"))
    first_md = "".join(next(c for c in nb["cells"] if c["cell_type"] == "markdown")["source"])
    url = f"https://colab.research.google.com/github/{owner}/{repo}/blob/main/notebooks/{path.name}"
    assert f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})" in first_md


def _setup_cell(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert "setup" in code[0]["metadata"].get("tags", []), "the first code cell is the setup cell"
    return "".join(code[0]["source"])


def _run_setup(source: str, *, on_colab: bool, monkeypatch) -> list[list[str]]:
    calls: list[list[str]] = []
    monkeypatch.setattr(subprocess, "check_call", lambda cmd, *a, **k: calls.append(list(cmd)) or 0)
    if on_colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(compile(source, "<setup cell>", "exec"), {})
    return calls


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_setup_cell_installs_the_package_only_on_colab(path, monkeypatch):
    source = _setup_cell(path)
    assert source == notebook_tools.setup_source(), "setup cell is stale: run `python -m authoring sync`"
    assert _run_setup(source, on_colab=False, monkeypatch=monkeypatch) == []
    calls = _run_setup(source, on_colab=True, monkeypatch=monkeypatch)
    owner, repo = notebook_tools.repository()
    assert len(calls) == 1 and calls[0][:4] == [sys.executable, "-m", "pip", "install"]
    assert calls[0][-1] == f"mha-course @ git+https://github.com/{owner}/{repo}"
    assert not {"-U", "--upgrade", "torch", "ipywidgets"} & set(calls[0]), "never upgrade Colab's torch/ipywidgets"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_committed_state(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    counts = [c["execution_count"] for c in code]
    assert counts == list(range(1, len(code) + 1)), "not executed top to bottom in one fresh run"
    for i, cell in enumerate(code):
        for out in cell.get("outputs", []):
            assert out["output_type"] != "error", f"cell {i} stores an error"
            if out.get("name") == "stderr":
                assert "Warning" not in "".join(out["text"]), f"cell {i} stores a warning"
    for key, value in nb["metadata"].get("widgets", {}).items():
        assert "state" in value, f"metadata.widgets[{key}] lacks 'state' (GitHub's viewer fails on it)"
    assert path.stat().st_size < 3_000_000


def test_public_api_is_documented():
    for name in mc.__all__:
        obj = getattr(mc, name)
        if name in ("MODEL_CONFIGS",):
            continue
        assert (obj.__doc__ or "").strip(), f"mc.{name} has no docstring"
    for name in ("scaled_dot_product_attention", "split_heads", "MultiHeadAttention", "causal_mask", "repeat_kv"):
        assert name in mc.__doc__, f"help(mc) does not mention {name}"


def _course_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("course_script", ROOT / "course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_course_lab_passes_sigterm_to_jupyter_and_exits_with_it(tmp_path):
    """`course.py lab` runs JupyterLab as a child: a signal sent to course.py must reach it."""
    import signal
    import time

    child = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    wrapper = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('course_script', {str(ROOT / 'course.py')!r})\n"
        "course = importlib.util.module_from_spec(spec); spec.loader.exec_module(course)\n"
        f"sys.exit(course.run_forwarding_signals([sys.executable, '-c', {child!r}], {{}}))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", wrapper], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 7, "course.py must exit with the child's exit code"
    assert time.monotonic() - start < 20


def test_fast_suite_leaves_out_notebooks_browser_and_pip():
    course = _course_module()
    assert course.FAST[0] == "tests" and "not slow and not browser" in course.FAST
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "python3 course.py test --fast" in readme and "--cpu-torch" in readme and "--no-browser" in readme
