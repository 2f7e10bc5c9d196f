"""The course's one timer: functions timed round-robin, so that a change in machine load hits all
of them alike. Compare the results as ratios from one run, never as absolute numbers."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch

from .. import validation

__all__ = ["round_robin_times", "median_times"]


def round_robin_times(
    fns: dict[str, Callable[[], object]],
    *,
    repeats: int = 5,
    warmup: int = 1,
    min_sample_s: float = 0.0,
    num_threads: int | None = None,
    outputs: dict | None = None,
    progress=None,
) -> dict[str, list[float]]:
    """Seconds per call of each ``fns[name]()``, one sample per round: ``warmup`` untimed rounds,
    then ``repeats`` rounds of one sample of each function, in order.

    ``min_sample_s``: a sample is as many calls as fill this time (set from the first warm-up
    call; at least one), so that short calls are not lost in timer noise. ``num_threads``: torch's
    intra-op threads while timing (restored afterwards). ``outputs``: a dict that receives what
    each function returned in the first warm-up round. ``progress``: anything with
    ``update(1)`` (a tqdm bar), advanced once per round.
    """
    validation.positive_int("repeats", repeats)
    validation.positive_int("warmup", warmup, allow_zero=True)
    previous = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(validation.positive_int("num_threads", num_threads))
    number = dict.fromkeys(fns, 1)
    times: dict[str, list[float]] = {name: [] for name in fns}
    try:
        for round_ in range(warmup):
            for name, fn in fns.items():
                start = time.perf_counter()
                result = fn()
                if round_ == 0:
                    number[name] = max(1, math.ceil(min_sample_s / max(time.perf_counter() - start, 1e-6)))
                    if outputs is not None:
                        outputs[name] = result
                del result
            if progress is not None:
                progress.update(1)
        for _ in range(repeats):
            for name, fn in fns.items():
                start = time.perf_counter()
                for _ in range(number[name]):
                    fn()
                times[name].append((time.perf_counter() - start) / number[name])
            if progress is not None:
                progress.update(1)
    finally:
        torch.set_num_threads(previous)
    return times


def median_times(
    fns: dict[str, Callable[[], object]], *, repeats: int = 5, warmup: int = 1, num_threads: int | None = None
) -> dict[str, float]:
    """Median wall time in seconds of each ``fns[name]()`` over :func:`round_robin_times`' rounds
    (one call per sample). ``num_threads`` sets torch's intra-op threads for the measurement
    (restored afterwards). Compare the results as ratios from one run."""
    times = round_robin_times(fns, repeats=repeats, warmup=warmup, num_threads=num_threads)
    return {name: statistics.median(ts) for name, ts in times.items()}
