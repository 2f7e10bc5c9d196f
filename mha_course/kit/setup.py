"""Notebook set-up: fixed seeds and display defaults, and a report of the environment."""

from __future__ import annotations

import os
import platform
import random
import sys

import torch


def setup(seed: int = 0, *, precision: int = 4, language: str | None = None) -> None:
    """Make a notebook deterministic and readable: seed Python, NumPy and torch, set torch's
    print precision, and matplotlib defaults (PNG figures of modest size, no date metadata).
    ``language="zh"`` (the Chinese notebooks' setup) makes the course speak Chinese
    (:func:`mha_course.set_language`) and its figures draw Chinese with the font the course ships."""
    from .. import i18n

    if language is not None:
        i18n.set_language(language)
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
    if i18n.language() == "zh":
        from . import plotting

        plotting.use_cjk_font()
    try:  # inline backend: PNG only (nbval does not compare PNG bytes)
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("png")
    except ImportError:
        pass


def device() -> torch.device:
    """The best device this machine offers: CUDA if available, else Apple's MPS, else the CPU.

    The notebooks run on the CPU (their stored outputs are CPU outputs); use this where you want
    your own experiments on an accelerator: ``x = x.to(mc.device())``."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


#: environment variable that moves the notebooks' timing sections (04, 06, 09) to another device
TIMING_DEVICE_VARIABLE = "MHA_COURSE_TIMING_DEVICE"


def timing_device() -> torch.device:
    """Where the notebooks' timing sections run: the CPU unless the environment variable
    ``MHA_COURSE_TIMING_DEVICE`` names a device ("cuda", "mps", or "auto" for :func:`device`).
    Only timings move: every other output of the notebooks is the CPU's."""
    wanted = os.environ.get(TIMING_DEVICE_VARIABLE, "cpu").strip().lower() or "cpu"
    chosen = device() if wanted == "auto" else torch.device(wanted)
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{TIMING_DEVICE_VARIABLE}={wanted!r}, but torch sees no CUDA device here")
    return chosen


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
