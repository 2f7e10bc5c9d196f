#!/usr/bin/env python3
"""One entry point for learners, instructors and CI (standard library only).

    python3 course.py lab [--cpu-torch] [JUPYTER ARGS]   install into .venv/ and open the course in JupyterLab
    python3 course.py lab --lang zh [JUPYTER ARGS]       the Chinese edition (notebooks/zh/00_setup_check), and
                                                         JupyterLab in Chinese where its language pack is installed
    python3 course.py test [--cpu-torch] [PYTEST ARGS]   install into .venv/ (with the site and nbgrader
                                                         extras) and run the whole test suite
    python3 course.py test --fast [PYTEST ARGS]          unit and checker tests only (no notebooks, browser, pip)
    python3 course.py test --slowest [PYTEST ARGS]       the same tests, then the 20 slowest (suite-times)
    python3 course.py site [--cpu-torch] [OUT]           also the website's tools (an extra); build _site/
    python3 course.py class COMMAND ...                  the class tools, in .venv/ (nbgrader installed on first use):
        class nbgrader COURSE_DIR [NOTEBOOK ...]         an nbgrader course, its releases generated
        class autograde COURSE_DIR ASSIGNMENT            grade the submissions, then each learner's score
        class feedback COURSE_DIR ASSIGNMENT             nbgrader's feedback, one HTML file per learner
        class progress FOLDER [--gradebook DB] [--figure PNG]   learners x exercises: where the room is stuck
        class hub-links --hub URL                        an nbgitpuller and a Colab link per notebook
    python3 course.py --help                             this text

All of them create the virtual environment .venv/ next to this file on first use and (re)install the
requirements whenever requirements.txt or pyproject.toml change; nothing needs activating. Extra
arguments go to JupyterLab (e.g. `python3 course.py lab --no-browser` on a remote machine) or to
pytest (e.g. `python3 course.py test -k masks`).

PyTorch: pip's default torch on Linux is the CUDA build (about 3-4 GB with its NVIDIA libraries),
whether or not the machine has a GPU. Without a GPU, `--cpu-torch` installs PyTorch's CPU-only
build first (about 200 MB) from https://download.pytorch.org/whl/cpu; the course runs the same on
either build. An installed torch is never replaced.

Before pip starts, course.py checks that the index it is about to use answers (PyTorch's CPU index,
then PIP_INDEX_URL, pip's configured index or PyPI; none with PIP_NO_INDEX); if one does not, or
pip fails, it says on its first line what failed, gives the remedies on the lines below, and exits
with a non-zero status.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".mha-course-installed"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYPI_INDEX = "https://pypi.org/simple"
#: seconds an index may take to answer before course.py says so, instead of pip retrying for minutes
PROBE_TIMEOUT = 10
NOTEBOOK_00 = "00_setup_check.ipynb"
#: pytest selection of `test --fast`: the package's unit tests and the checkers' tests
FAST = ["tests", "-m", "not slow and not browser"]


class SetupError(Exception):
    """A step of the set-up failed: ``what`` (one short line naming what failed) and the remedies,
    which course.py prints on the lines after it before exiting."""

    def __init__(self, what: str, *remedies: str):
        super().__init__("\n".join([what, *(f"  - {remedy}" for remedy in remedies)]))


def installed_torch() -> str | None:
    """The torch version installed in .venv/, or None."""
    probe = "import importlib.metadata as m; print(m.version('torch'))"
    result = subprocess.run([str(PY), "-c", probe], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


def _pip_config() -> dict[str, str]:
    """pip's configuration files, as `pip config list` reads them (e.g. {'global.index-url': URL})."""
    try:
        listed = subprocess.run([str(PY), "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    except OSError:  # no .venv/ python to ask: no configuration read
        listed = ""
    pairs = (line.partition("=") for line in listed.splitlines())
    return {key.strip(): value.strip().strip("'\"") for key, _, value in pairs}


def no_index() -> bool:
    """True when pip is told to use no index (PIP_NO_INDEX, or no-index in pip's configuration):
    it installs from --find-links alone, e.g. a wheelhouse, and there is no index to check."""
    truthy = ("1", "true", "yes", "on")
    if os.environ.get("PIP_NO_INDEX", "").lower() in truthy:
        return True
    config = _pip_config()
    return any(config.get(f"{section}.no-index", "").lower() in truthy for section in ("global", "install"))


def pip_index() -> tuple[str, str]:
    """The index pip installs the requirements from, and where that choice comes from."""
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"], "PIP_INDEX_URL"
    config = _pip_config()
    for key in ("install.index-url", "global.index-url"):
        if config.get(key):
            return config[key], "pip's configuration (pip config list)"
    return PYPI_INDEX, "PyPI, pip's default"


def unreachable(url: str, timeout: float = PROBE_TIMEOUT) -> str | None:
    """None if the index at url answers (any HTTP status) within timeout seconds, else why not."""
    request = urllib.request.Request(url.rstrip("/") + "/", method="HEAD")
    try:
        urllib.request.urlopen(request, timeout=timeout).close()
    except urllib.error.HTTPError:
        return None  # it answered; whatever it said, pip reports it better
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except urllib.error.URLError as error:
        reason = error.reason
        if isinstance(reason, TimeoutError):
            return f"no answer within {timeout:g} s"
        return str(getattr(reason, "strerror", None) or reason)
    except (OSError, ValueError) as error:
        return str(error) or type(error).__name__
    return None


def pip_install(args: list[str], what: str) -> None:
    """pip install args into .venv/; a failure becomes a SetupError naming what was being installed."""
    cmd = [str(PY), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    returncode = subprocess.run(cmd, cwd=ROOT).returncode
    if returncode != 0:
        raise SetupError(
            f"installing {what} into .venv/ failed (pip exited with {returncode})",
            "fix what pip names in its messages above, then run the same command again",
        )


def check_cpu_index() -> None:
    why = None if no_index() else unreachable(CPU_INDEX)
    if why:
        raise SetupError(
            f"PyTorch's CPU-only index {CPU_INDEX} cannot be reached ({why}); nothing was installed",
            "check the network or the proxy (HTTPS_PROXY), then run the same command again",
            "or run again without --cpu-torch (torch then comes from PyPI or PIP_INDEX_URL: on Linux the "
            "3-4 GB CUDA build)",
            f"or install torch into .venv/ yourself ({PY} -m pip install torch, from a wheel or an index "
            "that answers) and run again",
        )


def check_requirements_index() -> None:
    if no_index():
        return
    url, origin = pip_index()
    why = unreachable(url)
    if why:
        raise SetupError(
            f"the package index {url} ({origin}) cannot be reached ({why}); nothing was installed",
            "check the network or the proxy (HTTPS_PROXY), then run the same command again",
            "or point PIP_INDEX_URL at an index that answers (a mirror, or a local wheelhouse served with "
            "python3 -m http.server) and run again",
        )


def ensure_environment(*, cpu_torch: bool = False) -> None:
    if sys.version_info < (3, 10):  # noqa: UP036 (this script may be started by an older python3)
        raise SetupError(f"mha-course needs Python >= 3.10, this is {sys.version.split()[0]}")
    if not PY.exists():
        print(f"creating {VENV} ...", flush=True)
        try:
            venv.EnvBuilder(with_pip=True).create(VENV)
        except (OSError, subprocess.CalledProcessError) as error:
            raise SetupError(
                f"creating {VENV} failed ({error})",
                f"on Debian/Ubuntu install the python3-venv package, then remove {VENV} and run again",
            ) from None
    torch = installed_torch()
    if cpu_torch and torch is None:
        check_cpu_index()
        print(f"installing PyTorch's CPU-only build (about 200 MB) from {CPU_INDEX} ...", flush=True)
        pip_install(["torch", "--index-url", CPU_INDEX], "PyTorch's CPU-only build")
        torch = installed_torch()
    digest = hashlib.sha256(
        b"".join((ROOT / f).read_bytes() for f in ("requirements.txt", "pyproject.toml"))
    ).hexdigest()
    if STAMP.exists() and STAMP.read_text() == digest:
        return
    check_requirements_index()
    if torch is None:
        print(
            "installing torch from PyPI: on Linux that is the CUDA build, about 3-4 GB with its NVIDIA "
            "libraries (no GPU? stop with Ctrl-C and run again with --cpu-torch: about 200 MB)",
            flush=True,
        )
    else:
        print(f"keeping the installed torch {torch}", flush=True)
    print("installing the course's requirements (requirements.txt) into .venv/ ...", flush=True)
    pip_install(["-r", str(ROOT / "requirements.txt")], "the course's requirements (requirements.txt)")
    pip_install(["--no-deps", "-e", str(ROOT)], "the course's package mha_course")
    STAMP.write_text(digest)


#: the extras of pyproject.toml that course.py installs: name -> what they are, for its messages
EXTRAS = {
    "site": "the course website's tools (the `site` extra)",
    "nbgrader": "nbgrader, for grading a class (the `nbgrader` extra)",
}


def extra_requirements(extra: str) -> list[str]:
    """The distribution names of one optional extra of pyproject.toml (e.g. ["nbgrader"])."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    m = re.search(rf"^{re.escape(extra)}\s*=\s*\[(?P<items>[^\]]*)\]", text, re.M)
    if not m:
        raise SetupError(f"pyproject.toml has no optional extra {extra!r}")
    items = [item for item in m.group("items").split(",") if item.strip()]
    return [re.match(r"\s*[\"']([A-Za-z0-9_.\-]+)", item).group(1) for item in items]


def missing_distributions(names: list[str]) -> list[str]:
    """Those of ``names`` that are not installed in .venv/."""
    probe = (
        "import sys, importlib.metadata as m\n"
        "for n in sys.argv[1:]:\n"
        "    try: m.version(n)\n"
        "    except m.PackageNotFoundError: print(n)"
    )
    result = subprocess.run([str(PY), "-c", probe, *names], capture_output=True, text=True)
    return result.stdout.split() if result.returncode == 0 else list(names)


def ensure_extra(extra: str) -> None:
    """An optional extra of pyproject.toml in .venv/, installed on first use (and again when
    pyproject.toml changes, unless everything it names is installed already)."""
    stamp = VENV / f".mha-course-{extra}-installed"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return
    if missing_distributions(extra_requirements(extra)):
        check_requirements_index()
        print(f"installing {EXTRAS[extra]} into .venv/ ...", flush=True)
        pip_install(["-e", f"{ROOT}[{extra}]"], EXTRAS[extra])
    stamp.write_text(digest)


#: the languages of the course's editions: code -> (folder of notebook 00 under notebooks/, JupyterLab's locale)
LANGUAGES = {"en": ("", "en"), "zh": ("zh/", "zh_CN")}
#: JupyterLab's interface language lives in this settings file (of @jupyterlab/translation-extension)
LAB_LOCALE_SETTING = Path("@jupyterlab") / "translation-extension" / "plugin.jupyterlab-settings"


def split_language(rest: list[str]) -> tuple[str, list[str]]:
    """(the --lang value, the other arguments); a missing or unknown language is a SetupError."""
    if "--lang" not in rest:
        return "en", rest
    i = rest.index("--lang")
    if i + 1 >= len(rest) or rest[i + 1] not in LANGUAGES:
        got = rest[i + 1] if i + 1 < len(rest) else "nothing"
        raise SetupError(f"--lang takes one of {', '.join(LANGUAGES)}, got {got}")
    return rest[i + 1], rest[:i] + rest[i + 2 :]


def lab_settings(lang: str, python: str | Path = PY) -> Path | None:
    """A JupyterLab settings folder whose interface language is ``lang``'s, or None when JupyterLab
    keeps English (English asked for, or its language pack is not installed)."""
    locale = LANGUAGES[lang][1]
    if lang == "en":
        return None
    pack = f"jupyterlab_language_pack_{locale.replace('-', '_')}"
    found = subprocess.run([str(python), "-c", f"import {pack}"], capture_output=True).returncode == 0
    if not found:
        print(
            f"course.py: JupyterLab's interface stays English: its {locale} language pack is not installed\n"
            f"  .venv/bin/python -m pip install jupyterlab-language-pack-{locale.replace('_', '-')}",
            flush=True,
        )
        return None
    folder = VENV / "share" / "mha-course" / f"lab-settings-{lang}"
    setting = folder / LAB_LOCALE_SETTING
    setting.parent.mkdir(parents=True, exist_ok=True)
    setting.write_text(json.dumps({"locale": locale}) + "\n", encoding="utf-8")
    return folder


def lab_command(rest: list[str], python: str | Path = PY, lang: str = "en") -> list[str]:
    """JupyterLab on notebooks/, its printed and opened URL landing on notebook 00 (not the launcher);
    with ``lang="zh"`` on the Chinese notebook 00 (notebooks/zh/)."""
    cmd = [
        str(python),
        "-m",
        "jupyter",
        "lab",
        f"--ServerApp.root_dir={ROOT / 'notebooks'}",
        f"--LabApp.default_url=/lab/tree/{LANGUAGES[lang][0]}{NOTEBOOK_00}",
        *rest,
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers and workshop VMs often run as root
        cmd.append("--allow-root")
    return cmd


def run_forwarding_signals(cmd: list[str], env: dict) -> int:
    """Run cmd; SIGINT and SIGTERM sent to this script are passed on to it, and its exit code is ours."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)

    def forward(signum, _frame):
        if proc.poll() is None:
            proc.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:  # pragma: no cover - the handler above replaces the default one
            continue


#: the commands of ``course.py`` (``--help`` lists each)
COMMANDS = ("lab", "test", "site", "class")
#: ``course.py class COMMAND``: the class tools of ``python -m authoring``, run in .venv/
CLASS_COMMANDS = {
    "nbgrader": "COURSE_DIR [NOTEBOOK ...]   an nbgrader course from the solved notebooks, releases generated",
    "autograde": "COURSE_DIR ASSIGNMENT       grade submitted/<learner>/ASSIGNMENT/, then each learner's score",
    "feedback": "COURSE_DIR ASSIGNMENT       nbgrader's feedback: feedback/<learner>/ASSIGNMENT/*.html",
    "progress": "FOLDER [--gradebook DB] [--figure PNG]   learners x exercises, scores beside the checkers",
    "hub-links": "--hub URL                   an nbgitpuller and a Colab link per notebook",
}
#: class commands that need nbgrader (progress only to read a gradebook)
NEEDS_NBGRADER = ("nbgrader", "autograde", "feedback")


def class_help() -> str:
    lines = ["python3 course.py class COMMAND ...   (in .venv/; nothing to activate; nbgrader installed on first use)"]
    lines += [f"  {name:<10} {what}" for name, what in CLASS_COMMANDS.items()]
    return "\n".join(lines)


def class_command(rest: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command and environment of ``course.py class REST``: ``python -m authoring REST`` in
    .venv/, with .venv/bin first on PATH (nbgrader starts alembic and kernels by name) and this
    checkout importable from any folder (paths in REST stay relative to the caller's folder)."""
    env = dict(os.environ, PYTHONHASHSEED="0", VIRTUAL_ENV=str(VENV))
    env["PATH"] = os.pathsep.join([str(BIN), os.environ.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    env.pop("PYTHONHOME", None)
    return [str(PY), "-m", "authoring", *rest], env


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0
    if not argv or argv[0] not in COMMANDS:
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "class" and (not rest or rest[0] not in CLASS_COMMANDS):
        print(class_help())
        return 0 if rest and rest[0] in ("-h", "--help", "help") else 2
    cpu_torch = "--cpu-torch" in rest
    fast = command == "test" and "--fast" in rest
    slowest = command == "test" and "--slowest" in rest
    if command != "class":
        rest = [a for a in rest if a not in ("--cpu-torch", "--fast", "--slowest")]
    try:
        lang, rest = split_language(rest) if command == "lab" else ("en", rest)
        ensure_environment(cpu_torch=cpu_torch)
        if command == "site" or (command == "test" and not fast):
            ensure_extra("site")
        if (command == "test" and not fast) or (
            command == "class" and (rest[0] in NEEDS_NBGRADER or "--gradebook" in rest)
        ):
            ensure_extra("nbgrader")
    except SetupError as error:
        print(f"course.py: {error}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("course.py: stopped; run the same command again to go on", file=sys.stderr, flush=True)
        return 130
    env = dict(os.environ, PYTHONHASHSEED="0")
    if command == "lab":
        cmd = lab_command(rest, lang=lang)
        settings = lab_settings(lang)
        if settings is not None:
            env["JUPYTERLAB_SETTINGS_DIR"] = str(settings)
    elif command == "site":
        cmd = [str(PY), "-m", "authoring.site", *rest]
    elif command == "class":
        cmd, env = class_command(rest)
        return subprocess.call(cmd, env=env)
    elif slowest:
        cmd = [str(PY), "-m", "authoring", "suite-times", *(FAST if fast else []), *rest]
    else:
        cmd = [str(PY), "-m", "pytest", *(FAST if fast else []), *rest]
    return run_forwarding_signals(cmd, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
