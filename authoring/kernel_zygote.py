"""Notebook kernels forked from a process that has already imported what every course notebook
imports (PyTorch, NumPy, Matplotlib, ipykernel), so that the test suite's many
executions of whole notebooks do not each spend seconds importing the same modules.

The test session (the root conftest.py) starts one zygote per test process and puts a ``python3``
kernelspec first on JUPYTER_PATH whose command is this file's launcher::

    python kernel_zygote.py serve SOCKET       the zygote: imports, then forks a kernel per request
    python kernel_zygote.py launch -f FILE     the kernelspec's command (what Jupyter starts)

The launcher sends the zygote (the socket named by ``MHA_KERNEL_ZYGOTE``) its arguments,
environment and working directory, and passes it its standard streams; the zygote forks a child
that becomes an ipykernel exactly as ``python -m ipykernel_launcher`` would. The launcher stays
the kernel's process as far as Jupyter knows: it forwards the signals Jupyter sends (interrupt,
terminate) to the kernel and exits with the kernel's status; if the launcher is killed, the zygote
kills the kernel. The zygote forks only while it has started no thread and run no PyTorch
operation, so a child starts as clean as a fresh interpreter that imported the same modules.

An ordinary kernel starts instead (the launcher execs ``python -m ipykernel_launcher``) when no
zygote answers (not started yet, or gone), when the launcher's interpreter is another one, or when
the request's environment differs from the zygote's in a variable read at import time (thread
counts, CPU capabilities, hash seed, paths): such a kernel would not be what a fresh one is.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import sys
import traceback

ENV = "MHA_KERNEL_ZYGOTE"  # the zygote's socket, for the launcher
#: imported by the zygote: ipykernel's app, then what notebooks import (the order of their first cells)
KERNEL = "ipykernel.kernelapp"
#: not ipywidgets: imported inside a kernel, it registers its comm targets with that kernel
LIBRARIES = ("torch", "numpy", "matplotlib.pyplot")
INLINE = "module://matplotlib_inline.backend_inline"  # what ipykernel sets MPLBACKEND to
#: variables some module reads while it is imported: a request that differs in one of them gets an
#: ordinary kernel (a forked one would have read the zygote's value)
IMPORT_TIME_PREFIXES = (
    "PYTHON",
    "OMP_",
    "KMP_",
    "GOMP_",
    "MKL_",
    "OPENBLAS_",
    "NPY_",
    "NUMPY_",
    "ATEN_",
    "TORCH",
    "PYTORCH_",
    "CUDA",
    "MPL",
    "LD_",
    "LANG",
    "LC_",
    "HOME",
    "XDG_",
    "TZ",
)
#: variables with those prefixes that are read only when used, never on import: PyTorch writes
#: TORCHINDUCTOR_CACHE_DIR into os.environ the first time it compiles (torch.compile,
#: flex_attention), so every kernel a process started after that would otherwise be refused
READ_WHEN_USED = ("TORCHINDUCTOR_CACHE_DIR",)
CONNECT_TIMEOUT_S = 2.0


def import_time_environment(env: dict[str, str]) -> dict[str, str]:
    chosen = {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES) and k not in READ_WHEN_USED}
    chosen.setdefault("MPLBACKEND", INLINE)  # a kernel without it gets ipykernel's inline backend
    return chosen


def _send(conn: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(conn, [struct.pack("!I", len(data))], fds)
        conn.sendall(data)
    else:
        conn.sendall(struct.pack("!I", len(data)) + data)


def _receive_exactly(conn: socket.socket, size: int) -> bytes:
    chunks = b""
    while len(chunks) < size:
        chunk = conn.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("the other side closed the connection")
        chunks += chunk
    return chunks


def _receive(conn: socket.socket, with_fds: int = 0) -> tuple[dict, list[int]]:
    fds: list[int] = []
    if with_fds:
        header, fds, _, _ = socket.recv_fds(conn, 4, with_fds)
        header += _receive_exactly(conn, 4 - len(header))
    else:
        header = _receive_exactly(conn, 4)
    (size,) = struct.unpack("!I", header)
    return json.loads(_receive_exactly(conn, size)), fds


# --- the zygote ----------------------------------------------------------------------------------


def serve(path: str) -> None:
    os.environ.setdefault("MPLBACKEND", INLINE)
    import importlib
    import warnings

    importlib.import_module(KERNEL)
    kernels_filters = list(warnings.filters)
    for module in LIBRARIES:
        importlib.import_module(module)
    # the warning filters the libraries add on import: a fresh kernel adds them after its own
    # start (when a cell imports the libraries), so a forked kernel adds them at that point too
    added = [f for f in warnings.filters if f not in kernels_filters]
    first_own = next((i for i, f in enumerate(warnings.filters) if f in kernels_filters), len(warnings.filters))
    libraries_filters = (
        [f for f in added if warnings.filters.index(f) < first_own],
        [f for f in added if warnings.filters.index(f) >= first_own],
    )
    mine = import_time_environment(dict(os.environ))
    parent = os.getppid()

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(16)
    os.replace(path + ".new", path)  # launchers connect only once everything is imported

    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_read, selectors.EVENT_READ, "wake")
    children: dict[int, socket.socket] = {}  # kernel pid -> its launcher's connection
    try:
        while os.getppid() == parent:
            for key, _ in selector.select(timeout=1.0):
                if key.data == "wake":
                    os.read(wake_read, 512)
                elif key.data == "accept":
                    conn, _ = listener.accept()
                    own = [selector, listener, *children.values(), wake_read, wake_write]
                    try:
                        pid = _fork_kernel(conn, mine, libraries_filters, own)
                    except Exception:  # a malformed request: that launcher starts an ordinary kernel
                        traceback.print_exc()
                        pid = 0
                    if pid:
                        children[pid] = conn
                        selector.register(conn, selectors.EVENT_READ, pid)
                    else:
                        conn.close()
                else:  # the launcher is gone (killed): so goes its kernel, with what it started
                    _signal_group(key.data, signal.SIGKILL)
                    selector.unregister(key.fileobj)
            while children:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                conn = children.pop(pid, None)
                if conn is not None:
                    try:
                        selector.unregister(conn)
                    except (KeyError, ValueError):
                        pass
                    try:
                        _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
                    except OSError:
                        pass
                    conn.close()
    finally:
        for pid in children:
            _signal_group(pid, signal.SIGKILL)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _fork_kernel(conn: socket.socket, mine: dict, libraries_filters: tuple, zygotes_own: list) -> int:
    """Fork a kernel for the request on ``conn``; its pid, or 0 when the launcher should start
    an ordinary kernel (it is told why). ``zygotes_own``: sockets and descriptors the kernel must
    not keep."""
    conn.settimeout(CONNECT_TIMEOUT_S)
    try:
        request, fds = _receive(conn, with_fds=3)
    except (OSError, ValueError, ConnectionError):
        return 0
    reason = None
    if len(fds) != 3:
        reason = f"{len(fds)} standard streams passed, not 3"
    elif request.get("executable") != sys.executable:
        reason = f"another interpreter ({request.get('executable')})"
    elif (theirs := import_time_environment(request.get("env", {}))) != mine:
        differ = sorted(k for k in set(theirs) | set(mine) if theirs.get(k) != mine.get(k))
        reason = "import-time variables differ: " + ", ".join(differ)
    if reason:
        for fd in fds:
            os.close(fd)
        try:
            _send(conn, {"refused": reason})
        except OSError:
            pass
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the kernel
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for own in [conn, *zygotes_own]:
                own.close() if hasattr(own, "close") else os.close(own)
            for sig in (signal.SIGCHLD, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            os.setsid()
            for target, fd in zip((0, 1, 2), fds, strict=True):
                os.dup2(fd, target)
                os.close(fd)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            sys.argv = [request["argv0"], *request["argv"]]
            del sys.path[0]  # as ipykernel_launcher: IPython puts the working directory back
            code = _run_kernel(libraries_filters)
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    conn.settimeout(None)
    _send(conn, {"pid": pid})
    return pid


def _run_kernel(libraries_filters: tuple[list, list]) -> int:
    """Run the kernel as ipykernel_launcher does; the libraries' warning filters move behind the
    kernel's own, where a fresh kernel has them once a cell has imported the libraries."""
    import atexit
    import warnings

    from ipykernel import kernelapp

    front, back = libraries_filters
    mutated = getattr(warnings, "_filters_mutated", lambda: None)  # the filters' cache, where it has one
    warnings.filters[:] = [f for f in warnings.filters if f not in front and f not in back]
    mutated()

    # a default ipykernel read from the environment when the zygote imported it: this kernel's
    if os.environ.get("JPY_PARENT_PID"):
        sys.argv.append(f"--IPKernelApp.parent_handle={int(os.environ['JPY_PARENT_PID'])}")
    try:
        app = kernelapp.IPKernelApp.instance()  # kernelapp.launch_new_instance(), in two steps
        app.initialize()
        warnings.filters[:] = front + warnings.filters + back
        mutated()
        app.start()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # as an interpreter that ends normally
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass
    return code


