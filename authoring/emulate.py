"""Run strict nbval over the notebooks as another CPU would: same machine, other kernels.

    python -m authoring emulate                     every setting below, every solved notebook
    python -m authoring emulate avx2 [PYTEST ARGS]  one setting (extra arguments go to pytest)

Stored outputs must hold on any CPU. PyTorch picks its vectorised kernels (softmax, reductions,
elementwise ops) by the CPU's instruction set, and MKL picks its matrix-multiply kernels the same
way; the two environment variables below force a smaller instruction set, so the last bits of
every float computation change the way they do on another machine. A notebook whose printed
numbers survive every setting prints what is stable, not what one CPU happened to compute.

The student edition's execution test (tests/test_student_edition.py) runs under the same setting.
"""

from __future__ import annotations

import os
import subprocess
import sys

from .notebooks import EXEC_ENV, ROOT

#: name -> environment: the machine each setting stands for
SETTINGS: dict[str, dict[str, str]] = {
    # an AVX2 machine (e.g. AMD EPYC or a laptop without AVX-512): PyTorch's AVX2 kernels, MKL's AVX2 GEMM
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    # no vector extensions in PyTorch's own kernels, SSE4.2 GEMM in MKL (an old or emulated CPU)
    "default": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}


def command(setting: str, extra: list[str]) -> tuple[list[str], dict[str, str]]:
    """The pytest command and environment of one setting."""
    env = dict(os.environ, **EXEC_ENV, **SETTINGS[setting])
    tests = ["notebooks", "tests/test_student_edition.py::test_student_notebook_runs_top_to_bottom"]
    return [sys.executable, "-m", "pytest", *tests, *extra], env


def main(argv: list[str]) -> int:
    names = [a for a in argv if a in SETTINGS] or list(SETTINGS)
    extra = [a for a in argv if a not in SETTINGS]
    worst = 0
    for name in names:
        cmd, env = command(name, extra)
        shown = " ".join(f"{k}={v}" for k, v in SETTINGS[name].items())
        print(f"== emulating {name}: {shown}", flush=True)
        worst = max(worst, subprocess.call(cmd, cwd=ROOT, env=env))
    return worst
