"""Starting ranks: :class:`Ranks` keeps ``world_size`` gloo processes on this machine (127.0.0.1
only) for many jobs, :func:`launch` runs one job; under ``torchrun`` both run the function in the
current process on its own rank."""

from __future__ import annotations

import atexit
import builtins
import datetime
import importlib
import importlib.util
import inspect
import linecache
import multiprocessing
import os
import pickle
import queue
import sys
import textwrap
import time
import traceback
import types

import torch
import torch.distributed as dist

from .. import validation

#: the most ranks :class:`Ranks` starts on one machine (each is a full Python process with torch)
MAX_WORLD_SIZE = 8
#: what the forkserver imports once, before it forks the ranks (torch's shape checks import sympy
#: lazily; DTensor's tensor parallelism is the reference :func:`dtensor_rank` uses)
_PRELOAD = [
    "torch",
    "torch.fx.experimental.symbolic_shapes",
    "torch.distributed.tensor.parallel",
    "mha_course.distributed",
]


def _leave_torchrun_group() -> None:
    """At exit, the ranks torchrun started leave the group they joined together: each waits for the
    others, then closes its connections. A rank that exits while a peer still holds a connection to
    it can make that peer abort."""
    if dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def _loopback_interface() -> str | None:
    """The name of the loopback interface ('lo' on Linux, 'lo0' on macOS), for gloo's sockets."""
    import socket

    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    return next((n for n in names if n in ("lo", "lo0")), next((n for n in names if n.startswith("lo")), None))


class _ByValue:
    """A function shipped to the ranks by its source, not by its name: a function defined in a
    notebook (module ``__main__``), in a file the ranks may not import (``%%writefile ring.py``), or
    in a test. Its source and the globals it names travel; each rank runs the source in a fresh
    namespace. Modules it names are imported on the rank by name; functions it calls from the same
    place travel by source too; any other global travels by pickling."""

    def __init__(self, fn):
        self.name = fn.__name__
        self.source, self.globals = _source_and_globals(fn)

    def __reduce__(self):
        return (_rebuild, (self.name, self.source, self.globals))

    def __call__(self, *args, **kwargs):  # in this process: the rebuilt function
        return _rebuild(self.name, self.source, self.globals)(*args, **kwargs)


