"""Compute a deterministic training run once when one machine executes the same notebook many times.

The course's test suite executes every notebook several times in one session (strict nbval of
each edition, the student edition, JupyterLab in a browser, the explorers' driver), and each
execution trains the same tiny models with the same arguments. A function decorated with
:func:`cached_run` looks its result up in the folder that the environment variable
``MHA_COURSE_RUN_CACHE`` names: the first execution computes and stores it, later ones load a
fresh copy. Without the variable (a learner's notebook, Colab, the package's own tests unless
they set it) the decorator does nothing at all.

A result is reused only when everything that decides it is the same: the function, every
argument (values, dataclass fields, tensor contents), the package's source code, the PyTorch
version, the kernel settings that change the last bits of a float computation
(``ATEN_CPU_CAPABILITY``, ``MKL_ENABLE_INSTRUCTIONS``, the thread count) and, unless the function
seeds its own generator, the state of PyTorch's global random generator. The generator's state
after the call is stored with the result and restored on a reuse, so the code after the call
draws the same numbers either way. An argument the key cannot describe (an arbitrary object)
means no caching for that call. Concurrent processes wait for the one that computes a result
(a lock file per result, where the platform has ``fcntl``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import os
import pickle
import tempfile
from pathlib import Path

import torch

#: the environment variable naming the cache folder (unset: no caching)
ENV = "MHA_COURSE_RUN_CACHE"
#: environment variables that change how the same code rounds (see authoring/emulate.py)
KERNEL_SETTINGS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")

_PACKAGE = Path(__file__).resolve().parent.parent


class Unkeyable(TypeError):
    """An argument whose value the cache key cannot describe."""


@functools.lru_cache(maxsize=1)
def package_digest() -> str:
    """SHA-256 over the package's Python sources (any change to the code is a new key)."""
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        digest.update(path.relative_to(_PACKAGE).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def describe(value) -> object:
    """A plain, comparable description of ``value`` for the key; :class:`Unkeyable` if none."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return (type(value).__name__, value)
    if isinstance(value, (torch.dtype, torch.device, range)):
        return (type(value).__name__, str(value))
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous().view(-1)
        digest = hashlib.sha256(data.view(torch.uint8).numpy()).hexdigest()
        return ("tensor", str(value.dtype), tuple(value.shape), digest)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(describe(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((repr(describe(k)), describe(v)) for k, v in value.items())))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = tuple((f.name, describe(getattr(value, f.name))) for f in dataclasses.fields(value))
        return (type(value).__module__, type(value).__qualname__, fields)
    raise Unkeyable(f"cannot key an argument of type {type(value).__qualname__}")


def key(fn, arguments: dict, *, seeds_itself: bool) -> str:
    """The cache key of calling ``fn`` with ``arguments`` (names -> values, defaults applied)."""
    parts = [
        fn.__module__,
        fn.__qualname__,
        describe(arguments),
        package_digest(),
        torch.__version__,
        tuple(os.environ.get(name, "") for name in KERNEL_SETTINGS),
        torch.get_num_threads(),
    ]
    if not seeds_itself:
        parts.append(describe(torch.random.get_rng_state()))
    return hashlib.sha256(repr(parts).encode()).hexdigest()


@contextlib.contextmanager
def _locked(path: Path):
    """Hold an exclusive lock on ``path`` (created if needed) where the platform has fcntl."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no lock, at worst two processes compute
        yield
        return
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _store(path: Path, entry) -> None:
    """Write ``entry`` to ``path`` atomically; a result that cannot be pickled is not stored."""
    try:
        data = pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return
    handle, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(handle, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


def cached_run(*, ignore: tuple[str, ...] = (), seeds_itself: bool = False, replay=None):
    """Decorate a deterministic, expensive function (a training run) so that, while
    ``MHA_COURSE_RUN_CACHE`` names a folder, each distinct call is computed once.

    Args:
        ignore: arguments that do not change the result (a progress bar); left out of the key.
        seeds_itself: the function sets PyTorch's seed before it draws anything, so its result does
            not depend on the generator's state at the call (the state is left out of the key).
        replay: ``replay(arguments)`` is called when a stored result is used instead of a call, to
            repeat the call's visible side effects (advance the caller's progress bar).
    """

    def decorate(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            folder = os.environ.get(ENV)
            if not folder:
                return fn(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = {name: value for name, value in bound.arguments.items() if name not in ignore}
            try:
                name = key(fn, arguments, seeds_itself=seeds_itself)
            except Unkeyable:
                return fn(*args, **kwargs)
            folder = Path(folder)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{name}.pkl"
            with _locked(folder / f"{name}.lock"):
                if path.exists():
                    result, rng_after = pickle.loads(path.read_bytes())
                    if rng_after is not None:
                        torch.random.set_rng_state(rng_after)
                    if replay is not None:
                        replay(bound.arguments)
                    return result
                rng_before = torch.random.get_rng_state()
                result = fn(*args, **kwargs)
                rng_after = torch.random.get_rng_state()
                _store(path, (result, None if torch.equal(rng_before, rng_after) else rng_after))
                return result

        wrapper.uncached = fn
        return wrapper

    return decorate


def advance(progress, steps: int) -> None:
    """A ``replay`` helper: move an open progress bar (or None/False: nothing) by ``steps``."""
    if progress is not None and progress is not False and progress is not True:
        progress.update(steps)
