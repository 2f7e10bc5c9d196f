"""The project's promises about itself: install files in sync, README commands, Colab badges and
setup cells, the committed state of the notebooks, and a documented public API."""

from __future__ import annotations

import json
import os
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
#: the English notebooks and their Chinese twins (notebooks/zh/)
BOTH_EDITIONS = NOTEBOOKS + sorted((ROOT / "notebooks" / "zh").glob("[0-9][0-9]_*.ipynb"))


def _id(path: Path) -> str:
    return f"zh_{path.stem}" if path.parent.name == "zh" else path.stem


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
    assert (ROOT / "README.zh-CN.md").read_text(encoding="utf-8") == notebook_tools.readme_zh_text(), (
        "README.zh-CN.md is stale: run `python -m authoring sync`"
    )
    assert mc.language() == "en", "making the Chinese map leaves the course in English"


def test_course_map_lists_every_notebook():
    stems = {stem for stem, _, _ in course_map.NOTEBOOKS}
    for path in NOTEBOOKS:
        assert path.stem in stems, f"{path.name} is missing from mha_course/kit/course_map.py NOTEBOOKS"


@pytest.mark.parametrize("path", BOTH_EDITIONS, ids=_id)
def test_badge_points_at_its_own_notebook(path):
    owner, repo = notebook_tools.repository()
    nb = json.loads(path.read_text(encoding="utf-8"))
    first_md = "".join(next(c for c in nb["cells"] if c["cell_type"] == "markdown")["source"])
    rel = path.relative_to(ROOT).as_posix()
    url = f"https://colab.research.google.com/github/{owner}/{repo}/blob/main/{rel}"
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


@pytest.mark.parametrize("path", BOTH_EDITIONS, ids=_id)
def test_setup_cell_installs_the_package_only_on_colab(path, monkeypatch):
    source = _setup_cell(path)
    expected = notebook_tools.setup_source(notebook_tools.language_of(path))
    assert source == expected, "setup cell is stale: run `python -m authoring sync`"
    assert _run_setup(source, on_colab=False, monkeypatch=monkeypatch) == []
    calls = _run_setup(source, on_colab=True, monkeypatch=monkeypatch)
    owner, repo = notebook_tools.repository()
    assert len(calls) == 1 and calls[0][:4] == [sys.executable, "-m", "pip", "install"]
    assert calls[0][-1] == f"mha-course @ git+https://github.com/{owner}/{repo}"
    assert not {"-U", "--upgrade", "torch", "ipywidgets"} & set(calls[0]), "never upgrade Colab's torch/ipywidgets"


@pytest.mark.parametrize("path", BOTH_EDITIONS, ids=_id)
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


# --- course.py's set-up: an index that does not answer, a pip that fails, the URL `lab` opens ---


@pytest.fixture
def course_copy(tmp_path):
    """course.py with its install files in a folder of its own, and a .venv/ there that has pip but
    no torch (pip linked from this interpreter), so that course.py goes as far as installing."""
    import importlib.metadata
    import venv

    # pip's folder from its metadata, not by importing it: on Python 3.10 setuptools' distutils shim
    # answers `import pip` by dropping the distutils an earlier test imported, with a UserWarning
    pip = Path(importlib.metadata.distribution("pip").locate_file("pip"))
    for name in ("requirements.txt", "pyproject.toml"):
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    venv.EnvBuilder(with_pip=False, symlinks=True).create(tmp_path / ".venv")
    (site_packages,) = (tmp_path / ".venv").glob("lib/python*/site-packages")
    (site_packages / "pip").symlink_to(pip, target_is_directory=True)

    def run(args: list[str], *, env: dict | None = None, **replace: str) -> subprocess.CompletedProcess:
        source = (ROOT / "course.py").read_text(encoding="utf-8")
        for old, new in replace.items():
            assert source.count(old) == 1, f"{old!r} is not in course.py"
            source = source.replace(old, new)
        (tmp_path / "course.py").write_text(source, encoding="utf-8")
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "HTTP", "http", "NO_PROXY"))}
        clean.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INPUT="1", **(env or {}))
        return subprocess.run(
            [sys.executable, str(tmp_path / "course.py"), *args],
            capture_output=True,
            text=True,
            env=clean,
            timeout=240,
        )

    return run


