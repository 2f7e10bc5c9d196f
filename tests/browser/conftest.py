"""Fixtures for the browser end-to-end tests: one JupyterLab server and one headless Chromium
for the whole session.

The server runs on 127.0.0.1 (a free port, a random token) with throwaway config, data, runtime,
settings and workspace folders, and serves a temporary COPY of the student edition (what a
learner opens), so JupyterLab's autosave never touches the repository. Its kernels are the
current interpreter's, where ``mha_course`` is installed (editable), exactly as a learner's
``python3 course.py lab``.

Chromium is Debian's (``apt-get install chromium``), driven by Playwright for Python, which cannot
download a browser of its own here: set ``MHA_CHROMIUM`` to use another binary. Without Chromium
or Playwright these tests skip with the reason, except in CI (``CI=true``), where they fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from authoring import notebooks as notebook_tools
from authoring import student_edition

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"

# Debian's Chromium as root in a container with no network: no sandbox, no GPU, no QUIC, no
# background requests (they would be refused one by one). Playwright adds --headless itself and
# gives each launch a fresh, empty --user-data-dir (it refuses one passed in these arguments).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _unavailable(reason: str):
    """Skip locally; fail in CI, where .ci/run installs Chromium and Playwright."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"browser tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(f"browser tests need {reason}")


def chromium_path() -> str | None:
    for candidate in (os.environ.get("MHA_CHROMIUM"), "chromium", "chromium-browser", "/usr/bin/chromium"):
        if candidate and (found := shutil.which(candidate)):
            return found
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """A JupyterLab server on loopback serving copies of the notebooks."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.work = tmp / "notebooks"  # what the server serves: copies, never the repository
        self.work.mkdir()
        for path in notebook_tools.numbered_notebooks():
            shutil.copy2(student_edition.STUDENT_DIR / path.name, self.work / path.name)
        self.port = _free_port()
        self.token = secrets.token_hex(24)
        self.base = f"http://127.0.0.1:{self.port}"
        config = tmp / "config"
        config.mkdir()
        server = {
            "ServerApp": {
                "ip": "127.0.0.1",
                "port": self.port,
                "port_retries": 0,
                "open_browser": False,
                "allow_root": True,  # CI runs as root
                "root_dir": str(self.work),
            },
            "IdentityProvider": {"token": self.token},
            "LabApp": {
                # window.jupyterapp: the tests open each notebook in the running app (one page
                # load of JupyterLab for all of them, as Galata, JupyterLab's own test tool, does)
                "expose_app_in_browser": True,
                "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
                "news_url": None,
                "extension_manager": "readonly",
            },
        }
        (config / "jupyter_server_config.json").write_text(json.dumps(server, indent=1))
        settings = tmp / "lab-settings"
        self._setting(
            settings,
            "notebook-extension/tracker",
            # every cell in the DOM (no virtual scrolling), and no "Select Kernel" dialog
            {"windowingMode": "none", "autoStartDefaultKernel": True},
        )
        self._setting(settings, "apputils-extension/notification", {"fetchNews": "false", "checkForUpdates": False})
        self.env = dict(
            os.environ,
            JUPYTER_CONFIG_DIR=str(config),
            JUPYTER_DATA_DIR=str(tmp / "data"),
            JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
            JUPYTERLAB_SETTINGS_DIR=str(settings),
            JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
            IPYTHONDIR=str(tmp / "ipython"),
            **notebook_tools.EXEC_ENV,
        )
        self.log_path = tmp / "jupyterlab.log"
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def _setting(folder: Path, plugin: str, values: dict) -> None:
        path = folder / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))

    def start(self, timeout: float = 120) -> None:
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "jupyter", "lab"],
                cwd=self.work,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                self.api("GET", "/api/status")
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.3)
        raise RuntimeError(f"JupyterLab did not answer within {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def api(self, method: str, path: str):
        request = urllib.request.Request(
            f"{self.base}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def url(self) -> str:
        """JupyterLab in a fresh workspace, nothing open (the tests open each notebook in it)."""
        return f"{self.base}/lab?token={self.token}&reset"

    def wait_for_kernel(self, notebook: str, timeout: float = 120) -> None:
        """Until the notebook's kernel is started, connected to the page and idle. (Run All sent
        before that is partly lost: cells stay unrun.)"""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for session in self.api("GET", "/api/sessions") or []:
                kernel = session.get("kernel") or {}
                if session.get("path", "").endswith(notebook) and kernel.get("connections", 0) >= 1:
                    if kernel.get("execution_state") == "idle":
                        return
            time.sleep(0.3)
        raise TimeoutError(f"the kernel of {notebook} was not ready within {timeout:.0f} s")

    def shutdown_kernels(self) -> None:
        """End every session (and its kernel), so one notebook's kernel never slows the next."""
        try:
            for session in self.api("GET", "/api/sessions") or []:
                self.api("DELETE", f"/api/sessions/{session['id']}")
        except (urllib.error.URLError, OSError) as e:  # never hide the test's own failure
            print(f"could not shut down the kernels: {e}")


def missing() -> str | None:
    """What the browser tests lack here (None: nothing)."""
    if importlib.util.find_spec("playwright") is None:
        return "Playwright for Python (pip install playwright)"
    if chromium_path() is None:
        return "Chromium (apt-get install chromium, or set MHA_CHROMIUM)"
    return None


@pytest.fixture(scope="session")
def chromium_executable() -> str:
    if (lacking := missing()) is not None:
        _unavailable(lacking)
    return chromium_path()


STUDENT_RUN = "tests/test_student_edition.py::test_student_notebook_runs_top_to_bottom["
LAB_RUN = "tests/browser/test_jupyterlab.py::test_notebook_runs_and_its_widgets_work["


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected: only a JupyterLab run that stays counts
def pytest_collection_modifyitems(config, items):
    """One execution per English student notebook: where this session runs it in JupyterLab (its
    test is selected and the browser is here), that run makes the checks of the student edition's
    run too (tests/student_run.py, and the explorers' spy), so the kernel-only run of the same
    notebook is deselected. Without a browser, or with the browser tests deselected (`-m "not
    browser"`, .ci/matrix, `python -m authoring emulate`), the kernel-only runs stay."""
    if missing() is not None:
        return
    in_lab = {item.nodeid[len(LAB_RUN) : -1] for item in items if item.nodeid.startswith(LAB_RUN)}
    twice = [i for i in items if i.nodeid.startswith(STUDENT_RUN) and i.nodeid[len(STUDENT_RUN) : -1] in in_lab]
    if twice:
        config.hook.pytest_deselected(items=twice)
        dropped = {id(i) for i in twice}
        items[:] = [i for i in items if id(i) not in dropped]


@pytest.fixture(scope="session")
def lab(tmp_path_factory, chromium_executable):
    server = Lab(tmp_path_factory.mktemp("jupyterlab"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def browser(chromium_executable):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=chromium_executable, args=CHROMIUM_ARGS)
        yield instance
        instance.close()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    """tests/browser/screenshots/ (git-ignored; CI keeps it), its screenshots removed once per
    session; subfolders (site/, the website's test, which may run at the same time) are left."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for old in SCREENSHOTS.glob("*.png"):
        old.unlink()
    return SCREENSHOTS
