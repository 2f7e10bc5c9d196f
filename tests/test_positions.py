"""RoPE, ALiBi and sinusoidal positions against independent references: transformers' Llama
rotary code, the complex-number formulation of RoPE, the formulas written out with loops."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import mha_course as mc
from mha_course import positions as P

llama = pytest.importorskip("transformers.models.llama.modeling_llama")


@pytest.mark.parametrize("theta", [10000.0, 500000.0, 100.0])
@pytest.mark.parametrize("head_dim", [2, 8, 64])
def test_frequencies_are_theta_to_the_minus_2i_over_d(theta, head_dim):
    expected = torch.tensor([theta ** (-2 * i / head_dim) for i in range(head_dim // 2)], dtype=torch.float64)
    assert torch.allclose(P.rope_frequencies(head_dim, theta).double(), expected, rtol=1e-6)


@pytest.mark.parametrize("theta", [10000.0, 100000.0])
@pytest.mark.parametrize("shape", [(2, 3, 7, 16), (1, 9, 5, 64), (4, 2)])
def test_apply_rope_equals_transformers_apply_rotary_pos_emb(theta, shape):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(*shape, generator=g, dtype=torch.float64)
    k = torch.randn(*shape, generator=g, dtype=torch.float64)
    L, d = shape[-2:]
    positions = torch.randint(0, 5000, (L,), generator=g)
    config = llama.LlamaConfig(hidden_size=d, num_attention_heads=1, head_dim=d, rope_theta=theta)
    cos, sin = llama.LlamaRotaryEmbedding(config)(q, positions[None])  # (1, L, d), HF's own angles
    hf_q, hf_k = llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0 if q.dim() == 2 else 1)
    assert torch.allclose(P.apply_rope(q, positions, theta=theta), hf_q, atol=1e-12, rtol=0)
    assert torch.allclose(P.apply_rope(k, positions, theta=theta), hf_k, atol=1e-12, rtol=0)


def test_interleaved_layout_is_multiplication_by_a_complex_exponential():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 9, 12, generator=g, dtype=torch.float64)
    positions = torch.arange(3, 12)
    angles = positions[:, None].double() * P.rope_frequencies(12, 10000.0).double()  # (L, 6)
    z = torch.view_as_complex(x.unflatten(-1, (6, 2)).contiguous()) * torch.polar(torch.ones_like(angles), angles)
    expected = torch.view_as_real(z).flatten(-2)
    assert torch.allclose(P.apply_rope(x, positions, layout="interleaved"), expected, atol=1e-6)  # float32 angles


def test_half_layout_loop_reference():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 8, generator=g, dtype=torch.float64)
    out = P.apply_rope(x, torch.arange(5), theta=50.0)
    for p in range(5):
        for i in range(4):
            a = p * 50.0 ** (-2 * i / 8)
            x1, x2 = x[p, i], x[p, i + 4]
            assert abs(out[p, i] - (x1 * math.cos(a) - x2 * math.sin(a))) < 1e-6
            assert abs(out[p, i + 4] - (x2 * math.cos(a) + x1 * math.sin(a))) < 1e-6


@pytest.mark.parametrize("layout", P.LAYOUTS)
def test_scores_depend_on_the_offset_only(layout):
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 32, generator=g, dtype=torch.float64), torch.randn(1, 32, generator=g, dtype=torch.float64)

    def score(m, n):
        return (P.apply_rope(q, [m], layout=layout) * P.apply_rope(k, [n], layout=layout)).sum().item()

    for offset in (0, 1, 7, 100):
        scores = [score(start + offset, start) for start in (0, 13, 500, 4000)]
        assert max(scores) - min(scores) < 1e-3 * (1 + abs(scores[0]))
    assert abs(score(10, 0) - score(0, 10)) > 1e-3  # the sign of the offset matters


def test_rope_preserves_norms_and_position_zero_is_identity():
    x = torch.randn(3, 6, 16, dtype=torch.float64)
    rotated = P.apply_rope(x, torch.arange(100, 106))
    assert torch.allclose(rotated.norm(dim=-1), x.norm(dim=-1))
    assert torch.equal(P.apply_rope(x, torch.zeros(6, dtype=torch.long)), x)


def test_permuting_wq_wk_rows_ports_interleaved_to_half_and_the_plain_port_fails():
    torch.manual_seed(4)
    d, h, hd, L = 32, 4, 8, 10
    wq, wk = torch.randn(h * hd, d, dtype=torch.float64), torch.randn(h * hd, d, dtype=torch.float64)
    x = torch.randn(2, L, d, dtype=torch.float64)
    pos = torch.arange(L)

    def scores(wq, wk, layout):
        q = (x @ wq.T).unflatten(-1, (h, hd)).transpose(1, 2)  # (B, h, L, hd)
        k = (x @ wk.T).unflatten(-1, (h, hd)).transpose(1, 2)
        return P.apply_rope(q, pos, layout=layout) @ P.apply_rope(k, pos, layout=layout).transpose(-1, -2)

    meta = scores(wq, wk, "interleaved")
    ported = scores(P.permute_rows_for_half(wq, h), P.permute_rows_for_half(wk, h), "half")
    plain = scores(wq, wk, "half")
    assert torch.allclose(ported, meta, atol=1e-10)
    assert (plain - meta).abs().max() > 0.1
    perm = P.interleaved_to_half(8)
    assert perm.tolist() == [0, 2, 4, 6, 1, 3, 5, 7]


def test_rotary_embedding_module_starts_at_the_given_position():
    rope = P.RotaryEmbedding(16, 1000.0)
    x = torch.randn(2, 3, 5, 16)
    assert torch.equal(rope(x, 7), P.apply_rope(x, torch.arange(7, 12), theta=1000.0))
    assert "theta=1000" in repr(rope)


def test_sinusoidal_positions_formula():
    pe = P.sinusoidal_positions(7, 10)
    for p in range(7):
        for i in range(5):
            w = 10000.0 ** (-2 * i / 10)
            assert abs(pe[p, 2 * i] - math.sin(p * w)) < 1e-5 and abs(pe[p, 2 * i + 1] - math.cos(p * w)) < 1e-5


def test_alibi_slopes_match_the_paper():
    assert torch.allclose(P.alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    s6 = P.alibi_slopes(6)  # 4 slopes of 4 heads + slopes 1, 3 of 8 heads
    expected = [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]
    assert torch.allclose(s6, torch.tensor(expected, dtype=torch.float32))


def test_alibi_bias_is_a_float_mask_for_sdpa():
    h, L = 4, 6
    bias = P.alibi_bias(h, L)
    slopes = P.alibi_slopes(h)
    for i in range(L):
        for j in range(L):
            expected = -float(slopes[0]) * (i - j) if j <= i else float("-inf")
            assert bias[0, i, j].item() == pytest.approx(expected)
    q, k, v = (torch.randn(1, h, L, 8) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8) + bias, dim=-1)
    assert torch.allclose(out, w @ v, atol=1e-5)
    assert torch.equal(P.alibi_bias(h, 2, 6), bias[:, 4:])  # the last 2 queries: bottom-right aligned


def test_gqa_with_rope_cached_decoding_equals_full_recomputation():
    torch.manual_seed(5)
    layer = mc.GroupedQueryAttention(48, 6, 2).double()
    rope = P.RotaryEmbedding(8, 10000.0)
    x = torch.randn(2, 9, 48, dtype=torch.float64)
    full, _ = layer(x, is_causal=True, rope=rope)
    cache = mc.KVCache()
    steps = [layer(x[:, :4], cache=cache, is_causal=True, rope=rope)[0]]
    steps += [layer(x[:, t : t + 1], cache=cache, is_causal=True, rope=rope)[0] for t in range(4, 9)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-12)
    # the cache holds rotated keys
    k = layer.k_proj(x).unflatten(-1, (2, 8)).transpose(1, 2)
    assert torch.allclose(cache.keys, P.apply_rope(k, torch.arange(9)), atol=1e-12)


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: P.apply_rope(torch.randn(3, 5), torch.arange(3)), "head_dim must be even"),
        (lambda: P.apply_rope(torch.randn(3, 4), torch.arange(2)), "positions has 2 entries"),
        (lambda: P.apply_rope(torch.randn(3, 4), torch.arange(3.0)), "integer"),
        (lambda: P.apply_rope(torch.randn(3, 4), torch.arange(3), layout="complex"), "layout must be one of"),
        (lambda: P.rope_frequencies(8, -1.0), "theta must be positive"),
        (lambda: P.alibi_bias(4, 5, 3), "q_len"),
        (lambda: P.permute_rows_for_half(torch.randn(10, 4), 3), "multiple of num_heads"),
    ],
)
def test_bad_input_is_named(call, error):
    with pytest.raises((ValueError, TypeError), match=error):
        call()


ACCELERATORS = [
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")),
]


@pytest.mark.parametrize("device", ["meta", *ACCELERATORS])
def test_positions_and_the_decoder_compute_on_the_inputs_device(device):
    x = torch.randn(2, 3, 5, 8, device=device)
    assert P.apply_rope(x, torch.arange(5, device=device)).device.type == device
    assert P.RotaryEmbedding(8)(x, 4).device.type == device
    assert P.alibi_bias(4, 5, device=device).device.type == device
    with torch.device(device):
        model = mc.LlamaDecoder(mc.DecoderConfig(50, 16, 2, 4, 2, 32, tie_embeddings=True))
    ids = torch.randint(0, 50, (2, 5), device=device)
    caches = model.new_caches()
    assert model(ids, caches).device.type == device and caches[0].length == 5
    if device != "meta":  # values exist: the device agrees with the CPU
        cpu = mc.LlamaDecoder(model.config)
        cpu.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
        assert torch.allclose(model(ids).cpu(), cpu(ids.cpu()), atol=1e-4)
