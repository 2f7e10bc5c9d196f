"""Notebook set-up: fixed seeds and display defaults, and a report of the environment."""

from __future__ import annotations

import os
import platform
import random
import sys

import torch


def setup(seed: int = 0, *, precision: int = 4) -> None:
    """Make a notebook deterministic and readable: seed Python, NumPy and torch, set torch's
    print precision, and matplotlib defaults (PNG figures of modest size, no date metadata)."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
        np.set_printoptions(precision=precision, suppress=True)
    except ImportError:  # numpy is a dependency of matplotlib; tolerate its absence anyway
        pass
    torch.set_printoptions(precision=precision, sci_mode=False)
    import matplotlib

    matplotlib.rcParams.update(
        {"figure.dpi": 80, "savefig.dpi": 80, "figure.figsize": (6.4, 4.0), "axes.titlesize": "medium"}
    )
    try:  # inline backend: PNG only (nbval does not compare PNG bytes)
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("png")
    except ImportError:
        pass


def environment_report() -> dict[str, str]:
    """Versions and hardware that decide whether and how fast the course runs here."""
    import importlib.metadata as md

    def version(pkg):
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return "not installed"

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(terse=True),
        "torch": torch.__version__,
        "numpy": version("numpy"),
        "matplotlib": version("matplotlib"),
        "ipywidgets": version("ipywidgets"),
        "mha_course": version("mha-course"),
        "torch threads": str(torch.get_num_threads()),
        "CPU cores": str(os.cpu_count()),
        "CUDA available": str(torch.cuda.is_available()),
    }
