"""How fast is each attention implementation on this machine, against PyTorch and against the
machine's own matrix-multiply rate? Forward passes in float32, inference (no autograd), on the CPU
unless ``--device`` names another.

    python -m mha_course.lessons.benchmark            # sweep: B in (1, 8), L in (128 … 1024), causal or not
    python -m mha_course.lessons.benchmark --quick    # B=8, L=512, d_model=512, h=8, causal only
    python -m mha_course.lessons.benchmark --quick --device cuda   # the same on a GPU (no memory column)

Implementations (``IMPLEMENTATIONS``), all with the same weights and the same mask:

====================  =====================================================================================
looped                ``mc.LoopedMultiHeadAttention``: h separate heads, weights returned
ours+weights          ``mc.MultiHeadAttention(need_weights=True)``: the readable formula, per-head weights
ours+SDPA             ``mc.MultiHeadAttention(need_weights=False)``: PyTorch's fused SDPA, no weights
fast+weights          ``mha_course.fast.FastMultiHeadAttention(need_weights=True)``: the tuned variant
torch+weights         ``nn.MultiheadAttention(need_weights=True, average_attn_weights=False)``: under
                      ``torch.no_grad()``, its inference fast path (a native kernel)
torch+weights plain   the same call with that fast path off (``torch.backends.mha.set_fastpath_enabled``):
                      ``F.multi_head_attention_forward``, the path it takes in training
torch                 ``nn.MultiheadAttention(need_weights=False)``: its fast path under ``torch.no_grad()``
torch plain           the same call with the fast path off
SDPA alone            ``F.scaled_dot_product_attention`` on ready (B, h, L, d_head) q, k, v: no projections
====================  =====================================================================================

Method
------
* Timing: all implementations of one configuration — and a (B·L, d) @ (d, d) matmul, the
  machine's reference rate — are timed round-robin by the course's timer
  (:func:`mha_course.kit.timing.round_robin_times`), one sample each per round, after one untimed
  warm-up round, so that a change in machine load hits all of them alike. A sample is one call,
  or as many calls as fill 20 ms for short ones, timed with ``time.perf_counter``.
* Ratios: each implementation against ``nn.MultiheadAttention`` with the same semantics
  (``REFERENCE``: with weights vs ``torch+weights``, without vs ``torch``), computed within each
  round and reported as the median over rounds — steadier than a ratio of medians on a shared
  machine. Below 1 means faster than PyTorch. ``nn.MultiheadAttention`` has two paths, its
  inference fast path and the plain one; the quick check holds the SDPA path and the fast variant
  to both, each ratio from the same rounds.
* GFLOP/s: :func:`mha_course.attention_flops` (dense: the full L² even under a causal mask) per
  second; SDPA alone counts only its 4·B·L²·d. Divided, round by round, by the matmul's GFLOP/s
  in the same round (median over rounds): the fraction of what this machine's BLAS reaches on a
  plain matrix product.
* Peak memory: the most bytes PyTorch's CPU allocator held at once during one call beyond what
  was live before it (:func:`mha_course.kit.memory.peak_memory`, from ``torch.profiler``'s memory
  events). It sees every tensor, including the buffers inside fused kernels, but not the BLAS
  library's own scratch.
* Everything runs under ``torch.no_grad()``, so ``nn.MultiheadAttention`` (in ``eval()`` mode)
  takes its inference fast path where its conditions allow.
* Before timing, every implementation's output is checked against ``nn.MultiheadAttention``'s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from .. import validation
from ..accounting import attention_flops
from ..fast import FastMultiHeadAttention
from ..heads import split_heads
from ..kit.memory import peak_memory
from ..kit.setup import device as mc_device
from ..kit.timing import cpu_model, device_label, round_robin_times
from ..kit.verify import mark
from ..masks import causal_mask
from ..multihead import LoopedMultiHeadAttention

IMPLEMENTATIONS = (
    "looped",
    "ours+weights",
    "ours+SDPA",
    "fast+weights",
    "torch+weights",
    "torch+weights plain",
    "torch",
    "torch plain",
    "SDPA alone",
)
#: the nn.MultiheadAttention call with the same semantics as each implementation
REFERENCE = {
    "looped": "torch+weights",
    "ours+weights": "torch+weights",
    "ours+SDPA": "torch",
    "fast+weights": "torch+weights",
    "torch+weights": "torch+weights",
    "torch+weights plain": "torch+weights",
    "torch": "torch",
    "torch plain": "torch",
    "SDPA alone": "torch",
}
MATMUL = "matmul"
#: the goals at B=8, L=512, d_model=512, h=8, causal: (implementation, the PyTorch call it is
#: compared with, largest ratio); each is held to both of PyTorch's paths (fast path on and off).
#: The readable path (ours+weights) is measured and reported, with no goal
GOALS = (
    ("ours+SDPA", "torch", 1.0),
    ("ours+SDPA", "torch plain", 1.0),
    ("fast+weights", "torch+weights", 0.9),
    ("fast+weights", "torch+weights plain", 0.9),
)
REPORTED = (("ours+weights", "torch+weights"),)


@dataclass(frozen=True)
class Config:
    """One benchmark point: a batch of B sequences of L tokens through an MHA layer."""

    batch: int
    seq_len: int
    d_model: int = 512
    num_heads: int = 8
    causal: bool = True

    def __str__(self) -> str:
        mask = "causal" if self.causal else "no mask"
        return f"B={self.batch} L={self.seq_len} d_model={self.d_model} h={self.num_heads} {mask}"


QUICK = Config(8, 512, 512, 8, causal=True)


@dataclass
class Result:
    """One implementation at one configuration (times in seconds, memory in bytes)."""

    config: Config
    name: str
    median_s: float
    iqr_s: float
    ratio: float  # median over rounds of time / time of REFERENCE[name]
    ratio_low: float  # smallest and largest per-round ratio: the noise
    ratio_high: float
    gflops: float  # achieved GFLOP/s (attention_flops / median time)
    of_matmul: float  # median over rounds of (its GFLOP/s) / (the matmul's GFLOP/s in that round)
    alloc_bytes: int | None = None
    max_abs_error: float = 0.0
    samples_s: list[float] = field(default_factory=list)  # seconds per call, one per round


@dataclass
class Report:
    machine: dict
    results: list[Result] = field(default_factory=list)
    matmul_gflops: dict = field(default_factory=dict)  # str(config) -> GFLOP/s (median)
    matmul_samples_s: dict = field(default_factory=dict)  # str(config) -> seconds per round

    def get(self, config: Config, name: str) -> Result:
        return next(r for r in self.results if r.config == config and r.name == name)


# ---------------------------------------------------------------------------------------------
# the machine


def machine_info(device: torch.device | str | None = None) -> dict:
    """What the numbers depend on: the device, torch version and build, threads, cores, CPU model."""
    return {
        "device": device_label(device, num_threads=torch.get_num_threads()),
        "torch": torch.__version__,
        "torch threads": torch.get_num_threads(),
        "CPU cores": os.cpu_count(),
        "CPU": cpu_model(),
        "CPU capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
    }


# ---------------------------------------------------------------------------------------------
# memory


def memory_use(fn: Callable[[], object]) -> int:
    """:func:`mha_course.kit.memory.peak_memory` of one call of ``fn``, without autograd."""
    with torch.no_grad():
        return peak_memory(fn)


# ---------------------------------------------------------------------------------------------
# the implementations


Callables = dict[str, Callable[[], object]]


def without_fastpath(fn: Callable[[], object]) -> object:
    """``fn()`` with ``nn.MultiheadAttention``'s inference fast path switched off (restored after)."""
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        return fn()
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


