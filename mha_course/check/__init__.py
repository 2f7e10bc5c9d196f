"""Exercise checkers: ``mc.check.<exercise>(fn) -> CheckResult`` (filled in by check modules)."""

from ._core import CheckResult  # noqa: F401
