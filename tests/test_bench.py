"""mha_course.lessons.benchmark: the benchmark's plumbing on tiny sizes. No wall-clock assertions: only what
is measured, how it is combined, and what is reported."""

import json
import math
import re
import statistics
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import mha_course as mc  # noqa: E402
from mha_course.kit import memory, timing
from mha_course.lessons import benchmark

TINY = benchmark.Config(2, 12, 16, 2, causal=True)


@pytest.fixture(scope="module")
def report():
    configs = [TINY, benchmark.Config(2, 24, 16, 2, causal=True), benchmark.Config(1, 12, 16, 2, causal=False)]
    return benchmark.run(configs, repeats=2, progress=False)


def test_every_implementation_is_measured_and_checked_against_torch(report):
    assert [r.name for r in report.results if r.config == TINY] == list(benchmark.IMPLEMENTATIONS)
    for r in report.results:
        assert r.max_abs_error < 1e-5
        assert len({r.ratio_low, r.ratio, r.ratio_high}) >= 1 and r.ratio_low <= r.ratio <= r.ratio_high
        if r.name == benchmark.REFERENCE[r.name]:
            assert r.ratio == r.ratio_low == r.ratio_high == 1.0  # a reference against itself


def test_rates_are_flops_over_time_and_relative_to_the_matmul_of_the_same_rounds(report):
    for r in report.results:
        assert len(r.samples_s) == 2 and r.median_s == pytest.approx(statistics.median(r.samples_s))
        assert r.gflops == pytest.approx(benchmark.flops(r.config, r.name) / r.median_s / 1e9)
        mm = report.matmul_samples_s[str(r.config)]
        per_round = [
            (benchmark.flops(r.config, r.name) / t) / (benchmark.flops(r.config, benchmark.MATMUL) / t_mm)
            for t, t_mm in zip(r.samples_s, mm, strict=True)
        ]
        assert r.of_matmul == pytest.approx(statistics.median(per_round))
        assert report.matmul_gflops[str(r.config)] == pytest.approx(
            benchmark.flops(r.config, benchmark.MATMUL) / statistics.median(mm) / 1e9
        )


def test_memory_is_measured_per_implementation(report):
    for r in report.results:
        assert isinstance(r.alloc_bytes, int) and r.alloc_bytes > 0
    B, L, h = TINY.batch, TINY.seq_len, TINY.num_heads
    for name in ("ours+weights", "fast+weights", "torch+weights"):
        assert report.get(TINY, name).alloc_bytes >= B * h * L * L * 4  # the per-head weights it returns
    # the readable formula holds the scores and the weights; the fast variant one L×L buffer
    assert report.get(TINY, "fast+weights").alloc_bytes < report.get(TINY, "ours+weights").alloc_bytes


def test_flops_follow_the_accounting_formulas():
    c = benchmark.Config(3, 40, 64, 4)
    assert benchmark.flops(c, "ours+weights") == mc.attention_flops(3, 40, 64, 4) == benchmark.flops(c, "torch")
    assert benchmark.flops(c, "SDPA alone") == 4 * 3 * 40 * 40 * 64
    assert benchmark.flops(c, benchmark.MATMUL) == 2 * 3 * 40 * 64 * 64


@pytest.mark.parametrize("causal", [True, False])
def test_build_gives_the_same_function_seven_ways_and_check_catches_a_wrong_one(causal):
    fns, matmul, check = benchmark.build(benchmark.Config(2, 10, 12, 3, causal=causal))
    assert set(fns) == set(benchmark.IMPLEMENTATIONS)
    with torch.no_grad():
        outputs = {name: fn() for name, fn in fns.items()}
        assert max(check(outputs).values()) < 1e-5
        out, weights = outputs["ours+weights"]
        if causal:
            assert (weights[..., 0, 1:] == 0).all()  # the causal mask reached every implementation
        outputs["ours+weights"] = (out + 0.1, weights)
        outputs["SDPA alone"] = outputs["SDPA alone"] * 2
        errors = check(outputs)
        assert errors["ours+weights"] == pytest.approx(0.1, abs=1e-5) and errors["fast+weights"] < 1e-5
        assert errors["SDPA alone"] > 1e-3 and errors["ours+SDPA"] < 1e-5
        assert matmul().shape == (2 * 10, 12)


def test_run_adds_the_references_of_the_names_asked_for_and_rejects_unknown_names():
    r = benchmark.run([TINY], repeats=1, names=["ours+SDPA"], memory=False, progress=False)
    assert [x.name for x in r.results] == ["ours+SDPA", "torch"]
    assert r.results[0].alloc_bytes is None
    with pytest.raises(ValueError, match="unknown implementations"):
        benchmark.run([TINY], names=["flash"], progress=False)