def build(
    config: Config, *, seed: int = 0, device: torch.device | str | None = None
) -> tuple[Callables, Callable[[], object], Callable[[dict], dict]]:
    """For ``config``: ``(implementations, matmul, check)``. ``implementations`` maps each name of
    ``IMPLEMENTATIONS`` to a no-argument callable, all computing the same function of the same
    input with the same weights; ``matmul`` is the reference (B·L, d) @ (d, d) product.
    ``check(outputs)`` takes {name: what that callable returned} and returns each one's max abs
    error against ``nn.MultiheadAttention``'s output (and per-head weights where both return
    them); SDPA alone's against softmax(q kᵀ/√d_head) v of its q, k, v. ``device``: where the
    weights and the input live (default: the CPU); they are drawn on the CPU first, so every
    device computes the same function."""
    g = torch.Generator().manual_seed(seed)
    B, L, d, h = config.batch, config.seq_len, config.d_model, config.num_heads
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        looped = LoopedMultiHeadAttention(d, h).eval()
    ours = looped.to_fused().eval()
    fast = FastMultiHeadAttention.from_module(ours).eval()
    theirs = ours.to_torch().eval()
    device = torch.device("cpu") if device is None else torch.device(device)
    looped, ours, fast, theirs = (m.to(device) for m in (looped, ours, fast, theirs))
    x = torch.randn(B, L, d, generator=g).to(device)  # (B, L, d_model)
    mask = causal_mask(L, device=device) if config.causal else None  # ours: True = may attend
    blocked = None if mask is None else ~mask  # nn.MultiheadAttention: True = blocked
    with torch.no_grad():  # SDPA alone gets the q, k, v the module computes
        q, k, v = (
            split_heads(p(x), h).contiguous() for p in (ours.q_proj, ours.k_proj, ours.v_proj)
        )  # (B, h, L, d_head)
    w, x2d = torch.randn(d, d, generator=g).to(device), x.reshape(B * L, d)
    fns = {
        "looped": lambda: looped(x, mask=mask),
        "ours+weights": lambda: ours(x, mask=mask, need_weights=True),
        "ours+SDPA": lambda: ours(x, mask=mask, need_weights=False),
        "fast+weights": lambda: fast(x, mask=mask, need_weights=True),
        "torch+weights": lambda: theirs(x, x, x, attn_mask=blocked, need_weights=True, average_attn_weights=False),
        "torch+weights plain": lambda: without_fastpath(
            lambda: theirs(x, x, x, attn_mask=blocked, need_weights=True, average_attn_weights=False)
        ),
        "torch": lambda: theirs(x, x, x, attn_mask=blocked, need_weights=False),
        "torch plain": lambda: without_fastpath(lambda: theirs(x, x, x, attn_mask=blocked, need_weights=False)),
        "SDPA alone": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
    }

    @torch.no_grad()
    def check(outputs: dict) -> dict[str, float]:
        ref_out, ref_w = outputs["torch+weights"] if "torch+weights" in outputs else fns["torch+weights"]()
        result = {}
        for name, got in outputs.items():
            if name == "SDPA alone":
                scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, h, L, L)
                if mask is not None:
                    scores = scores.masked_fill(~mask, float("-inf"))
                result[name] = (got - torch.softmax(scores, dim=-1) @ v).abs().max().item()
            elif name in fns:
                out, weights = got
                err = (out - ref_out).abs().max().item()
                if weights is not None:
                    err = max(err, (weights - ref_w).abs().max().item())
                result[name] = err
        return result

    return fns, (lambda: x2d @ w), check