def _names(code) -> set[str]:
    """Global names a code object and the code nested in it refer to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _by_name(fn) -> bool:
    """Whether a started rank can import ``fn`` by name: a top-level function of an installed
    module (the course package, torch, the standard library)."""
    if "<" in getattr(fn, "__qualname__", "<") or "." in fn.__qualname__:
        return False
    return _installed(sys.modules.get(getattr(fn, "__module__", None) or "__main__"))


def _installed(module) -> bool:
    """Whether every rank imports ``module`` by name as this process did (not ``__main__``, not a
    file next to the notebook)."""
    if module is None or module.__name__ == "__main__":
        return False
    if module.__name__.split(".")[0] == "mha_course":
        return True
    origin = getattr(getattr(module, "__spec__", None), "origin", None) or ""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    return (
        origin in ("built-in", "frozen")
        or "site-packages" in origin
        or any(origin.startswith(os.path.join(p, "lib")) for p in prefixes)
    )


def _source_and_globals(fn, seen=None):
    seen = set() if seen is None else seen
    what = getattr(fn, "__qualname__", repr(fn))
    if not isinstance(fn, types.FunctionType) or "<" in fn.__qualname__ or "." in fn.__qualname__:
        raise TypeError(
            f"fn={what!r} is not importable by name and cannot be shipped to the ranks by its source: "
            f"only a function defined at the top level (of a "
            f"notebook cell or a module) travels, not a lambda, a nested function or a method; define it "
            f"with def at the top level, or write it to a file with %%writefile and pass 'module:function'"
        )
    if fn.__closure__:
        raise TypeError(
            f"fn={what!r} uses variables of an enclosing function, which cannot travel: define it at the top level"
        )
    try:
        linecache.checkcache(fn.__code__.co_filename)  # a file rewritten since (%%writefile) is read again
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        raise TypeError(
            f"fn={what!r} cannot be shipped to the ranks: its source is not available ({exc}); define it "
            f"in a notebook cell or a .py file (e.g. %%writefile my_rank.py, then pass 'my_rank:{fn.__name__}')"
        ) from None
    if source.lstrip().startswith("@"):
        raise TypeError(f"fn={what!r} is decorated; a decorated function cannot be shipped by its source")
    seen.add(fn.__name__)
    shipped = {}
    for name in sorted(_names(fn.__code__)):
        if name not in fn.__globals__ or name in seen:
            continue
        value = fn.__globals__[name]
        if isinstance(value, types.ModuleType):
            shipped[name] = ("module", value.__name__)
        elif isinstance(value, types.FunctionType) and not _by_name(value):
            src, glob = _source_and_globals(value, seen)
            shipped[name] = ("source", (value.__name__, src, glob))
        else:
            try:
                shipped[name] = ("value", pickle.dumps(value))
            except Exception as exc:  # noqa: BLE001 - named in the message
                raise TypeError(
                    f"fn={what!r} uses the global {name!r} ({type(value).__name__}), which cannot be pickled "
                    f"to the ranks ({type(exc).__name__}); pass it as an argument or import it inside the function"
                ) from None
    return source, shipped


def _rebuild(name, source, shipped):
    """On a rank: run a shipped function's source in a fresh namespace with its globals."""
    namespace = {"__name__": "__rank__", "__builtins__": builtins}
    for key, (kind, payload) in shipped.items():
        if kind == "module":
            namespace[key] = importlib.import_module(payload)
        elif kind == "source":
            namespace[key] = _rebuild(*payload)
        else:
            namespace[key] = pickle.loads(payload)
    exec(compile(source, f"<{name} shipped to the ranks>", "exec"), namespace)  # noqa: S102
    return namespace[name]


def shippable(fn):
    """``fn`` in a form a started rank can run: itself when the rank imports it by name (a function
    of the course package or an installed module), else a copy that travels by its source
    (:class:`_ByValue`). ``fn`` may also be ``"module:function"``, or ``"path/to/file.py:function"``
    for a file written from a notebook (``%%writefile ring_rank.py``): read afresh at every call."""
    if isinstance(fn, str):
        where, sep, name = fn.rpartition(":")
        if not sep or not where or not name.isidentifier():
            raise ValueError(f"fn={fn!r}: expected 'module:function' or 'path/to/file.py:function'")
        if where.endswith(".py"):
            if not os.path.isfile(where):
                raise FileNotFoundError(f"fn={fn!r}: no file {where!r} (from {os.getcwd()!r})")
            spec = importlib.util.spec_from_file_location(f"_rank_file_{abs(hash(where))}", where)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
            if not _installed(module):
                module = importlib.reload(module)  # a file rewritten since its first import
        if not callable(getattr(module, name, None)):
            raise AttributeError(f"fn={fn!r}: {where!r} has no function {name!r}")
        fn = getattr(module, name)
    if not callable(fn):
        raise TypeError(f"fn must be a function or 'module:function', got {type(fn).__name__}")
    return fn if _by_name(fn) else _ByValue(fn)


#: how often an idle rank checks that the process which started it is still there
PARENT_CHECK_S = 2.0


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (an ended process its parent has not reaped yet does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - someone else's process now has that pid
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # Linux: "Z", a zombie
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (macOS): kill's answer
        return True


def _worker(rank, world_size, port, timeout_s, inbox, outbox, parent=None):
    """One rank: join the process group through the parent's store, then run jobs until told to
    stop, or until the process that started the ranks is gone without stopping them (a kernel
    killed, a process ended with os._exit): a rank never outlives it."""
    try:
        torch.set_num_threads(1)  # the ranks share the machine's cores
        interface = _loopback_interface()
        if interface is not None:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)  # gloo talks over 127.0.0.1 only
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
        dist.barrier()  # every pair of ranks connected before the first job
    except Exception:  # noqa: BLE001 - reported to the parent, which raises
        outbox.put((rank, "error", traceback.format_exc()))
        return
    outbox.put((rank, "ready", None))
    while True:
        try:
            job = inbox.get(timeout=PARENT_CHECK_S)
        except queue.Empty:
            if parent is not None and not _alive(parent):
                os._exit(0)  # nobody to report to, and the other ranks are leaving too
            continue
        if job is None:
            break
        try:
            fn, args, kwargs = pickle.loads(job)  # this rank's own copy of every argument
            outbox.put((rank, "ok", pickle.dumps(fn(*args, **kwargs))))
        except Exception:  # noqa: BLE001
            outbox.put((rank, "error", traceback.format_exc()))
    dist.destroy_process_group()