@pytest.fixture
def silent_index():
    """http://127.0.0.1:PORT/: a socket that accepts connections and never answers."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)  # the kernel completes the handshake; nobody ever reads or replies
    yield f"http://127.0.0.1:{server.getsockname()[1]}/simple"
    server.close()


@pytest.fixture
def empty_index():
    """http://127.0.0.1:PORT/simple: an index that answers, 404 to everything (it holds no package)."""
    import http.server
    import threading

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404)

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_course_says_in_a_short_first_line_that_the_cpu_index_does_not_answer(course_copy, silent_index):
    import time

    course = _course_module()
    start = time.monotonic()
    result = course_copy(
        ["test", "--cpu-torch"],
        **{
            f'CPU_INDEX = "{course.CPU_INDEX}"': f'CPU_INDEX = "{silent_index}"',
            "PROBE_TIMEOUT = 10": "PROBE_TIMEOUT = 1",
        },
    )
    assert time.monotonic() - start < 60
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "Retrying" not in result.stderr, "pip must not have started"
    first, *remedies = result.stderr.strip().splitlines()
    assert first.startswith(f"course.py: PyTorch's CPU-only index {silent_index} cannot be reached (no answer"), first
    assert first.endswith("nothing was installed") and len(first) < 140, f"a short first line, not: {first}"
    assert remedies and all(line.startswith("  - ") for line in remedies), result.stderr
    for advice in ("without --cpu-torch", "install torch into .venv/", "pip install torch"):
        assert any(advice in line for line in remedies), f"{advice!r} missing from: {remedies}"


@pytest.mark.slow
def test_course_says_in_a_short_first_line_that_pip_index_url_does_not_answer(course_copy):
    url = f"http://127.0.0.1:{_closed_port()}/simple"
    result = course_copy(["lab"], env={"PIP_INDEX_URL": url})
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "Retrying" not in result.stderr
    first, *remedies = result.stderr.strip().splitlines()
    assert first.startswith(f"course.py: the package index {url} (PIP_INDEX_URL) cannot be reached ("), first
    assert "refused" in first.lower() and first.endswith("nothing was installed")
    assert any("point PIP_INDEX_URL at an index that answers" in line for line in remedies), remedies


@pytest.mark.slow
def test_a_failing_pip_ends_in_what_failed_then_the_remedy_and_a_non_zero_exit(course_copy, empty_index):
    result = course_copy(["test", "--fast"], env={"PIP_INDEX_URL": empty_index})
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    assert "ERROR:" in result.stderr, "pip's own message stays above the summary"
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert lines[-2:] == [
        "course.py: installing the course's requirements (requirements.txt) into .venv/ failed (pip exited with 1)",
        "  - fix what pip names in its messages above, then run the same command again",
    ]


@pytest.mark.slow
def test_with_pip_no_index_there_is_no_index_to_check(course_copy):
    """PIP_NO_INDEX (a wheelhouse via PIP_FIND_LINKS): pip reads no index, so course.py checks none."""
    url = f"http://127.0.0.1:{_closed_port()}/simple"
    result = course_copy(["lab"], env={"PIP_INDEX_URL": url, "PIP_NO_INDEX": "1"})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "cannot be reached" not in result.stderr
    assert (
        (result.stdout + result.stderr)
        .strip()
        .splitlines()[-2]
        .startswith("course.py: installing the course's requirements (requirements.txt)")
    )