def flops(config: Config, name: str) -> int:
    """FLOPs of one call of ``name`` (or ``"matmul"``) at ``config`` — the dense count."""
    B, L, d, h = config.batch, config.seq_len, config.d_model, config.num_heads
    if name == MATMUL:
        return 2 * B * L * d * d
    if name == "SDPA alone":
        return 4 * B * L * L * d
    return attention_flops(B, L, d, h)


def median_and_iqr(samples: list[float]) -> tuple[float, float]:
    """Median and interquartile range of timing samples (the IQR is 0 for fewer than 2)."""
    if len(samples) < 2:
        return statistics.median(samples), 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return statistics.median(samples), q3 - q1


def run(
    configs=(QUICK,),
    *,
    repeats: int = 5,
    names=IMPLEMENTATIONS,
    memory: bool = True,
    num_threads: int | None = None,
    progress: bool = True,
    seed: int = 0,
    device: torch.device | str | None = None,
) -> Report:
    """Benchmark ``names`` (any of ``IMPLEMENTATIONS``; their ``REFERENCE`` is added) at each
    :class:`Config` in ``configs``; see the module docstring for the method. ``num_threads``:
    torch's intra-op threads for the run (restored afterwards; default: as they are). ``device``:
    where to compute (default: the CPU); peak memory is measured on the CPU only (it reads the
    CPU allocator's events). Raises if an implementation's output differs from
    ``nn.MultiheadAttention``'s by more than 1e-3."""
    unknown = set(names) - set(IMPLEMENTATIONS)
    if unknown:
        raise ValueError(f"unknown implementations {sorted(unknown)}; choose from {list(IMPLEMENTATIONS)}")
    wanted = [n for n in IMPLEMENTATIONS if n in names or n in {REFERENCE[m] for m in names}]
    previous_threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(validation.positive_int("num_threads", num_threads))
    device = torch.device("cpu") if device is None else torch.device(device)
    report = Report(machine=machine_info(device))
    bar = None
    if progress:
        from ..kit.progress import progress_bar

        bar = progress_bar(total=len(configs) * (repeats + 1), desc="benchmark rounds")
    try:
        for config in configs:
            fns, matmul, check = build(config, seed=seed, device=device)
            fns, outputs = {n: fns[n] for n in wanted}, {}
            with torch.no_grad():  # inference: no autograd graph, and nn.MultiheadAttention's fast path
                times = round_robin_times(
                    {**fns, MATMUL: matmul},
                    repeats=repeats,
                    min_sample_s=0.02,
                    outputs=outputs,
                    progress=bar,
                    device=device,
                )
            err = check(outputs)
            del outputs
            wrong = {n: e for n, e in err.items() if not e < 1e-3}
            if wrong:
                raise AssertionError(f"{config}: outputs differ from nn.MultiheadAttention's: {wrong}")
            mm = times[MATMUL]
            report.matmul_gflops[str(config)] = flops(config, MATMUL) / statistics.median(mm) / 1e9
            report.matmul_samples_s[str(config)] = mm
            for name in wanted:
                median_s, iqr_s = median_and_iqr(times[name])
                ratios = [t / r for t, r in zip(times[name], times[REFERENCE[name]], strict=True)]
                work = flops(config, name) / flops(config, MATMUL)  # rate ratio = work ratio / time ratio
                of_matmul = [work * t_mm / t for t, t_mm in zip(times[name], mm, strict=True)]
                result = Result(
                    config,
                    name,
                    median_s,
                    iqr_s,
                    statistics.median(ratios),
                    min(ratios),
                    max(ratios),
                    flops(config, name) / median_s / 1e9,
                    statistics.median(of_matmul),
                    max_abs_error=err[name],
                    samples_s=times[name],
                )
                if memory and device.type == "cpu":
                    result.alloc_bytes = memory_use(fns[name])
                report.results.append(result)
    finally:
        torch.set_num_threads(previous_threads)
        if bar is not None:
            bar.close()
    return report


