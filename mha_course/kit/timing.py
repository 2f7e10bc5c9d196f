"""The course's one timer: functions timed round-robin, so that a change in machine load hits all
of them alike. Compare the results as ratios from one run, never as absolute numbers.

On a GPU a call returns before its kernels finish; pass ``device=`` and each sample waits for the
device (``synchronize``) before the clock stops. :func:`device_label` names where a timing ran,
for the line printed above every timing table."""

from __future__ import annotations

import contextlib
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import torch

from .. import validation

__all__ = ["round_robin_times", "median_times", "synchronize", "device_label", "cpu_model"]

#: caps the timed rounds of every timing (unset: as many as asked). Where only whether the timed
#: code runs matters, not the numbers (the course's own test runs, whose timing outputs are not
#: compared), ``MHA_COURSE_TIMING_ROUNDS=1`` times one round, after at most one warm-up round, of
#: single calls.
ROUNDS_VARIABLE = "MHA_COURSE_TIMING_ROUNDS"


def rounds_cap() -> int | None:
    """The cap ``MHA_COURSE_TIMING_ROUNDS`` sets (None: unset)."""
    value = os.environ.get(ROUNDS_VARIABLE, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{ROUNDS_VARIABLE} must be a whole number of rounds, at least 1, got {value!r}")
    return int(value)


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait until every kernel queued on ``device`` has finished (nothing to wait for on the CPU)."""
    device = torch.device("cpu") if device is None else torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo, macOS sysctl, else platform.processor())."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        import subprocess

        with contextlib.suppress(Exception):
            return subprocess.check_output(["sysctl", "-n", "machdep.cpu.brand_string"], text=True).strip()
    return platform.processor() or platform.machine() or "unknown"


def device_label(device: torch.device | str | None = None, *, num_threads: int | None = None) -> str:
    """Where a timing ran, for the line above its table: "the CPU (model), 1 thread",
    "CUDA (GPU name)" or "Apple MPS". ``num_threads``: the CPU threads used (default: torch's)."""
    device = torch.device("cpu") if device is None else torch.device(device)
    if device.type == "cuda":
        return f"CUDA ({torch.cuda.get_device_name(device)})"
    if device.type == "mps":
        return "Apple MPS (the GPU of Apple silicon)"
    if device.type != "cpu":
        return str(device)
    threads = torch.get_num_threads() if num_threads is None else num_threads
    return f"the CPU ({cpu_model()}), {threads} thread{'' if threads == 1 else 's'}"


def round_robin_times(
    fns: dict[str, Callable[[], object]],
    *,
    repeats: int = 5,
    warmup: int = 1,
    min_sample_s: float = 0.0,
    num_threads: int | None = None,
    outputs: dict | None = None,
    progress=None,
    device: torch.device | str | None = None,
) -> dict[str, list[float]]:
    """Seconds per call of each ``fns[name]()``, one sample per round: ``warmup`` untimed rounds,
    then ``repeats`` rounds of one sample of each function, in order.

    ``min_sample_s``: a sample is as many calls as fill this time (set from the first warm-up
    call; at least one), so that short calls are not lost in timer noise. ``num_threads``: torch's
    intra-op threads while timing (restored afterwards). ``outputs``: a dict that receives what
    each function returned in the first warm-up round. ``progress``: anything with
    ``update(1)`` (a tqdm bar), advanced once per round. ``device``: where the functions compute;
    on a GPU each sample ends only when the device has finished its work.
    """
    validation.positive_int("repeats", repeats)
    validation.positive_int("warmup", warmup, allow_zero=True)
    if (cap := rounds_cap()) is not None:  # see ROUNDS_VARIABLE
        repeats, warmup, min_sample_s = min(repeats, cap), min(warmup, 1), 0.0
    previous = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(validation.positive_int("num_threads", num_threads))
    number = dict.fromkeys(fns, 1)
    times: dict[str, list[float]] = {name: [] for name in fns}
    try:
        for round_ in range(warmup):
            for name, fn in fns.items():
                synchronize(device)
                start = time.perf_counter()
                result = fn()
                synchronize(device)
                if round_ == 0:
                    number[name] = max(1, math.ceil(min_sample_s / max(time.perf_counter() - start, 1e-6)))
                    if outputs is not None:
                        outputs[name] = result
                del result
            if progress is not None:
                progress.update(1)
        for _ in range(repeats):
            for name, fn in fns.items():
                synchronize(device)
                start = time.perf_counter()
                for _ in range(number[name]):
                    fn()
                synchronize(device)
                times[name].append((time.perf_counter() - start) / number[name])
            if progress is not None:
                progress.update(1)
    finally:
        torch.set_num_threads(previous)
    return times


def median_times(
    fns: dict[str, Callable[[], object]],
    *,
    repeats: int = 5,
    warmup: int = 1,
    num_threads: int | None = None,
    device: torch.device | str | None = None,
) -> dict[str, float]:
    """Median wall time in seconds of each ``fns[name]()`` over :func:`round_robin_times`' rounds
    (one call per sample). ``num_threads`` sets torch's intra-op threads for the measurement
    (restored afterwards); ``device``: where the functions compute (a GPU is waited for).
    Compare the results as ratios from one run."""
    times = round_robin_times(fns, repeats=repeats, warmup=warmup, num_threads=num_threads, device=device)
    return {name: statistics.median(ts) for name, ts in times.items()}