def test_index_probe_tells_answers_from_silence(silent_index, empty_index):
    course = _course_module()
    assert course.unreachable(empty_index, timeout=5) is None, "a 404 is an answer"
    assert course.unreachable(silent_index, timeout=0.5) == "no answer within 0.5 s"
    assert "refused" in course.unreachable(f"http://127.0.0.1:{_closed_port()}/", timeout=5).lower()


def test_participant_checklist_and_readme_agree_on_the_no_gpu_command():
    guide = (ROOT / "docs" / "instructor_guide.md").read_text(encoding="utf-8")
    checklist = guide.split("### Participant checklist", 1)[1].split("\n### ", 1)[0]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    for text in (checklist, quickstart):
        assert "python3 course.py lab --cpu-torch" in text, "no GPU: the command that installs the 200 MB build"
    assert "PyTorch CPU is enough" not in checklist, "plain `lab` installs the CUDA build on Linux"


def test_lab_command_opens_notebook_00():
    course = _course_module()
    cmd = course.lab_command(["--no-browser"], python="python")
    assert cmd[:4] == ["python", "-m", "jupyter", "lab"] and cmd[-1 if os.geteuid() else -2] == "--no-browser"
    assert f"--ServerApp.root_dir={ROOT / 'notebooks'}" in cmd
    assert "--LabApp.default_url=/lab/tree/00_setup_check.ipynb" in cmd
    assert (ROOT / "notebooks" / course.NOTEBOOK_00).is_file()


def test_lab_in_chinese_opens_the_chinese_notebook_00_and_sets_jupyterlabs_locale(tmp_path, monkeypatch, capsys):
    course = _course_module()
    assert course.split_language(["--lang", "zh", "--no-browser"]) == ("zh", ["--no-browser"])
    with pytest.raises(course.SetupError, match="--lang takes one of en, zh, got fr"):
        course.split_language(["--lang", "fr"])
    cmd = course.lab_command([], python="python", lang="zh")
    assert "--LabApp.default_url=/lab/tree/zh/00_setup_check.ipynb" in cmd
    assert (ROOT / "notebooks" / "zh" / course.NOTEBOOK_00).is_file()
    monkeypatch.setattr(course, "VENV", tmp_path)
    monkeypatch.setattr(course.subprocess, "run", lambda *a, **k: types.SimpleNamespace(returncode=1))
    assert course.lab_settings("zh") is None and "jupyterlab-language-pack-zh-CN" in capsys.readouterr().out
    monkeypatch.setattr(course.subprocess, "run", lambda *a, **k: types.SimpleNamespace(returncode=0))
    folder = course.lab_settings("zh")
    assert json.loads((folder / course.LAB_LOCALE_SETTING).read_text()) == {"locale": "zh_CN"}
    assert course.lab_settings("en") is None