# ---------------------------------------------------------------------------------------------
# reading the results


def _mib(n) -> str:
    return "     -" if n is None else f"{n / 2**20:6.1f}"


def table(report: Report) -> str:
    """The results as text: per configuration, one line per implementation."""
    lines = []
    for config in dict.fromkeys(r.config for r in report.results):
        rate = report.matmul_gflops[str(config)]
        lines += [
            f"{config}   (matmul: {rate:.1f} GFLOP/s)",
            f"  {'implementation':<20}{'median ms':>10}{'× torch':>9}{'(range)':>14}"
            f"{'GFLOP/s':>9}{'of matmul':>10}{'peak MiB':>10}{'max|err|':>10}",
        ]
        for r in (r for r in report.results if r.config == config):
            ref = "" if r.name == REFERENCE[r.name] else f"{r.ratio_low:.2f}–{r.ratio_high:.2f}"
            lines.append(
                f"  {r.name:<20}{r.median_s * 1e3:10.2f}{r.ratio:8.2f}×{ref:>14}{r.gflops:9.1f}"
                f"{r.of_matmul:9.0%} {_mib(r.alloc_bytes):>9}{r.max_abs_error:10.1e}"
            )
        lines.append("")
    return "\n".join(lines)


def goal_lines(report: Report, config: Config | None = None) -> list[str]:
    """One line per goal (``GOALS``, with ✅ or ❌) and per reported ratio (``REPORTED``)
    measured at ``config`` (default ``QUICK``)."""
    config = QUICK if config is None else config
    lines = []
    for name, ref, bound in (*GOALS, *((n, r, None) for n, r in REPORTED)):
        try:
            r, reference = report.get(config, name), report.get(config, ref)
        except StopIteration:
            continue
        ratio, low, high = r.ratio, r.ratio_low, r.ratio_high
        if ref != REFERENCE[name]:  # against another call: its own per-round ratios, from the same rounds
            ratios = [t / t_ref for t, t_ref in zip(r.samples_s, reference.samples_s, strict=True)]
            ratio, low, high = statistics.median(ratios), min(ratios), max(ratios)
        verdict = "" if bound is None else f"{mark(ratio <= bound)} · "
        goal = "measured" if bound is None else f"goal ≤ {bound:.2f}×"
        lines.append(
            f"{verdict}{name} / {ref}: {ratio:.2f}× (per-round range {low:.2f}–{high:.2f}; {goal}) at {config}"
        )
    return lines


