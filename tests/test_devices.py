"""The package computes wherever its inputs are: on the meta device (shapes only, no values), on
the CPU, and on every accelerator this machine has (those tests skip, saying so, when there is none).
"""

from __future__ import annotations

import pytest
import torch

import mha_course as mc
from mha_course import cache_schemes, device_check, tiled
from mha_course.block import Encoder
from mha_course.fast import FastMultiHeadAttention

ACCELERATORS = [
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")),
    pytest.param(
        "mps",
        marks=pytest.mark.skipif(
            not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()),
            reason="no Apple MPS device here",
        ),
    ),
]


def run_public_api(device: str, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """Every public module and function once, with inputs made on ``device``; returns the results."""
    B, L, d, h = 2, 6, 16, 4

    def randn(*shape):
        return torch.randn(*shape, dtype=dtype, device=device)

    out = {}
    q, k, v = randn(B, h, L, d // h), randn(B, h, L, d // h), randn(B, h, L, d // h)
    causal = mc.causal_mask(L, device=device)
    out["sdpa"], out["weights"] = mc.scaled_dot_product_attention(q, k, v, causal)
    out["tiled"] = tiled.tiled_attention(q, k, v, causal, block_size=4)
    out["window"] = mc.sliding_window_mask(L, 3, device=device)
    x = randn(B, L, d)
    out["split"] = mc.merge_heads(mc.split_heads(x, h))
    pad = mc.padding_mask(torch.tensor([L, 3], device=device), L)
    with torch.device(device):
        mha, looped = mc.MultiHeadAttention(d, h), mc.LoopedMultiHeadAttention(d, h)
        gqa, enc = mc.GroupedQueryAttention(d, h, 2), Encoder(2, d, h, 2 * d)
        fast = FastMultiHeadAttention(d, h)
    for m in (mha, looped, gqa, enc, fast):
        m.to(dtype)
    out["mha"], out["mha_w"] = mha(x, mask=pad)
    out["mha_sdpa"], _ = mha(x, mask=pad, need_weights=False)
    out["looped"], _ = looped(x, mask=causal)
    out["fast"], out["fast_w"] = fast(x, mask=pad)
    out["fast_cross"], _ = fast(x, randn(B, L + 1, d), mask=None)
    out["gqa"], _ = gqa(x, is_causal=True)
    cache = mc.KVCache()
    out["gqa_step"], _ = gqa(x[:, :1], cache=cache, is_causal=True)
    out["repeat"] = mc.repeat_kv(k, 2)
    out["encoder"] = enc(x, mask=pad)
    out.update(run_positions_decoders_and_caches(device, dtype, randn))
    return out


def run_positions_decoders_and_caches(device: str, dtype, randn) -> dict[str, torch.Tensor]:
    """Notebooks 11 and 12's public API: positions, the Llama decoder, latent attention, the caches."""
    B, L, d, h, hd = 2, 6, 16, 4, 4
    out = {"sinusoidal": mc.sinusoidal_positions(L, d, device=device).to(dtype)}  # float32 by definition
    out["alibi"] = mc.alibi_bias(h, L, device=device).to(dtype)
    out["rope"] = mc.apply_rope(randn(B, h, L, hd), torch.arange(L, device=device))
    config = mc.DecoderConfig(vocab_size=50, d_model=d, num_layers=2, num_heads=h, num_kv_heads=2, d_ff=2 * d)
    with torch.device(device):
        rotary = mc.RotaryEmbedding(hd)
        gqa = mc.GroupedQueryAttention(d, h, 2)
        decoder = mc.LlamaDecoder(config)
        mla = mc.MultiHeadLatentAttention(d, h, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4)
        ids = torch.zeros(B, L, dtype=torch.long)
    for m in (rotary, gqa, decoder, mla):
        m.to(dtype)
    x = randn(B, L, d)
    out["gqa_rope"], _ = gqa(x, cache=mc.KVCache(), is_causal=True, rope=rotary)
    out["logits"] = decoder(ids, caches=[mc.KVCache() for _ in range(config.num_layers)])
    out["mla"], _ = mla(x, cache=mc.LatentCache())
    out["mla_absorbed"], _ = mla(x, cache=mc.LatentCache(), absorb=True)
    out["sink_window"], _ = cache_schemes.decode_with_sink_window(*(randn(B, 2, L, hd) for _ in range(3)), 3, 1)
    paged = mc.PagedKVCache(4, 2, 2, hd, dtype=dtype, device=device)
    paged.append(0, randn(2, 3, hd), randn(2, 3, hd))
    out["paged_k"], out["paged_v"] = paged.gather(0)
    int8 = mc.Int8KVCache()
    out["int8_k"], out["int8_v"] = int8.update(randn(B, 2, L, hd), randn(B, 2, L, hd))
    return out


def test_the_whole_public_api_runs_on_the_meta_device():
    results = run_public_api("meta")
    wrong = {name: t.device.type for name, t in results.items() if t.device.type != "meta"}
    assert not wrong, f"created on another device inside the package: {wrong}"
    assert results["mha"].shape == (2, 6, 16) and results["mha_w"].shape == (2, 4, 6, 6)


def test_the_whole_public_api_runs_on_the_cpu_in_float64():
    results = run_public_api("cpu", torch.float64)
    assert all(t.device.type == "cpu" for t in results.values())
    assert all(t.dtype in (torch.float64, torch.bool) for t in results.values())


@pytest.mark.parametrize("device", ACCELERATORS)
def test_the_whole_public_api_runs_on_an_accelerator_and_matches_pytorch(device):
    results = run_public_api(device)
    assert all(t.device.type == device for t in results.values())
    lines, ok = device_check.report(device)
    assert ok, "\n".join(lines)


def test_device_check_reports_each_comparison_and_passes_here(capsys):
    assert device_check.main(["--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("device: cpu") and "no accelerator" in lines[1]
    assert sum(line.startswith("✅") for line in lines) == 7 * len(device_check.dtypes_for(torch.device("cpu")))


def test_device_check_fails_when_a_result_is_off(monkeypatch):
    honest = device_check.comparisons

    def broken(device, dtype, *, seed=0):
        for name, got, expected in honest(device, dtype, seed=seed):
            yield name, got + 1e-2, expected

    monkeypatch.setattr(device_check, "comparisons", broken)
    lines, ok = device_check.report("cpu")
    assert not ok and any(line.startswith("❌") for line in lines)


def test_mc_device_is_the_best_available():
    expected = "cuda" if torch.cuda.is_available() else None
    assert isinstance(mc.device(), torch.device)
    if expected:
        assert mc.device().type == expected
    elif not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        assert mc.device().type == "cpu"


def test_timing_device_is_the_cpu_unless_asked(monkeypatch):
    from mha_course.kit import setup

    monkeypatch.delenv(setup.TIMING_DEVICE_VARIABLE, raising=False)
    assert setup.timing_device() == torch.device("cpu")
    monkeypatch.setenv(setup.TIMING_DEVICE_VARIABLE, "auto")
    assert setup.timing_device() == mc.device()
    if not torch.cuda.is_available():
        monkeypatch.setenv(setup.TIMING_DEVICE_VARIABLE, "cuda")
        with pytest.raises(ValueError, match="no CUDA device"):
            setup.timing_device()


def test_timings_name_their_device_and_wait_for_it(monkeypatch):
    from mha_course.kit import timing

    assert timing.device_label("cpu", num_threads=1) == f"the CPU ({timing.cpu_model()}), 1 thread"
    assert timing.device_label(None, num_threads=3).endswith(", 3 threads")
    assert timing.device_label("mps").startswith("Apple MPS")
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(torch.device(device)))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    assert timing.device_label("cuda") == "CUDA (Test GPU)"
    timing.synchronize("cpu")
    assert waited == []  # nothing to wait for on the CPU
    calls = []
    times = timing.round_robin_times({"f": lambda: calls.append(len(waited))}, repeats=2, device="cuda")
    assert len(times["f"]) == 2 and len(calls) == 3
    assert calls == [1, 3, 5]  # before every call the queue is drained, and again before the clock stops
    assert len(waited) == 6 and all(d.type == "cuda" for d in waited)


def test_the_benchmark_runs_where_it_is_told_and_measures_memory_only_on_the_cpu():
    from mha_course.lessons import benchmark

    tiny = benchmark.Config(1, 8, 16, 2)
    report = benchmark.run([tiny], repeats=1, names=["fast+weights"], progress=False, device="cpu")
    assert report.machine["device"].startswith("the CPU (")
    assert all(r.alloc_bytes for r in report.results) and all(r.max_abs_error < 1e-5 for r in report.results)
    fns, _, _ = benchmark.build(tiny, device="meta")  # every tensor of the benchmark follows the device
    with torch.no_grad():
        out, weights = fns["fast+weights"]()
    assert out.device.type == weights.device.type == "meta" and weights.shape == (1, 2, 8, 8)


@pytest.mark.parametrize("device", ACCELERATORS)
def test_the_benchmark_on_an_accelerator_checks_its_outputs_and_skips_memory(device):
    from mha_course.lessons import benchmark

    report = benchmark.run([benchmark.Config(1, 16, 16, 2)], repeats=1, progress=False, device=device)
    assert all(r.alloc_bytes is None and r.max_abs_error < 1e-3 for r in report.results)
    assert device.upper() in report.machine["device"] or "MPS" in report.machine["device"]


def test_every_timing_cell_of_04_06_09_runs_on_the_timing_device_and_names_it():
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "notebooks"
    timed = 0
    for path in sorted(root.glob("0[469]_*.ipynb")):
        before = ""  # the code cell before this one (where a timing cell's set-up may live)
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            before, setup = source, before + source
            if not ("median_times(" in source or "benchmark.run(" in source):
                continue
            timed += 1
            where = f"{path.name}: {source.splitlines()[0]}"
            assert "device=" in source, f"{where} times without device="
            assert "timing_device()" in setup, f"{where} does not ask timing_device() where to run"
            named = "device_label(" in source or "benchmark.run(" in source  # the benchmark's first line names it
            assert named, f"{where} does not name its device"
    assert timed == 7  # 04: one; 06: two; 09: sections 5, 6, 7 and the benchmark