@pytest.mark.slow
def test_lab_prints_a_url_that_lands_on_notebook_00(tmp_path):
    """JupyterLab started as `course.py lab --no-browser` starts it: the URL it prints opens notebook 00."""
    import time
    import urllib.error
    import urllib.request

    course = _course_module()
    port = _closed_port()
    args = [
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.token=first-hour",
        "--ServerApp.port_retries=0",
    ]
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"))
    proc = subprocess.Popen(
        course.lab_command(args, python=sys.executable), stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path
    )
    try:
        deadline, url = time.monotonic() + 120, None
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "JupyterLab exited"
            match = re.search(rf"(http://(?:localhost|127\.0\.0\.1):{port}/\S+)", line)
            url = match.group(1) if match else None
        assert url, "JupyterLab printed no URL"
        assert re.fullmatch(rf"http://\S+:{port}/lab/tree/00_setup_check\.ipynb\?token=\S+", url), url
        while True:  # the server prints its URL a moment before it listens
            try:
                page = urllib.request.urlopen(url.split("?")[0] + "?token=first-hour", timeout=30).read().decode()
                break
            except urllib.error.URLError:
                assert time.monotonic() < deadline and proc.poll() is None, "JupyterLab never answered"
                time.sleep(0.5)
        assert '"treePath": "00_setup_check.ipynb"' in page, "the page JupyterLab serves opens that notebook"
        api = f"http://127.0.0.1:{port}/api/contents/00_setup_check.ipynb?content=0&token=first-hour"
        assert json.loads(urllib.request.urlopen(api, timeout=30).read())["type"] == "notebook"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_the_test_command_prints_each_skips_reason(tmp_path):
    """`python3 course.py test` is pytest with pyproject.toml's options: its summary says why each skip."""
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\n\n"
        "def test_needs_a_browser():\n"
        "    pytest.skip('Chromium is not installed here')\n\n\n"
        "@pytest.mark.skipif(True, reason='no GPU on this machine')\n"
        "def test_needs_a_gpu():\n"
        "    pass\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path)]
        + ["-n", "0", str(tmp_path / "test_skips.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    summary = result.stdout.split("short test summary info", 1)[-1]
    assert result.returncode == 0, result.stdout[-2000:]
    assert re.search(r"SKIPPED \[1\] \S*test_skips.py:\d+: Chromium is not installed here", summary), summary
    assert re.search(r"SKIPPED \[1\] \S*test_skips.py:\d+: no GPU on this machine", summary), summary


# --- progress bars: stored as finished (mha_course.kit.progress), read from the committed files ---

#: notebooks executed before their bars were stored finished: re-execute each (`python -m authoring
#: execute notebooks/NN_x.ipynb`) and remove it here; 04 and 12 create their bar in the notebook
#: itself, so their cell must use mha_course.kit.progress.progress_bar instead of tqdm first
PROGRESS_BARS_NOT_YET_REEXECUTED: set[str] = set()
_BAR = re.compile(r"\d{1,3}%\|[^|\n]*\| *[\d.]+\w?/[\d.]+\w?")


def _stored_bars(path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    texts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            plain = "".join(out.get("data", {}).get("text/plain", ""))
            if "application/vnd.jupyter.widget-view+json" in out.get("data", {}) and _BAR.search(plain):
                texts.append(plain)
    return texts


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(
            p,
            marks=pytest.mark.xfail(
                strict=True,
                reason=f"re-execute {p.name}: its progress bars are stored as their first frame",
            ),
        )
        if p.stem in PROGRESS_BARS_NOT_YET_REEXECUTED
        else p
        for p in NOTEBOOKS
    ],
    ids=lambda p: p.stem,
)
def test_progress_bars_are_stored_finished(path):
    """GitHub, nbviewer and the site show a bar's stored text: it must be the finished bar, its count
    complete and no timing (mha_course.kit.progress.progress_bar stores it so)."""
    for text in _stored_bars(path):
        match = re.search(r"\| *([\d.]+\w?)/([\d.]+\w?)$", text)
        assert match and match[1] == match[2] and "100%" in text, (
            f"{path.name} stores a bar as {text!r}: create it with mha_course.kit.progress.progress_bar "
            "and re-execute the notebook"
        )


def test_the_list_of_notebooks_to_reexecute_names_only_notebooks_with_bars():
    stems = {p.stem for p in NOTEBOOKS}
    assert PROGRESS_BARS_NOT_YET_REEXECUTED <= stems
    for stem in PROGRESS_BARS_NOT_YET_REEXECUTED:
        assert _stored_bars(ROOT / "notebooks" / f"{stem}.ipynb"), f"{stem} shows no progress bar: remove it"


def test_nbval_waits_a_minute_for_a_cells_outputs():
    """The root conftest raises nbval's fixed 5 s wait for a cell's outputs (after the kernel's reply)
    to a minute; it works through nbval's per-cell attribute, which must still exist and be used."""
    import importlib.util
    import inspect

    import nbval.plugin

    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    root_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root_conftest)

    source = inspect.getsource(nbval.plugin.IPyNbCell)
    assert "self.output_timeout = 5" in source and "timeout=self.output_timeout" in source

    class Cell:
        output_timeout = 5
        nodeid = "notebooks/01_single_head_attention.ipynb::Cell 0"

        def get_closest_marker(self, name):
            return None

    items = [Cell()]
    root_conftest.pytest_collection_modifyitems(None, items)
    assert items[0].output_timeout == root_conftest.NBVAL_OUTPUT_TIMEOUT_S == 60


