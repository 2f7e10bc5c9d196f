"""How long the test suite takes, and where the time goes.

    python -m authoring suite-times [PYTEST ARGS]       the whole suite (as `python3 course.py test`)
    python -m authoring suite-times --top 10 tests/test_masks.py -n 0

runs pytest with a JUnit XML report, then prints the run's wall time, the summed time of its
tests (more than the wall time when xdist runs them in parallel) and the slowest tests (20 unless
``--top`` says otherwise), slowest first. A notebook under strict nbval counts as one test: the sum
of its cells. Pytest's exit status is this command's.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from .notebooks import EXEC_ENV, ROOT


def read_junit(path: Path) -> dict[str, float]:
    """test id -> seconds, from a JUnit XML report; a notebook's cells (nbval) are summed into one entry."""
    times: dict[str, float] = collections.defaultdict(float)
    for case in ET.parse(path).getroot().iter("testcase"):
        file, name = case.get("file") or case.get("classname", ""), case.get("name", "")
        if name.startswith("Cell "):  # nbval: one test case per cell, the notebook is the test
            key = case.get("classname", file)
        else:
            key = f"{case.get('classname', '')}::{name}"
        times[key] += float(case.get("time") or 0)
    return dict(times)


def slowest(times: dict[str, float], top: int = 20) -> list[tuple[str, float]]:
    return sorted(times.items(), key=lambda item: (-item[1], item[0]))[:top]


def report(times: dict[str, float], wall: float, top: int = 20) -> str:
    lines = [
        f"{len(times)} tests in {wall:.1f} s wall time ({sum(times.values()):.1f} s summed over the tests)",
        f"the {min(top, len(times))} slowest:",
    ]
    lines += [f"  {seconds:8.2f} s  {name}" for name, seconds in slowest(times, top)]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m authoring suite-times", description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=20, help="how many of the slowest tests to list (20)")
    args, pytest_args = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", f"--junitxml={junit}", "-o", "junit_family=xunit1", *pytest_args]
        start = time.monotonic()
        code = subprocess.call(cmd, cwd=ROOT, env=dict(os.environ, **EXEC_ENV))
        wall = time.monotonic() - start
        if not junit.exists():
            print(f"suite-times: pytest wrote no report (exit {code})")
            return code or 1
        print()
        print(report(read_junit(junit), wall, args.top))
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
