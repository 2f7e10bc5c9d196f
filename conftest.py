"""Root pytest configuration: the environment every notebook kernel inherits.

Notebook kernels started by nbval (and by the student-edition tests) inherit os.environ, so the
settings that make notebooks deterministic are made here, once, for every way the tests run.
"""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

# xdist runs the suite in N worker processes at once: each worker (and each notebook kernel it
# starts, which inherits this) gets its share of the cores for PyTorch's threads, instead of every
# process starting one thread per core and all of them contending for the same cores. Set before
# torch is imported; a value already set (or a run without xdist) is left alone.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _share = (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _share)))

# With PYTHONDONTWRITEBYTECODE set (as on some machines), every test process would compile the
# course's sources, and pytest rewrite every test module's asserts, again on each run, and every
# kernel would compile what it imports. The test processes write the bytecode (to the git-ignored
# __pycache__ folders); the kernels, which keep the variable, read it.
sys.dont_write_bytecode = False

from authoring.notebooks import EXEC_ENV  # noqa: E402

#: mha_course.kit.run_cache.ENV (named here: importing the package would import torch into the
#: process that only hands tests to xdist's workers, on the suite's critical path)
RUN_CACHE_ENV = "MHA_COURSE_RUN_CACHE"

os.environ.update(EXEC_ENV)

# One folder per test session for the training runs that several executions of a notebook share
# (mha_course.kit.run_cache): made by the process that starts the session, inherited by its xdist
# workers, by every notebook kernel and by JupyterLab. Only notebook executions see it: the unit
# tests run without it (see _run_cache_only_for_notebook_executions), so a test that calls a
# training function twice still computes twice.
if RUN_CACHE_ENV not in os.environ:
    os.environ[RUN_CACHE_ENV] = tempfile.mkdtemp(prefix="mha-course-runs-")
    atexit.register(shutil.rmtree, os.environ[RUN_CACHE_ENV], ignore_errors=True)

# The notebooks' timings (mha_course.kit.timing; their outputs are nbval-ignore-output, never
# compared) take one timed round of single calls in the session's kernels (the kernelspec's env):
# that the timed code runs is what a test run can check, not how fast it is on a loaded machine.
# The tests' own processes time as asked, and `authoring execute`, which stores the outputs, times
# as many rounds as each notebook asks.
TIMING_ROUNDS_ENV = "MHA_COURSE_TIMING_ROUNDS"  # mha_course.kit.timing.ROUNDS_VARIABLE

# Every notebook kernel of the session starts as a fork of a process that has already imported
# PyTorch, Matplotlib and ipykernel (authoring/kernel_zygote.py), one per test process: the
# ``python3`` kernelspec first on JUPYTER_PATH (nbval's, nbclient's, JupyterLab's, nbgrader's
# kernels) starts kernels through its launcher, which falls back to an ordinary kernel whenever
# a forked one would not be what a fresh one is. MHA_KERNEL_ZYGOTE=off: ordinary kernels only.
ZYGOTE_ENV = "MHA_KERNEL_ZYGOTE"
ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "authoring", "kernel_zygote.py")


def _kernel_zygote_module():
    sys.path.insert(0, os.path.dirname(ZYGOTE))
    try:
        import kernel_zygote
    finally:
        sys.path.pop(0)
    return kernel_zygote


def _kernelspec_first_on_jupyter_path() -> None:
    """Every kernel this test process starts goes through the launcher (an ordinary kernel when
    no zygote runs): the kernelspec nbval, nbclient, JupyterLab and nbgrader find first."""
    folder = tempfile.mkdtemp(prefix="mha-course-kernels-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    _kernel_zygote_module().kernelspec(folder, env={TIMING_ROUNDS_ENV: os.environ.get(TIMING_ROUNDS_ENV, "1")})
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [folder, os.environ.get("JUPYTER_PATH")]))
    os.environ.setdefault(ZYGOTE_ENV, os.path.join(folder, "zygote.sock"))


