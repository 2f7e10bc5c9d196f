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
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".mha-course-installed"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: pytest selection of `test --fast`: the package's unit tests and the checkers' tests
FAST = ["tests", "-m", "not slow and not browser"]


def installed_torch() -> str | None:
    """The torch version installed in .venv/, or None."""
    probe = "import importlib.metadata as m; print(m.version('torch'))"
    result = subprocess.run([str(PY), "-c", probe], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


def ensure_environment(*, cpu_torch: bool = False) -> None:
    if sys.version_info < (3, 10):  # noqa: UP036 (this script may be started by an older python3)
        sys.exit(f"mha-course needs Python >= 3.10, this is {sys.version.split()[0]}")
    if not PY.exists():
        print(f"creating {VENV} ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    pip = [str(PY), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    torch = installed_torch()
    if cpu_torch and torch is None:
        print(f"installing PyTorch's CPU-only build (about 200 MB) from {CPU_INDEX} ...", flush=True)
        subprocess.check_call(pip + ["torch", "--index-url", CPU_INDEX], cwd=ROOT)
        torch = installed_torch()
    digest = hashlib.sha256(
        b"".join((ROOT / f).read_bytes() for f in ("requirements.txt", "pyproject.toml"))
    ).hexdigest()
    if STAMP.exists() and STAMP.read_text() == digest:
        return
    if torch is None:
        print(
            "installing torch from PyPI: on Linux that is the CUDA build, about 3-4 GB with its NVIDIA "
            "libraries (no GPU? stop with Ctrl-C and run again with --cpu-torch: about 200 MB)",
            flush=True,
        )
    else:
        print(f"keeping the installed torch {torch}", flush=True)
    print("installing the course's requirements (requirements.txt) into .venv/ ...", flush=True)
    subprocess.check_call(pip + ["-r", str(ROOT / "requirements.txt")], cwd=ROOT)
    subprocess.check_call(pip + ["--no-deps", "-e", str(ROOT)], cwd=ROOT)
    STAMP.write_text(digest)


def ensure_site_tools() -> None:
    """The optional `site` extra of pyproject.toml (Sphinx, MyST-NB ...), only for `site`."""
    stamp = VENV / ".mha-course-site-installed"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return
    print("installing the course website's tools (the `site` extra) into .venv/ ...", flush=True)
    pip = [str(PY), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    subprocess.check_call(pip + ["-e", f"{ROOT}[site]"], cwd=ROOT)
    stamp.write_text(digest)


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
    ensure_environment(cpu_torch=cpu_torch)
    env = dict(os.environ, PYTHONHASHSEED="0")
    if command == "lab":
        cmd = [str(PY), "-m", "jupyter", "lab", str(ROOT / "notebooks" / "00_setup_check.ipynb"), *rest]
        if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers and workshop VMs often run as root
            cmd.append("--allow-root")
    elif command == "site":
        ensure_site_tools()
        cmd = [str(PY), "-m", "authoring.site", *rest]
    else:
        cmd = [str(PY), "-m", "pytest", *(FAST if fast else []), *rest]
    return run_forwarding_signals(cmd, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
