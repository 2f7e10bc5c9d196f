"""What the setup cell does on Colab, beyond tests/test_project.py's check of its pip command:

* run in every notebook with ``google.colab`` faked and every way of starting a process replaced
  by a recorder, it starts exactly one: pip, through the kernel's own interpreter, quietly, with
  one requirement that names this project (pyproject's ``name``) at pyproject's Repository URL;
  outside Colab it starts none;
* what pip would then install is the course package and nothing else: the declared dependencies
  are all preinstalled on Colab in versions that satisfy them (checked with ``packaging`` for
  Colab's Python 3.13, torch 2.11, ipywidgets 7.7.1), and pip's own resolver, run as a dry run in
  an environment that holds exactly Colab's versions (with newer torch and ipywidgets on offer),
  plans to install the course package alone (a dry run that asks for a newer torch shows the
  check would notice);
* the package pip builds from the repository contains every module and quiz the notebooks use.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
import types
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from authoring import notebooks as notebook_tools

pytestmark = pytest.mark.slow  # pip plans and second interpreters: not in `course.py test --fast`

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
NOTEBOOKS = notebook_tools.numbered_notebooks()

# Colab's runtime. Python, torch and ipywidgets: COURSE_DESIGN.md §8 (checked facts). numpy,
# matplotlib and tqdm are preinstalled on Colab too; the versions are lower bounds of what it
# ships, so the course must not ask for more than these.
COLAB_PYTHON = "3.13"
COLAB = {"torch": "2.11.0", "ipywidgets": "7.7.1", "numpy": "2.0.2", "matplotlib": "3.10.0", "tqdm": "4.67.1"}
NEVER_UPGRADE = ("torch", "ipywidgets")


def setup_cell(path: Path) -> str:
    nb = json.loads(path.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    return "".join(code[0]["source"])


def run_setup_cell(source: str, *, on_colab: bool, monkeypatch) -> tuple[list[list[str]], dict]:
    """Execute a setup cell with every process-starting function recorded, not run."""
    started: list[list[str]] = []

    def recorder(api):
        def record(cmd, *args, **kwargs):
            started.append([api, *(shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd])])
            return subprocess.CompletedProcess(cmd, 0, b"", b"") if api == "subprocess.run" else 0

        return record

    for name in ("check_call", "call", "run", "check_output", "Popen", "getoutput", "getstatusoutput"):
        monkeypatch.setattr(subprocess, name, recorder(f"subprocess.{name}"))
    monkeypatch.setattr(os, "system", recorder("os.system"))
    monkeypatch.setattr(os, "popen", recorder("os.popen"))
    if on_colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    namespace: dict = {}
    exec(compile(source, "<setup cell>", "exec"), namespace)
    return started, namespace


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_setup_cell_starts_pip_for_this_project_only_on_colab(path, monkeypatch):
    source = setup_cell(path)
    started, namespace = run_setup_cell(source, on_colab=False, monkeypatch=monkeypatch)
    assert started == [], f"outside Colab the setup cell must start no process: {started}"
    assert "mc" in namespace, "the setup cell imports mha_course as mc"

    started, _ = run_setup_cell(source, on_colab=True, monkeypatch=monkeypatch)
    assert len(started) == 1, f"on Colab the setup cell starts one process, not {started}"
    api, *argv = started[0]
    assert argv[:4] == [sys.executable, "-m", "pip", "install"], f"pip of the kernel's own Python: {argv}"
    options = [a for a in argv[4:] if a.startswith("-")]
    requirements = [a for a in argv[4:] if not a.startswith("-")]
    assert set(options) <= {"-q", "--quiet"}, f"pip options beyond --quiet need a review (upgrades?): {options}"
    assert len(requirements) == 1, f"one requirement, the course: {requirements}"

    req = Requirement(requirements[0])
    owner, repo = notebook_tools.repository()
    assert canonicalize_name(req.name) == canonicalize_name(PROJECT["name"])
    assert req.url == f"git+{PROJECT['urls']['Repository'].rstrip('/')}" == f"git+https://github.com/{owner}/{repo}"
    assert not req.extras and not req.specifier and req.marker is None


def test_colab_already_satisfies_every_runtime_dependency():
    assert SpecifierSet(PROJECT["requires-python"]).contains(COLAB_PYTHON + ".0"), "Colab runs Python 3.13"
    env = default_environment() | {
        "python_version": COLAB_PYTHON,
        "python_full_version": COLAB_PYTHON + ".0",
        "sys_platform": "linux",
        "platform_system": "Linux",
    }
    for spec in PROJECT["dependencies"]:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        assert name in COLAB, f"{spec}: not preinstalled on Colab, pip would install it (and its dependencies)"
        assert req.specifier.contains(COLAB[name], prereleases=True), (
            f"{spec}: Colab has {name} {COLAB[name]}; pip would {'UPGRADE' if name in NEVER_UPGRADE else 'upgrade'} it"
        )


# --- pip's own resolver against an environment holding exactly Colab's versions ----------------------


def _dist_info(name: str, version: str, requires: list[str] = (), python: str | None = None) -> dict[str, str]:
    folder = f"{name.replace('-', '_')}-{version}.dist-info"
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Python: {python}"] if python else []
    lines += [f"Requires-Dist: {r}" for r in requires]
    return {
        f"{folder}/METADATA": "\n".join(lines) + "\n",
        f"{folder}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{folder}/RECORD": "",
    }


def _wheel(folder: Path, name: str, version: str, requires: list[str] = (), python: str | None = None) -> None:
    with zipfile.ZipFile(folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl", "w") as whl:
        for member, text in _dist_info(name, version, requires, python).items():
            whl.writestr(member, text)


@pytest.fixture(scope="module")
def fake_colab(tmp_path_factory) -> Path:
    """A virtual environment whose site-packages holds only Colab's versions (metadata only)."""
    root = tmp_path_factory.mktemp("colab")
    venv.EnvBuilder(with_pip=False).create(root / "env")
    python = root / "env" / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    for name, version in COLAB.items():
        for member, text in _dist_info(name, version).items():
            (site / member).parent.mkdir(parents=True, exist_ok=True)
            (site / member).write_text(text)
    return python