def plot(report: Report, *, batch: int | None = None, causal: bool | None = None):
    """Figure: left, time relative to nn.MultiheadAttention vs L; right, achieved fraction of the
    matmul rate vs L — one line per implementation, for the configurations with ``batch`` and
    ``causal`` (default: those of the first result)."""
    import matplotlib.pyplot as plt

    first = report.results[0].config
    batch = first.batch if batch is None else batch
    causal = first.causal if causal is None else causal
    rows = [r for r in report.results if r.config.batch == batch and r.config.causal == causal]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5.4), layout="constrained")
    colours = dict(zip(IMPLEMENTATIONS, plt.get_cmap("tab10").colors, strict=False))
    lengths = sorted({r.config.seq_len for r in rows})
    for name in dict.fromkeys(r.name for r in rows):
        mine = sorted((r for r in rows if r.name == name), key=lambda r: r.config.seq_len)
        xs = [r.config.seq_len for r in mine]
        style = dict(ls="--" if name.startswith("torch") else "-", marker="o", color=colours[name])
        if name != REFERENCE[name]:  # a reference against itself is the line at 1
            ax1.plot(xs, [r.ratio for r in mine], **style, label=f"{name} / {REFERENCE[name]}")
        ax2.plot(xs, [100 * r.of_matmul for r in mine], **style, label=name)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [f"{n:,}" for n in lengths])
        ax.minorticks_off()
        ax.set_xlabel("sequence length L")
        ax.grid(alpha=0.3)
    ax1.axhline(1.0, color="black", lw=0.8, label="nn.MultiheadAttention")
    ax1.set_ylabel("time ÷ nn.MultiheadAttention's (same semantics)")
    ax1.set_title("Time relative to PyTorch (below 1 = faster)")
    ax2.axhline(100.0, color="black", lw=0.8, label="100%: the plain matmul's rate")
    ax2.set_ylabel("% of this machine's matmul GFLOP/s")
    ax2.set_title("Achieved FLOP rate as a share of a plain matmul's")
    for ax in (ax1, ax2):  # below the axes, so no legend hides a line
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, frameon=False)
    d, h = rows[0].config.d_model, rows[0].config.num_heads
    threads = report.machine["torch threads"]
    fig.suptitle(
        f"Attention forward, float32, B={batch}, d_model={d}, h={h}, "
        f"{'causal' if causal else 'no mask'}, {threads} thread{'' if threads == 1 else 's'}"
    )
    return fig


def to_json(report: Report) -> str:
    return json.dumps(
        {
            "machine": report.machine,
            "matmul_gflops": report.matmul_gflops,
            "matmul_samples_s": report.matmul_samples_s,
            "results": [asdict(r) for r in report.results],
        },
        indent=1,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mha_course.lessons.benchmark", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="only the quick configuration (B=8, L=512, causal), checked against the speed goals",
    )
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds per configuration (5; quick: 4)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurements")
    parser.add_argument(
        "--device", default="cpu", help="cpu (default), cuda, mps, or auto for the best one here (memory: CPU only)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        configs = [QUICK]
    else:
        configs = [Config(b, n, causal=c) for c in (True, False) for b in (1, 8) for n in (128, 256, 512, 1024)]
    report = run(
        configs,
        repeats=args.repeats or (4 if args.quick else 5),
        memory=not args.no_memory,
        num_threads=args.threads,
        device=mc_device() if args.device == "auto" else args.device,
    )
    print("machine: " + ", ".join(f"{k} {v}" for k, v in report.machine.items()))
    print()
    print(table(report))
    print("\n".join(goal_lines(report)))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(to_json(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
