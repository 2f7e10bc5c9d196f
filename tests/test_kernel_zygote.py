"""How the test session executes notebooks. Its kernels (authoring/kernel_zygote.py, started by
conftest.py): a kernel forked from the zygote is what a fresh one is, answers interrupts, ends
with its launcher, and a request the zygote must not serve gets an ordinary kernel. Its notebook
client (authoring.notebooks.notebook_client): a message whose wake-up was missed waits a slice,
not the cell's timeout."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from mha_course.distributed.launcher import _alive  # a zombie counts as ended

ZYGOTE_ENV = "MHA_KERNEL_ZYGOTE"  # conftest.ZYGOTE_ENV (the root conftest is not importable by name)

pytestmark = pytest.mark.slow  # starts kernels, or waits for seconds
needs_zygote = pytest.mark.skipif(
    os.environ.get(ZYGOTE_ENV, "").lower() in ("", "off"), reason="MHA_KERNEL_ZYGOTE=off: no zygote"
)

# what a notebook could observe of the process it runs in
OBSERVE = """
import json, os, sys, warnings
forked = "torch" in sys.modules
import torch, numpy, matplotlib, matplotlib.pyplot, ipywidgets  # the zygote's order, then ipywidgets
print(json.dumps({
    "forked": forked,
    "cwd": os.getcwd(),
    "path": sys.path,
    "backend": matplotlib.get_backend(),
    "hash": hash("attention"),
    "threads": torch.get_num_threads(),
    "filters": [(f[0], str(f[1]), f[2].__name__, str(f[3]), f[4]) for f in warnings.filters],
    "env": {k: v for k, v in os.environ.items() if k not in ("JPY_PARENT_PID", "PYTEST_CURRENT_TEST")},
    "executable": sys.executable,
    "main": sys.modules["__main__"].__name__,
    "stdin_tty": sys.stdin.isatty() if hasattr(sys.stdin, "isatty") else None,
}))
"""


def _wait_for_zygote(timeout: float = 60) -> None:
    path = Path(os.environ[ZYGOTE_ENV])
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"the zygote did not start within {timeout:.0f} s"
        time.sleep(0.1)


def _kernel(cwd: Path, env: dict | None = None):
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(cwd), env=env if env is not None else dict(os.environ))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    return km, kc


def _run(kc, code: str, timeout: float = 60) -> tuple[str, list[dict]]:
    """stdout of ``code`` and its error outputs (a request the kernel aborted fails here)."""
    stdout, errors = [], []

    def hook(msg):
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            stdout.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            errors.append(msg["content"])

    reply = kc.execute_interactive(code, output_hook=hook, timeout=timeout)
    assert reply["content"]["status"] != "aborted", f"the kernel aborted {code!r} (an earlier error)"
    return "".join(stdout), errors


def _observe(cwd: Path, env: dict | None = None) -> dict:
    import json

    km, kc = _kernel(cwd, env)
    try:
        out, errors = _run(kc, OBSERVE)
        assert not errors, errors
        return json.loads(out)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


@needs_zygote
def test_a_forked_kernel_sees_what_a_fresh_kernel_sees(tmp_path):
    _wait_for_zygote()
    forked = _observe(tmp_path)
    fresh = _observe(tmp_path, dict(os.environ, **{ZYGOTE_ENV: "off"}))
    assert forked.pop("forked") and not fresh.pop("forked")
    fresh["env"].pop(ZYGOTE_ENV)
    forked["env"].pop(ZYGOTE_ENV)
    assert forked == fresh
    assert forked["backend"].endswith("backend_inline")


@needs_zygote
def test_a_forked_kernel_is_interrupted_and_ends_with_its_launcher(tmp_path):
    _wait_for_zygote()
    km, kc = _kernel(tmp_path)
    try:
        out, _ = _run(kc, "import os, sys; print(os.getpid(), 'torch' in sys.modules)")
        pid, forked = out.split()
        assert forked == "True" and int(pid) != km.provisioner.process.pid
        # stop_on_error=False: after an error ipykernel aborts the requests that reach it in the
        # same turn of its event loop (a Run All stops there); the next request could be one
        sleeping = kc.execute("import time; time.sleep(60)", stop_on_error=False)
        time.sleep(0.5)
        started = time.monotonic()
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=20)
        assert reply["parent_header"]["msg_id"] == sleeping
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        assert time.monotonic() - started < 20
        out, _ = _run(kc, "print('still here')")
        assert out.strip() == "still here"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    assert not km.is_alive()
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid), 0)


@needs_zygote
def test_a_killed_launcher_takes_its_kernel_and_what_it_started_with_it(tmp_path):
    _wait_for_zygote()
    km, kc = _kernel(tmp_path)
    try:
        out, _ = _run(
            kc, "import os, subprocess; child = subprocess.Popen(['sleep', '60']); print(os.getpid(), child.pid)"
        )
        pids = [int(p) for p in out.split()]
        os.kill(km.provisioner.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while alive := [p for p in pids if _alive(p)]:
            assert time.monotonic() < deadline, f"{alive} outlived the launcher (kernel, then its child)"
            time.sleep(0.05)
    finally:
        kc.stop_channels()
        km.cleanup_resources()


@needs_zygote
def test_a_request_with_other_import_time_settings_gets_an_ordinary_kernel(tmp_path):
    """One fresh kernel for one changed variable; the zygote's refusal (what makes the launcher
    start an ordinary kernel) for the others, asked directly."""
    import socket

    _wait_for_zygote()
    seen = _observe(tmp_path, dict(os.environ, OMP_NUM_THREADS="3"))
    assert not seen["forked"] and seen["env"]["OMP_NUM_THREADS"] == "3"
    kz = _kernel_zygote()
    variables = ("PYTHONHASHSEED", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "HOME")
    for variable in variables:
        value = os.environ.get(variable, "") + "-changed"  # differs from this session's, whatever it is
        request = {"argv0": kz.__file__, "argv": [], "env": dict(os.environ, **{variable: value}), "cwd": str(tmp_path)}
        for executable in (kz.sys.executable, "/usr/bin/python-other"):
            with socket.socket(socket.AF_UNIX) as conn, open(os.devnull) as null:
                conn.connect(os.environ[ZYGOTE_ENV])
                kz._send(conn, dict(request, executable=executable), fds=[null.fileno()] * 3)
                reply, _ = kz._receive(conn)
            assert "refused" in reply and "pid" not in reply, (variable, executable, reply)
            assert (variable if executable == kz.sys.executable else "another interpreter") in reply["refused"]


@needs_zygote
def test_a_process_that_has_compiled_still_gets_forked_kernels(tmp_path):
    """PyTorch writes TORCHINDUCTOR_CACHE_DIR into os.environ on its first compile (flex_attention
    in a unit test, say); it is read only when compiling, so it does not make kernels ordinary."""
    _wait_for_zygote()
    cache = str(tmp_path / "inductor")
    seen = _observe(tmp_path, dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache))
    assert seen["forked"] and seen["env"]["TORCHINDUCTOR_CACHE_DIR"] == cache


def _kernel_zygote():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "authoring" / "kernel_zygote.py"
    spec = importlib.util.spec_from_file_location("kernel_zygote", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_alone(coroutine):
    """asyncio.run in a thread of its own (Playwright's sync API, used by the browser tests, keeps
    an event loop running in a worker's main thread)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


class _MissedWakeUpSocket:
    """A socket whose asyncio poll never wakes for the message already in it: only the poll's own
    timeout, which ends with a real look at the socket (as pyzmq's does), finds it."""

    def __init__(self):
        self.polls = []

    async def poll(self, timeout_ms):
        import asyncio

        self.polls.append(timeout_ms)
        await asyncio.sleep(timeout_ms / 1000)
        return 1


@pytest.mark.parametrize("timeout", [300, None])
def test_a_notebook_client_sees_a_message_whose_wake_up_was_missed_within_a_slice(timeout):
    """nbclient once saw a finished cell's reply only when the cell's 300 s timeout ran out (pyzmq's
    asyncio poll missed the wake-up); the course's client polls in slices of POLL_SLICE_S."""

    from authoring import notebooks as notebook_tools

    channel_class = notebook_tools._sliced_kernel_manager()().client().shell_channel_class
    channel = channel_class.__new__(channel_class)
    channel.socket = _MissedWakeUpSocket()

    async def receive():
        return {"msg_type": "execute_reply"}

    channel._recv = receive
    started = time.monotonic()
    assert _run_alone(channel.get_msg(timeout=timeout)) == {"msg_type": "execute_reply"}
    assert time.monotonic() - started < 5 * notebook_tools.POLL_SLICE_S
    assert channel.socket.polls == [int(notebook_tools.POLL_SLICE_S * 1000)]


def test_a_notebook_client_still_times_out():
    from queue import Empty

    from authoring import notebooks as notebook_tools

    channel_class = notebook_tools._sliced_kernel_manager()().client().shell_channel_class
    channel = channel_class.__new__(channel_class)

    class Silent(_MissedWakeUpSocket):
        async def poll(self, timeout_ms):
            await super().poll(timeout_ms)
            return 0

    channel.socket = Silent()
    with pytest.raises(Empty):
        _run_alone(channel.get_msg(timeout=1.5))
    assert sum(channel.socket.polls) == pytest.approx(1500, abs=20) and len(channel.socket.polls) == 2


def test_every_notebook_execution_in_the_repository_uses_the_sliced_client():
    root = Path(__file__).resolve().parents[1]
    bare = [
        str(p.relative_to(root))
        for folder in ("tests", "authoring", "mha_course")
        for p in (root / folder).rglob("*.py")
        if "NotebookClient" + "(" in p.read_text(encoding="utf-8") and p.name != "notebooks.py"
    ]
    assert not bare, f"use authoring.notebooks.notebook_client instead of NotebookClient in {bare}"