def pip_would_install(python: Path, folder: Path, course_requires: list[str]) -> dict[str, str]:
    """{name: version} that ``pip install <course>`` would install into ``python``'s environment,
    with ``folder`` as the only index: the course (with ``course_requires``), plus newer torch and
    ipywidgets than Colab's, as PyPI has them."""
    folder.mkdir()
    _wheel(folder, PROJECT["name"], PROJECT["version"], course_requires, PROJECT["requires-python"])
    _wheel(folder, "torch", "2.13.0")
    _wheel(folder, "ipywidgets", "8.1.9")
    report = folder / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", "install"]
    cmd += ["--dry-run", "--quiet", "--no-index", "--find-links", str(folder), "--report", str(report)]
    result = subprocess.run([*cmd, PROJECT["name"]], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"pip could not resolve the course on Colab's versions:\n{result.stderr[-3000:]}"
    plan = json.loads(report.read_text())["install"]
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in plan}


def test_pip_would_install_the_course_and_nothing_else_on_colab(fake_colab, tmp_path):
    plan = pip_would_install(fake_colab, tmp_path / "index", PROJECT["dependencies"])
    assert plan == {canonicalize_name(PROJECT["name"]): PROJECT["version"]}, f"pip would also install {plan}"


def test_the_dry_run_notices_an_upgrade(fake_colab, tmp_path):
    """The check above is not vacuous: a course that asked for a newer torch would upgrade it."""
    requires = [r for r in PROJECT["dependencies"] if canonicalize_name(Requirement(r).name) != "torch"]
    plan = pip_would_install(fake_colab, tmp_path / "index", [*requires, "torch>=2.12"])
    assert plan == {canonicalize_name(PROJECT["name"]): PROJECT["version"], "torch": "2.13.0"}


# --- what pip builds from the repository ------------------------------------------------------------


def _setuptools_packages() -> set[str]:
    """What ``[tool.setuptools.packages.find]`` ships: folders with __init__.py, down from the root."""
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    found = set()
    for init in sorted(ROOT.glob("**/__init__.py")):
        parts = init.parent.relative_to(ROOT).parts
        if not parts or any(p.startswith(".") for p in parts) or parts[0] in ("tests", "notebooks", "build"):
            continue
        name = ".".join(parts)
        parents_ok = all(".".join(parts[:i]) in found for i in range(1, len(parts)))
        if parents_ok and any(fnmatch.fnmatchcase(name, pattern) for pattern in include):
            found.add(name)
    return found


def _shipped_data(path: Path) -> bool:
    """Whether setuptools' ``package-data`` globs (``*`` stops at ``/``) cover ``path``."""
    for package, patterns in PYPROJECT["tool"]["setuptools"].get("package-data", {}).items():
        base = ROOT.joinpath(*package.split("."))
        if base not in path.parents:
            continue
        parts = path.relative_to(base).parts
        for pattern in patterns:
            pieces = pattern.split("/")
            if len(pieces) == len(parts) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(parts, pieces, strict=True)):
                return True
    return False


def test_every_file_of_the_package_is_shipped():
    packages = _setuptools_packages()
    assert "mha_course" in packages
    for path in sorted((ROOT / "mha_course").rglob("*")):
        if path.is_dir() or "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        package = ".".join(path.parent.relative_to(ROOT).parts)
        if path.suffix == ".py":
            assert package in packages, f"{path.relative_to(ROOT)}: its folder has no __init__.py, pip would drop it"
        else:
            assert _shipped_data(path), f"{path.relative_to(ROOT)}: not covered by package-data, Colab would miss it"


def _code(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    lines = []
    for cell in cells:
        if cell["cell_type"] == "code":
            source = "".join(cell["source"])
            lines += [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    return "\n".join(lines)


def _is_module(dotted: str) -> bool:
    file = ROOT.joinpath(*dotted.split("."))
    return file.is_dir() or file.with_suffix(".py").is_file()


def _shipped_module(dotted: str, packages: set[str]) -> bool:
    return dotted in packages or (
        ROOT.joinpath(*dotted.split(".")).with_suffix(".py").is_file() and dotted.rpartition(".")[0] in packages
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_uses_only_shipped_modules_and_quizzes(path):
    packages = _setuptools_packages()
    code = _code(path)
    used = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            used |= {a.name for a in node.names if a.name.split(".")[0] == "mha_course"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mha_course":
            used.add(node.module)  # and the names it imports that are modules, not functions
            used |= {f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")}
    assert "mha_course" in used, f"{path.name} does not import mha_course"
    for name in sorted(used):
        assert _shipped_module(name, packages), f"{path.name} imports {name}, which the installed package would lack"
    for key in re.findall(r"quiz\.show\(\s*[\"'](\w+)[\"']", code):
        quiz_file = ROOT / "mha_course" / "kit" / "quizzes" / f"{key}.json"
        assert quiz_file.is_file() and _shipped_data(quiz_file), f"{path.name} shows quiz {key}: not shipped"
