#!/usr/bin/env python3
"""One entry point for learners, instructors and CI (standard library only).

    python3 course.py lab [--cpu-torch] [JUPYTER ARGS]   install into .venv/ and open the course in JupyterLab
    python3 course.py test [--cpu-torch] [PYTEST ARGS]   install into .venv/ and run the whole test suite
    python3 course.py test --fast [PYTEST ARGS]          unit and checker tests only (no notebooks, browser, pip)
    python3 course.py site [--cpu-torch] [OUT]           also the website's tools (an extra); build _site/

All three create the virtual environment .venv/ next to this file on first use and (re)install the
requirements whenever requirements.txt or pyproject.toml change. Extra arguments go to JupyterLab
(e.g. `python3 course.py lab --no-browser` on a remote machine) or to pytest (e.g.
`python3 course.py test -k masks`).

PyTorch: pip's default torch on Linux is the CUDA build (about 3-4 GB with its NVIDIA libraries),
whether or not the machine has a GPU. Without a GPU, `--cpu-torch` installs PyTorch's CPU-only
build first (about 200 MB) from https://download.pytorch.org/whl/cpu; the course runs the same on
either build. An installed torch is never replaced.

Before pip starts, course.py checks that the index it is about to use answers (PyTorch's CPU index,
then PIP_INDEX_URL, pip's configured index or PyPI; none with PIP_NO_INDEX); if one does not, or
pip fails, it ends with one line saying what failed and what to do, and a non-zero exit status.
"""

from __future__ import annotations

import hashlib
import os
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
    """A step of the set-up failed; its message is the one line course.py prints before exiting."""


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
            f"installing {what} into .venv/ failed (pip exited with {returncode}; its messages are above): "
            "fix what pip names there, then run the same command again"
        )


def check_cpu_index() -> None:
    why = None if no_index() else unreachable(CPU_INDEX)
    if why:
        raise SetupError(
            f"PyTorch's CPU-only index {CPU_INDEX} cannot be reached ({why}), so nothing was installed: "
            "check the network or proxy (HTTPS_PROXY), or run again without --cpu-torch (torch then comes "
            "from PyPI or PIP_INDEX_URL: on Linux the 3-4 GB CUDA build), or install torch into .venv/ "
            f"yourself ({PY} -m pip install torch, from a wheel or an index that answers) and run again"
        )


def check_requirements_index() -> None:
    if no_index():
        return
    url, origin = pip_index()
    why = unreachable(url)
    if why:
        raise SetupError(
            f"the package index {url} ({origin}) cannot be reached ({why}), so nothing was installed: "
            "check the network or proxy (HTTPS_PROXY), or point PIP_INDEX_URL at an index that answers "
            "(a mirror, or a local wheelhouse served with python3 -m http.server) and run again"
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
                f"creating {VENV} failed ({error}); on Debian/Ubuntu install the python3-venv package, "
                f"then remove {VENV} and run again"
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


def ensure_site_tools() -> None:
    """The optional `site` extra of pyproject.toml (Sphinx, MyST-NB ...), only for `site`."""
    stamp = VENV / ".mha-course-site-installed"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return
    check_requirements_index()
    print("installing the course website's tools (the `site` extra) into .venv/ ...", flush=True)
    pip_install(["-e", f"{ROOT}[site]"], "the course website's tools (the `site` extra)")
    stamp.write_text(digest)


def lab_command(rest: list[str], python: str | Path = PY) -> list[str]:
    """JupyterLab on notebooks/, its printed and opened URL landing on notebook 00 (not the launcher)."""
    cmd = [
        str(python),
        "-m",
        "jupyter",
        "lab",
        f"--ServerApp.root_dir={ROOT / 'notebooks'}",
        f"--LabApp.default_url=/lab/tree/{NOTEBOOK_00}",
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


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("lab", "test", "site"):
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    cpu_torch = "--cpu-torch" in rest
    fast = command == "test" and "--fast" in rest
    rest = [a for a in rest if a not in ("--cpu-torch", "--fast")]
    try:
        ensure_environment(cpu_torch=cpu_torch)
        if command == "site":
            ensure_site_tools()
    except SetupError as error:
        print(f"course.py: {error}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("course.py: stopped; run the same command again to go on", file=sys.stderr, flush=True)
        return 130
    env = dict(os.environ, PYTHONHASHSEED="0")
    if command == "lab":
        cmd = lab_command(rest)
    elif command == "site":
        cmd = [str(PY), "-m", "authoring.site", *rest]
    else:
        cmd = [str(PY), "-m", "pytest", *(FAST if fast else []), *rest]
    return run_forwarding_signals(cmd, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