class Ranks:
    """``world_size`` ranks in separate processes on this machine, joined in one gloo process group.

    ``with Ranks(4) as ranks: results = ranks.run(fn, *args)`` runs ``fn(*args)`` on every rank
    and returns ``[result of rank 0, result of rank 1, ...]``; the processes and their group stay up
    for the next ``run``, so the start-up cost (a Python process importing torch per rank) is paid
    once. ``fn`` and its arguments travel by pickling; a function defined in a notebook cell travels
    by its source (:func:`shippable`), so ``ranks.run(my_function, x)`` works from a notebook too.

    Args:
        world_size: number of ranks, 1 to :data:`MAX_WORLD_SIZE`.
        timeout: seconds any collective, and any ``run``, may take; a rank that does not answer in
            time makes ``run`` raise ``TimeoutError`` (and the ranks are stopped) instead of hanging.
        start_method: how the processes start: "forkserver" (the default where it exists, Linux and
            macOS: one clean server process imports torch and the course once, then forks each rank
            from that single-threaded state — as safe as "spawn" and far quicker), "spawn" (every rank
            imports torch afresh; the only method on Windows) or "fork".

    Under ``torchrun`` (``RANK`` and ``WORLD_SIZE`` set) no process is started: ``run`` calls ``fn``
    on this process's rank (initialising the gloo group if needed) and gathers every rank's result.
    """

    def __init__(self, world_size: int, *, timeout: float = 60.0, start_method: str | None = None):
        validation.positive_int("world_size", world_size)
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got timeout={timeout!r}")
        self.world_size, self.timeout = world_size, float(timeout)
        self._procs, self._inboxes, self._outbox, self._store = [], [], None, None
        self.torchrun = _under_torchrun()
        if self.torchrun:
            running = int(os.environ["WORLD_SIZE"])
            if world_size != running:
                raise ValueError(
                    f"world_size={world_size}, but torchrun started {running} processes: "
                    f"run with --nproc-per-node={world_size} or ask for world_size={running}"
                )
            if not dist.is_initialized():
                dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=self.timeout))
                atexit.register(_leave_torchrun_group)
            return
        if world_size > MAX_WORLD_SIZE:
            raise ValueError(
                f"world_size={world_size} is more ranks than this launcher starts on one machine "
                f"(at most {MAX_WORLD_SIZE}, each a Python process with its own copy of torch); "
                f"use torchrun for more"
            )
        methods = multiprocessing.get_all_start_methods()
        start_method = start_method or ("forkserver" if "forkserver" in methods else "spawn")
        if start_method not in methods:
            raise ValueError(
                f"start_method={start_method!r} is not available here; "
                f"choose one of {multiprocessing.get_all_start_methods()}"
            )
        if not dist.is_available() or not dist.is_gloo_available():
            raise RuntimeError("this PyTorch build has no torch.distributed gloo backend, which the ranks need")
        self._start(start_method)

    def _start(self, start_method):
        ctx = torch.multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            ctx.set_forkserver_preload(_PRELOAD)  # imported once, in the server
        timeout = datetime.timedelta(seconds=self.timeout)
        # the parent holds the rendezvous store on a free loopback port (port 0: the OS picks one)
        self._store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, timeout=timeout, wait_for_workers=False)
        self._outbox = ctx.Queue()
        for rank in range(self.world_size):
            inbox = ctx.Queue()
            proc = ctx.Process(
                target=_worker,
                args=(rank, self.world_size, self._store.port, self.timeout, inbox, self._outbox, os.getpid()),
                daemon=True,
            )
            proc.start()
            self._procs.append(proc)
            self._inboxes.append(inbox)
        self._collect("ready", "start")

    def _collect(self, expected: str, what: str) -> list:
        """Wait for one message per rank; stop the ranks and raise on an error, a death or the timeout."""
        results, deadline = {}, time.monotonic() + self.timeout
        while len(results) < self.world_size:
            try:
                rank, status, payload = self._outbox.get(timeout=0.05)
            except queue.Empty:
                dead = [r for r, p in enumerate(self._procs) if not p.is_alive() and r not in results]
                late = time.monotonic() > deadline
                if dead or late:
                    self.close(wait=False)
                    missing = sorted(set(range(self.world_size)) - set(results))
                    if dead:
                        raise RuntimeError(f"rank(s) {dead} exited during {what} without an answer") from None
                    raise TimeoutError(
                        f"rank(s) {missing} did not answer within timeout={self.timeout:g} s during {what} "
                        f"(a rank waiting for a message no one sends hangs: check that every rank calls "
                        f"the same collectives); the ranks were stopped"
                    ) from None
                continue
            if status == "error":
                self.close(wait=False)  # the others may wait in a collective for the failed rank
                raise RuntimeError(f"rank {rank} raised during {what}:\n{payload}")
            results[rank] = payload
        return [results[r] for r in range(self.world_size)]

    def run(self, fn, *args, **kwargs) -> list:
        """Run ``fn(*args, **kwargs)`` on every rank; return the results in rank order.

        ``fn``: a function of the course or of an installed module (it travels by name), a function
        defined in a notebook cell or another file (it travels by its source: :func:`shippable`),
        or the string ``"module:function"`` / ``"file.py:function"``. A function cannot travel when
        it is a lambda, nested, a method, decorated, or uses a global that cannot be pickled: the
        error says which and what to do."""
        if self.torchrun:
            if isinstance(fn, str):
                fn = shippable(fn)
            if not callable(fn):
                raise TypeError(f"fn must be a function or 'module:function', got {type(fn).__name__}")
            result = fn(*args, **kwargs)
            gathered = [None] * self.world_size
            dist.all_gather_object(gathered, result)
            return gathered
        if not self._procs:
            raise RuntimeError("these ranks were stopped (closed, or a rank failed): start new Ranks")
        fn = shippable(fn)
        # plain pickle (bytes), not torch's shared-memory tensors: each rank gets its own copy, as a
        # device would, and no rank can write into another's inputs
        job = pickle.dumps((fn, args, kwargs))
        for inbox in self._inboxes:
            inbox.put(job)
        name = getattr(fn, "name", None) or getattr(fn, "__name__", "fn")
        return [pickle.loads(r) for r in self._collect("ok", name)]

    def close(self, *, wait: bool = True) -> None:
        """Stop the ranks: ask them to leave (and wait up to 5 s) if ``wait``, then by force."""
        if self.torchrun or not self._procs:
            return
        for inbox, proc in zip(self._inboxes, self._procs, strict=True):
            if wait and proc.is_alive():
                try:
                    inbox.put(None)
                except (OSError, ValueError):
                    pass
        for proc in self._procs:
            proc.join(timeout=5 if wait else 0)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        self._procs, self._inboxes = [], []
        self._store = None

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def launch(fn, world_size: int, *args, timeout: float = 60.0, start_method: str | None = None, **kwargs) -> list:
    """Start ``world_size`` ranks, run ``fn(*args, **kwargs)`` on each, stop them; return the
    results in rank order. One job of :class:`Ranks` (use ``Ranks`` to run several on one start)."""
    with Ranks(world_size, timeout=timeout, start_method=start_method) as ranks:
        return ranks.run(fn, *args, **kwargs)