# --- the launcher --------------------------------------------------------------------------------


def launch(argv: list[str]) -> int:
    path = os.environ.get(ENV)
    conn = None
    if path:
        try:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(CONNECT_TIMEOUT_S)
            conn.connect(path)
            request = {
                "argv0": os.path.abspath(__file__),
                "argv": argv,
                "env": dict(os.environ),
                "cwd": os.getcwd(),
                "executable": sys.executable,
            }
            _send(conn, request, fds=[0, 1, 2])
            reply, _ = _receive(conn)
        except Exception:  # noqa: BLE001 - no zygote, whatever the reason: an ordinary kernel
            reply = {"refused": "no zygote answered"}
        if "pid" in reply:
            return _stand_in_for(conn, reply["pid"])
    # an ordinary kernel, as the kernelspec ipykernel installs would start
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *argv])
    return 1  # not reached


def _stand_in_for(conn: socket.socket, pid: int) -> int:
    """Be the kernel's process for Jupyter until the kernel ends; its exit status."""

    def forward(signum, _frame):  # Jupyter signals the launcher's group; the kernel leads its own
        _signal_group(pid, signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    conn.settimeout(None)
    try:
        reply, _ = _receive(conn)
    except (OSError, ConnectionError, ValueError):
        return 1
    code = reply.get("exit", 1)
    return code if code >= 0 else 128 - code


def _signal_group(pid: int, signum: int) -> None:
    """Signal a kernel and the processes it started (its process group, as Jupyter signals an
    ordinary kernel's), or the kernel alone if it has no group of its own yet."""
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def kernelspec(folder, env: dict[str, str] | None = None) -> str:
    """Write the ``python3`` kernelspec that starts kernels through this launcher (where the
    platform forks; elsewhere ipykernel's own command) into ``folder/kernels/python3``; returns the
    folder (for JUPYTER_PATH). Either runs the interpreter that starts the kernel (Jupyter puts
    its own in place of ``python``). ``env``: variables every kernel of the spec gets."""
    import importlib.util
    import shutil
    from pathlib import Path

    source = Path(importlib.util.find_spec("ipykernel").origin).parent / "resources"  # without importing it
    target = Path(folder) / "kernels" / "python3"
    target.mkdir(parents=True, exist_ok=True)
    for logo in source.glob("logo-*"):
        shutil.copy2(logo, target / logo.name)
    spec = {
        "argv": ["python", os.path.abspath(__file__), "launch", "-f", "{connection_file}"]
        if hasattr(os, "fork")
        else ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
        "metadata": {"debugger": True},
        "kernel_protocol_version": "5.5",
        **({"env": dict(env)} if env else {}),
    }
    (target / "kernel.json").write_text(json.dumps(spec, indent=1))
    return str(folder)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif len(sys.argv) >= 2 and sys.argv[1] == "launch":
        sys.exit(launch(sys.argv[2:]))
    else:
        sys.exit(__doc__)