def _start_kernel_zygote() -> None:
    socket = os.environ[ZYGOTE_ENV]
    if socket.lower() == "off" or os.path.exists(socket) or not hasattr(os, "fork"):  # Windows: no fork
        return
    with open(socket + ".log", "w") as log:
        zygote = subprocess.Popen(
            [sys.executable, ZYGOTE, "serve", socket],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    atexit.register(zygote.terminate)


def _runs_kernels(items) -> bool:
    return any(
        item.nodeid.split("::")[0].endswith(".ipynb")
        or item.get_closest_marker("slow")
        or item.get_closest_marker("browser")
        for item in items
    )


def pytest_collection_finish(session):
    """After -m and -k have deselected: a zygote only where kernels will start (not `test --fast`)."""
    if os.environ.get(ZYGOTE_ENV) and _runs_kernels(session.items):  # set: not xdist's controller
        _start_kernel_zygote()


def pytest_configure(config):
    controller = not hasattr(config, "workerinput") and config.getoption("dist", "no") != "no"
    if not controller:  # xdist's controller runs no test
        _kernelspec_first_on_jupyter_path()


# nbval waits a fixed 5 s for a cell's outputs after the kernel has replied. On a loaded 2-core
# machine the kernel can take longer than that to publish them after a long cell (notebook 07's
# training cell once failed this way with nothing wrong in it), so each notebook cell waits up to a
# minute; the cell's own run time is still bounded by --nbval-cell-timeout.
NBVAL_OUTPUT_TIMEOUT_S = 60


# How xdist shares the suite between its workers (--dist loadscope, in pyproject.toml, with the
# scheduler below). A scope runs on one worker from start to end. Scopes of several tests: a
# notebook's nbval cells, which share one kernel; a test file whose tests share a module fixture
# (or the gloo ranks the ring checker keeps per process), so it starts once; the website's two
# test files, which share one build. Every other test is a scope of its own, so the workers
# share the work evenly to the last test; the runs of whole notebooks (tests marked
# executes_notebooks) spread over both workers, except the browser's, which share one JupyterLab.
SHARED_SCOPES = {"tests/test_site.py": "site", "tests/browser/test_site_in_browser.py": "site"}
#: test files run whole by one worker: their module fixtures (checked at collection), a process's
#: gloo ranks (tests/test_check_distributed.py), one JupyterLab (tests/browser/test_jupyterlab.py)
GROUPED_FILES = {
    "tests/browser/test_jupyterlab.py",
    "tests/test_bench.py",
    "tests/test_check_distributed.py",
    "tests/test_class_commands.py",
    "tests/test_colab_setup.py",
    "tests/test_distributed.py",
    "tests/test_distributed_backward.py",
    "tests/test_fairness.py",
    "tests/test_pretrained.py",
}


def scope_of(nodeid: str) -> str:
    """The xdist scope of a test id (the scheduler sees ids only, not marks or fixtures)."""
    path = nodeid.split("::")[0]
    if path.endswith(".ipynb") or path in GROUPED_FILES:
        return path
    return SHARED_SCOPES.get(path, nodeid)


def _check_grouping(item) -> None:
    """A test with a module fixture outside GROUPED_FILES would set it up again on each worker,
    and again whenever its worker came back to the file: a usage error, named."""
    path = item.nodeid.split("::")[0]
    if path in GROUPED_FILES or path in SHARED_SCOPES or not hasattr(item, "_fixtureinfo"):
        return
    for name, defs in item._fixtureinfo.name2fixturedefs.items():
        if defs and defs[-1].scope in ("module", "class", "package"):
            raise pytest.UsageError(
                f"{path} uses the {defs[-1].scope} fixture {name!r}: add it to conftest.GROUPED_FILES"
            )


def _tier(item) -> int:
    """Scopes start in this order (the scheduler keeps the collection's order):
    0. the English notebooks under nbval: the first execution of each notebook, which computes
       the training runs the later ones reuse (mha_course.kit.run_cache);
    1. the long single scopes (JupyterLab in a browser, the class end to end, the website), early
       so that no worker is left with one of them at the end;
    2. the other executions of whole notebooks (the Chinese edition, the student edition, which
       also drives the explorers);
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
        _check_grouping(item)
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
        monkeypatch.delenv(RUN_CACHE_ENV, raising=False)
