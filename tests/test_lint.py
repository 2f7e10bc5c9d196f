"""Lint as a test: ``ruff check`` and ``ruff format --check`` over the package, the tests, the
notebooks and the entry scripts, with the settings in pyproject.toml, so that the README's test
command (``python3 course.py test``) fails on unformatted or sloppy code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ["mha_course", "authoring", "tests", "notebooks", "docs", "course.py", "conftest.py"]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache", *TARGETS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("args", [("check",), ("format", "--check")], ids=["ruff check", "ruff format --check"])
def test_ruff(args):
    result = ruff(*args)
    assert result.returncode == 0, (
        f"`ruff {' '.join(args)}` found problems (fix: `ruff check --fix` / `ruff format`):\n"
        + (result.stdout + result.stderr)[-6000:]
    )