def test_run_sets_and_restores_the_thread_count():
    before = torch.get_num_threads()
    r = benchmark.run([TINY], repeats=1, names=["torch"], memory=False, num_threads=1, progress=False)
    assert r.machine["torch threads"] == 1
    assert torch.get_num_threads() == before


def test_round_robin_takes_one_warm_up_call_then_one_sample_per_round():
    calls = []
    fns = {"a": lambda: calls.append("a") or 1, "b": lambda: calls.append("b") or 2}
    outputs = {}
    times = timing.round_robin_times(fns, repeats=3, outputs=outputs)
    assert calls == ["a", "b"] * 4  # warm-up round + 3 rounds, interleaved
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    assert outputs == {"a": 1, "b": 2}  # from the warm-up round


def test_round_robin_fills_a_minimum_sample_time_with_repeated_calls():
    calls = []
    times = timing.round_robin_times({"quick": lambda: calls.append(1)}, repeats=2, min_sample_s=0.001)
    assert len(calls) > 3 and len(times["quick"]) == 2  # one warm-up call, then two samples of several calls


def test_the_rounds_cap_times_one_round_of_single_calls(monkeypatch):
    monkeypatch.setenv(timing.ROUNDS_VARIABLE, "1")
    calls = []
    outputs = {}
    fns = {"a": lambda: calls.append("a") or 1, "b": lambda: calls.append("b") or 2}
    times = timing.round_robin_times(fns, repeats=5, warmup=3, min_sample_s=10.0, outputs=outputs)
    assert calls == ["a", "b"] * 2  # one warm-up round, one timed round, one call per sample
    assert {k: len(v) for k, v in times.items()} == {"a": 1, "b": 1} and outputs == {"a": 1, "b": 2}
    monkeypatch.setenv(timing.ROUNDS_VARIABLE, "2")
    assert len(timing.round_robin_times({"a": lambda: None}, repeats=5, warmup=0)["a"]) == 2
    for bad in ("0", "one", "-1", "1.5"):
        monkeypatch.setenv(timing.ROUNDS_VARIABLE, bad)
        with pytest.raises(ValueError, match=rf"MHA_COURSE_TIMING_ROUNDS must be .*{re.escape(repr(bad))}"):
            timing.round_robin_times({"a": lambda: None})
    monkeypatch.delenv(timing.ROUNDS_VARIABLE)
    assert len(timing.round_robin_times({"a": lambda: None}, repeats=3)["a"]) == 3


def test_median_and_iqr():
    assert benchmark.median_and_iqr([1.0, 2.0, 3.0, 4.0, 100.0]) == (3.0, 2.0)
    assert benchmark.median_and_iqr([0.5]) == (0.5, 0.0)


