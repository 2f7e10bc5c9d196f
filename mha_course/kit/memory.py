"""The course's one memory measure: the peak of PyTorch's CPU allocator during one call."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable

__all__ = ["peak_memory"]


@contextlib.contextmanager
def quiet_c_stderr():
    """Silence file descriptor 2 (C-level writes) for the block: the profiler's backend prints
    status lines with timestamps there, which would end up in notebook outputs. Python's own
    warnings and exceptions are unaffected (they go through ``sys.stderr``)."""
    try:
        sys.stderr.flush()
        saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:  # no real fd 2 (some embedded interpreters): nothing to silence
        yield
        return
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def peak_memory(fn: Callable[[], object]) -> int:
    """The most bytes PyTorch's CPU allocator held at once while ``fn()`` ran, beyond what was
    allocated before it started (the result of ``fn`` counts while it is alive, i.e. until it is
    dropped after the call). Measured from ``torch.profiler``'s memory events (``profile_memory``):
    sees every tensor, including the scratch buffers of fused kernels, but not memory a BLAS
    library allocates itself. Python's ``tracemalloc`` would see none of it: tensors are allocated
    in C++, outside Python's allocator.
    """
    from torch.profiler import ProfilerActivity, profile

    # acc_events=True changes nothing for one profiling cycle, but without it torch 2.11 warns
    # (under the notebook cell) that events of earlier cycles are dropped, on every first use
    with (
        quiet_c_stderr(),
        profile(activities=[ProfilerActivity.CPU], profile_memory=True, acc_events=True) as prof,
    ):
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak
