#!/usr/bin/env python3
"""One entry point for learners, instructors and CI (standard library only).

    python3 course.py lab    install everything into .venv/ and open the course in JupyterLab
    python3 course.py test   install everything into .venv/ and run the whole test suite
    python3 course.py site   also install the website's tools (the `site` extra) and build _site/

Both create the virtual environment .venv/ next to this file on first use and (re)install the
requirements whenever requirements.txt or pyproject.toml change. Extra arguments after `test`
go to pytest (e.g. `python3 course.py test -k masks`).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".mha-course-installed"


def ensure_environment() -> None:
    if sys.version_info < (3, 10):  # noqa: UP036 (this script may be started by an older python3)
        sys.exit(f"mha-course needs Python >= 3.10, this is {sys.version.split()[0]}")
    if not PY.exists():
        print(f"creating {VENV} ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    digest = hashlib.sha256(
        b"".join((ROOT / f).read_bytes() for f in ("requirements.txt", "pyproject.toml"))
    ).hexdigest()
    if STAMP.exists() and STAMP.read_text() == digest:
        return
    print("installing the course's requirements into .venv/ ...", flush=True)
    pip = [str(PY), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
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


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("lab", "test", "site"):
        print(__doc__)
        return 2
    ensure_environment()
    env = dict(os.environ, PYTHONHASHSEED="0")
    if argv[0] == "lab":
        cmd = [str(PY), "-m", "jupyter", "lab", str(ROOT / "notebooks" / "00_setup_check.ipynb"), *argv[1:]]
        if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers and workshop VMs often run as root
            cmd.append("--allow-root")
    elif argv[0] == "site":
        ensure_site_tools()
        cmd = [str(PY), "-m", "authoring.site", *argv[1:]]
    else:
        cmd = [str(PY), "-m", "pytest", *argv[1:]]
    return subprocess.call(cmd, cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