def test_peak_memory_counts_live_tensors_exactly_and_is_silent(capfd):
    mib = 2**20

    def one_at_a_time():
        for _ in range(3):
            torch.ones(mib // 4)  # 1 MiB, freed at once

    def three_at_once():
        return [torch.ones(mib // 4) for _ in range(3)]

    assert memory.peak_memory(one_at_a_time) == mib
    assert memory.peak_memory(three_at_once) == 3 * mib
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""  # the profiler's status lines are silenced


def test_importing_the_benchmark_loads_no_cpp_extension_and_prints_nothing():
    """torch.utils.cpp_extension (pulled in by torch.utils.benchmark) warns on CUDA builds without a
    GPU (Colab's CPU runtime, a plain pip install on a laptop); no module of the package, which a
    notebook may import, may import it."""
    code = (
        "import importlib, pkgutil, sys, mha_course\n"
        "for m in pkgutil.walk_packages(mha_course.__path__, 'mha_course.'):\n"
        "    importlib.import_module(m.name)\n"
        "assert 'torch.utils.cpp_extension' not in sys.modules and 'torch.utils.benchmark' not in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""


def test_the_profiler_based_measures_raise_no_warning():
    """A notebook kernel shows Python warnings under the cell (quiet_c_stderr silences only fd 2,
    so in a terminal they would vanish: record them). torch 2.11's profiler warned on first use
    unless acc_events=True (peak_memory, kernels_inside). A fresh interpreter: torch warns only once per process."""
    code = (
        "import warnings, torch\n"
        "from mha_course.kit.memory import peak_memory\n"
        "from mha_course.lessons.head_layout import kernels_inside\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    for _ in range(2):\n"
        "        peak_memory(lambda: torch.ones(64, 64) @ torch.ones(64, 64))\n"
        "        kernels_inside(lambda: torch.ones(64, 64) @ torch.ones(64, 64))\n"
        "print([str(w.message) for w in caught])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_machine_info_records_versions_threads_and_cpu():
    info = benchmark.machine_info()
    assert info["torch"] == torch.__version__ and info["torch threads"] == torch.get_num_threads()
    assert isinstance(info["CPU"], str) and info["CPU"]


def _fake(ratios):
    rep = benchmark.Report(machine={"torch threads": 1}, matmul_gflops={str(benchmark.QUICK): 100.0})
    for name, ratio in {"torch": 1.0, "torch+weights": 1.0, **ratios}.items():  # the references are measured too
        rep.results.append(
            benchmark.Result(benchmark.QUICK, name, 0.1, 0.01, ratio, ratio - 0.05, ratio + 0.05, 10.0, 0.1)
        )
    return rep


def test_the_fast_variant_is_also_judged_against_pytorchs_plain_path_from_the_same_rounds():
    rep = _fake({"fast+weights": 0.8, "torch+weights plain": 1.0})
    samples = {"fast+weights": [0.8, 0.9, 0.7], "torch+weights plain": [1.0, 0.5, 1.0]}
    for r in rep.results:
        r.samples_s = samples.get(r.name, [1.0, 1.0, 1.0])
    line = next(x for x in benchmark.goal_lines(rep) if "/ torch+weights plain" in x)
    assert line.startswith("✅ passed · fast+weights / torch+weights plain: 0.80×")  # median of 0.8, 1.8, 0.7
    assert "per-round range 0.70–1.80" in line


def test_pytorchs_calls_are_timed_without_autograd_and_the_plain_path_skips_the_native_kernel(monkeypatch):
    from mha_course.lessons.head_layout import kernels_called

    seen = []
    real = benchmark.round_robin_times

    def spy(fns, **kwargs):
        seen.append(torch.is_grad_enabled())
        return real(fns, **kwargs)

    monkeypatch.setattr(benchmark, "round_robin_times", spy)
    benchmark.run([TINY], repeats=1, names=["torch+weights plain"], memory=False, progress=False)
    assert seen == [False]  # inference, as the method says: no autograd graph is built
    fns, _, _ = benchmark.build(TINY)
    with torch.no_grad():
        native = kernels_called(fns["torch+weights"], keep=None)
        plain = kernels_called(fns["torch+weights plain"], keep=None)
    assert any("native_multi_head_attention" in k for k in native)
    assert not any("native_multi_head_attention" in k for k in plain)
    assert torch.backends.mha.get_fastpath_enabled()  # switched back on


def test_goal_lines_judge_each_goal_and_report_the_readable_path():
    lines = benchmark.goal_lines(_fake({"ours+SDPA": 0.62, "fast+weights": 0.95, "ours+weights": 1.3}))
    assert lines[0].startswith("✅ passed · ours+SDPA / torch: 0.62×") and "goal ≤ 1.00×" in lines[0]
    assert lines[1].startswith("❌ failed · fast+weights / torch+weights: 0.95×") and "goal ≤ 0.90×" in lines[1]
    assert lines[2].startswith("ours+weights / torch+weights: 1.30×") and "measured" in lines[2]
    assert benchmark.goal_lines(_fake({"fast+weights": 0.9}))[0].startswith("✅")  # the bound is inclusive
    assert benchmark.goal_lines(_fake({"looped": 3.0})) == []


def test_table_and_json_report_every_result(report, tmp_path):
    text = benchmark.table(report)
    assert str(TINY) in text and text.count("SDPA alone") == 3
    data = json.loads(benchmark.to_json(report))
    assert len(data["results"]) == len(report.results) and data["machine"]["torch"] == torch.__version__
    assert math.isclose(data["results"][0]["median_s"], report.results[0].median_s)


def test_plot_draws_one_line_per_implementation_over_lengths(report):
    fig = benchmark.plot(report, batch=2, causal=True)
    ax1, ax2 = fig.axes
    assert [line.get_label() for line in ax1.lines][-1] == "nn.MultiheadAttention"  # the line at 1
    assert [line.get_label() for line in ax2.lines][-1].startswith("100%")  # the plain matmul's rate
    assert len(ax1.lines) == 7 + 1 and len(ax2.lines) == len(benchmark.IMPLEMENTATIONS) + 1  # + the 2 references
    assert [list(line.get_xdata()) for line in ax2.lines][0] == [12, 24]
    assert "B=2" in fig._suptitle.get_text() and "causal" in fig._suptitle.get_text()
    assert ax1.get_xlabel() == "sequence length L" and "matmul" in ax2.get_ylabel()
    plt.close(fig)


def test_command_line_quick_mode_runs_the_target_and_writes_json(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(benchmark, "QUICK", TINY)
    path = tmp_path / "benchmark.json"
    assert benchmark.main(["--quick", "--repeats", "1", "--no-memory", "--threads", "1", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("machine: device the CPU (") and "torch threads 1" in out
    assert "ours+SDPA / torch:" in out and "fast+weights / torch+weights:" in out and "/ torch plain:" in out
    assert "ours+weights / torch+weights:" in out and "fast+weights / torch+weights plain:" in out
    assert len(json.loads(path.read_text())["results"]) == len(benchmark.IMPLEMENTATIONS)
