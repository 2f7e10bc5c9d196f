"""Fixtures shared by tests/ and tests/browser/: the course website, built once per session."""

from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path

import pytest

SITE_TOOLS = ("sphinx", "myst_nb", "sphinx_book_theme")  # the `site` extra (pyproject.toml)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def site_dir(tmp_path_factory) -> Path:
    """The course website built from the repository into a temporary folder (as
    ``python3 course.py site`` builds _site/). Without the `site` extra the tests that need it
    skip, except in CI, where they fail."""
    missing = [name for name in SITE_TOOLS if importlib.util.find_spec(name) is None]
    if missing:
        reason = (
            "the course website needs the `site` extra: `python3 course.py site` installs it "
            f"(or pip install -e '.[site]'); missing: {', '.join(missing)}"
        )
        if in_ci():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    from authoring import site

    with warnings.catch_warnings():  # Sphinx's notices to its extensions' authors, not to us
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        return site.build(tmp_path_factory.mktemp("site") / "_site")


@pytest.fixture(scope="module")
def ranks():
    """Real gloo ranks for a test module's distributed tests: a group of 2 and a group of 4 (each
    started once per module, closed after it); a test runs its function with ``ranks[P].run(...)``."""
    from mha_course import distributed as md

    groups = {P: md.Ranks(P, timeout=60.0) for P in (2, 4)}
    yield groups
    for group in groups.values():
        group.close()


@pytest.fixture(autouse=True)
def _english_after_each_test():
    """A test that switches the course to Chinese (mc.set_language, a Chinese setup cell) leaves
    English behind for the next."""
    yield
    from mha_course import i18n

    i18n.set_language("en")
