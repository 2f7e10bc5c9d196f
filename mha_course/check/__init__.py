"""Exercise checkers: ``mc.check.<exercise>(fn) -> CheckResult``, displayed as one line.

Each checker runs your function on a few fixed random inputs of several shapes, compares with
the course's reference and, when something is off, names the likely mistake. It never raises
because of your code and never shows the reference code.

Checkers are discovered automatically: every module ``mha_course/check/<topic>.py`` (name not
starting with ``_``) is imported and each name in its ``__all__`` becomes ``mc.check.<name>``.
See ``mha_course/check/_core.py`` for how to write one. ``available()`` lists them.
"""

from __future__ import annotations

import importlib
import pkgutil

from ._core import CheckResult

__all__ = ["CheckResult", "available"]
_ORIGIN: dict[str, str] = {}


def _discover() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for name in getattr(module, "__all__", ()):
            if name in _ORIGIN or name in __all__:
                where = _ORIGIN.get(name, "mha_course.check")
                raise ImportError(f"checker name {name!r} in {module.__name__} is already defined by {where}")
            globals()[name] = getattr(module, name)
            _ORIGIN[name] = module.__name__
            __all__.append(name)


def available() -> list[str]:
    """Names of all checkers, sorted (``mc.check.<name>(fn)``)."""
    return sorted(_ORIGIN)


_discover()