def test_xdist_scopes_keep_shared_state_together_and_start_the_long_ones_first():
    """How the root conftest shares the suite between xdist's workers (--dist loadscope with its
    scheduler): one scope per notebook under nbval (one kernel), per test file with a module
    fixture (it starts once), for the website's two files (one build); every other test is a
    scope of its own (JupyterLab's runs share one server). First the English notebooks under
    nbval, then the long single scopes, then the other notebook runs, then the unit tests."""
    import importlib.util

    from xdist.scheduler import LoadScopeScheduling

    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    root_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root_conftest)

    class Item:
        def __init__(self, nodeid, *marks, fixture_scopes=()):
            self.nodeid, self.marks = nodeid, set(marks)
            defs = [[type("FixtureDef", (), {"scope": scope})()] for scope in fixture_scopes]
            self._fixtureinfo = type("Info", (), {"name2fixturedefs": dict(enumerate(defs))})()

        def get_closest_marker(self, name):
            return name if name in self.marks else None

    unit = Item("tests/test_masks.py::test_a", fixture_scopes=("function", "session"))
    ranks = Item("tests/test_distributed.py::test_ring[2]", fixture_scopes=("module",))
    student = Item("tests/test_student_edition.py::test_student_notebook_runs_top_to_bottom[07]", "executes_notebooks")
    zh_cell = Item("notebooks/zh/07_do_heads_specialize.ipynb::Cell 3")
    lab = Item("tests/browser/test_jupyterlab.py::test_notebook_runs[07]", "browser", "executes_notebooks")
    site = Item("tests/test_site.py::test_pages", fixture_scopes=("module",))
    site_browser = Item("tests/browser/test_site_in_browser.py::test_search", "browser")
    en_cell = Item("notebooks/07_do_heads_specialize.ipynb::Cell 3")
    items = [unit, ranks, student, zh_cell, lab, site, site_browser, en_cell]
    root_conftest.pytest_collection_modifyitems(None, items)
    assert items == [en_cell, lab, site, site_browser, student, zh_cell, unit, ranks]

    scope = root_conftest.scope_of
    assert scope(en_cell.nodeid) == scope("notebooks/07_do_heads_specialize.ipynb::Cell 9")
    assert scope(zh_cell.nodeid) != scope(en_cell.nodeid)
    assert scope(site.nodeid) == scope(site_browser.nodeid) == "site"
    assert scope(lab.nodeid) == scope("tests/browser/test_jupyterlab.py::test_notebook_runs[12]")
    assert scope(ranks.nodeid) == scope("tests/test_distributed.py::test_ulysses")
    assert scope(student.nodeid) != scope("tests/test_student_edition.py::test_student_notebook_runs_top_to_bottom[12]")
    assert scope(unit.nodeid) != scope("tests/test_masks.py::test_b")

    stray = Item("tests/test_new.py::test_with_a_module_fixture", fixture_scopes=("module",))
    with pytest.raises(pytest.UsageError, match="GROUPED_FILES"):
        root_conftest.pytest_collection_modifyitems(None, [stray])

    class Config:
        def getvalue(self, name):
            return "loadscope"

        option = type("Options", (), {"tx": [], "numprocesses": 2, "loadscopereorder": False})()

    scheduler = root_conftest.pytest_xdist_make_scheduler(Config(), None)
    assert (
        isinstance(scheduler, LoadScopeScheduling)
        and scheduler._split_scope(ranks.nodeid) == "tests/test_distributed.py"
    )
    assert "--dist loadscope --no-loadscope-reorder" in (ROOT / "pyproject.toml").read_text()
