"""Root pytest configuration: the environment every notebook kernel inherits.

Notebook kernels started by nbval (and by the student-edition tests) inherit os.environ, so the
settings that make notebooks deterministic are made here, once, for every way the tests run.
"""

import atexit
import os
import shutil
import tempfile

import pytest

# xdist runs the suite in N worker processes at once: each worker (and each notebook kernel it
# starts, which inherits this) gets its share of the cores for PyTorch's threads, instead of every
# process starting one thread per core and all of them contending for the same cores. Set before
# torch is imported; a value already set (or a run without xdist) is left alone.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _share = (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _share)))

from authoring.notebooks import EXEC_ENV  # noqa: E402
from mha_course.kit import run_cache  # noqa: E402

os.environ.update(EXEC_ENV)

# One folder per test session for the training runs that several executions of a notebook share
# (mha_course.kit.run_cache): made by the process that starts the session, inherited by its xdist
# workers, by every notebook kernel and by JupyterLab. Only notebook executions see it: the unit
# tests run without it (see _run_cache_only_for_notebook_executions), so a test that calls a
# training function twice still computes twice.
if run_cache.ENV not in os.environ:
    os.environ[run_cache.ENV] = tempfile.mkdtemp(prefix="mha-course-runs-")
    atexit.register(shutil.rmtree, os.environ[run_cache.ENV], ignore_errors=True)

# nbval waits a fixed 5 s for a cell's outputs after the kernel has replied. On a loaded 2-core
# machine the kernel can take longer than that to publish them after a long cell (notebook 07's
# training cell once failed this way with nothing wrong in it), so each notebook cell waits up to a
# minute; the cell's own run time is still bounded by --nbval-cell-timeout.
NBVAL_OUTPUT_TIMEOUT_S = 60


# How xdist shares the suite between its workers (--dist loadscope, in pyproject.toml, with the
# scheduler below). A scope runs on one worker from start to end: a test file's tests by default,
# so that its module fixtures (gloo ranks) start once; a notebook's nbval cells, which share one
# kernel; the website's two test files, which share one build. Each run of a whole notebook outside
# nbval (tests marked executes_notebooks, except the browser's, which share one JupyterLab) is a
# scope of its own, so those long runs spread over both workers.
SHARED_SCOPES = {"tests/test_site.py": "site", "tests/browser/test_site_in_browser.py": "site"}
#: (file, test function): each of its parametrized runs is a scope of its own
SPREAD = {
    ("tests/test_student_edition.py", "test_student_notebook_runs_top_to_bottom"),
    ("tests/test_widgets_compat.py", "test_explorers_redraw_on_every_control"),
}


def scope_of(nodeid: str) -> str:
    """The xdist scope of a test id (the scheduler sees ids only, not marks)."""
    path, _, rest = nodeid.partition("::")
    if (path, rest.split("[")[0]) in SPREAD:
        return nodeid
    return SHARED_SCOPES.get(path, path)


def _tier(item) -> int:
    """Scopes start in this order (the scheduler keeps the collection's order):
    0. the English notebooks under nbval: the first execution of each notebook, which computes
       the training runs the later ones reuse (mha_course.kit.run_cache);
    1. the long single scopes (JupyterLab in a browser, the class end to end, the website), early
       so that no worker is left with one of them at the end;
    2. the other executions of whole notebooks (the Chinese edition, the student edition, the
       explorers' driver);
    3. everything else: many short unit tests, which fill the workers evenly to the end."""
    path = item.nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        return 2 if "/zh/" in path else 0
    if item.get_closest_marker("browser") or path in ("tests/test_nbgrader.py", *SHARED_SCOPES):
        return 1
    return 2 if item.get_closest_marker("executes_notebooks") else 3


def pytest_collection_modifyitems(config, items):
    for item in items:
        if hasattr(item, "output_timeout"):  # nbval's notebook-cell items
            item.output_timeout = NBVAL_OUTPUT_TIMEOUT_S
        if item.get_closest_marker("executes_notebooks") and not item.get_closest_marker("browser"):
            test = (item.nodeid.split("::")[0], getattr(item, "originalname", item.name))
            if test not in SPREAD:
                raise pytest.UsageError(f"{test}: a notebook-executing test belongs in conftest.SPREAD")
    items.sort(key=_tier)  # stable: within a tier, the collection's order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadscope with the scopes of :func:`scope_of`, in the collection's order."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class CourseScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return CourseScheduling(config, log)


@pytest.fixture(autouse=True)
def _run_cache_only_for_notebook_executions(request, monkeypatch):
    """The session's run cache is seen by notebook executions (nbval's kernels, and the tests
    marked ``executes_notebooks``); every other test runs without it."""
    if request.node.get_closest_marker("executes_notebooks") is None:
        monkeypatch.delenv(run_cache.ENV, raising=False)
