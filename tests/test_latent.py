"""MLA against transformers' DeepseekV2Attention (an independent implementation), the absorbed
form against the explicit one, the latent cache against one causal pass, and its bytes."""

import pytest
import torch
from transformers import DeepseekV2Config
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention, DeepseekV2RotaryEmbedding

import mha_course as mc
from mha_course.latent import LatentCache, MultiHeadLatentAttention, mla_cache_bytes
from mha_course.positions import apply_rope

SHAPES = [  # d_model, heads, kv_lora_rank, nope, rope, v
    (64, 4, 16, 8, 4, 6),
    (48, 3, 8, 16, 8, 16),
    (32, 1, 24, 4, 2, 12),
]


def pair(d, h, r, nope, rope, v, seed=0):
    torch.manual_seed(seed)
    cfg = DeepseekV2Config(
        hidden_size=d,
        num_attention_heads=h,
        num_key_value_heads=h,
        kv_lora_rank=r,
        q_lora_rank=None,
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        v_head_dim=v,
        num_hidden_layers=1,
        vocab_size=8,
        max_position_embeddings=64,
    )
    cfg._attn_implementation = "eager"
    hf = DeepseekV2Attention(cfg, 0)
    for p in hf.parameters():
        torch.nn.init.normal_(p, std=0.3)
    ours = MultiHeadLatentAttention(d, h, kv_lora_rank=r, qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v)
    ours.load_state_dict(hf.state_dict(), strict=True)
    return cfg, hf, ours


def hf_forward(cfg, hf, x):
    L = x.shape[1]
    pe = DeepseekV2RotaryEmbedding(cfg)(x, torch.arange(L)[None])
    blocked = ~torch.ones(L, L, dtype=torch.bool).tril()
    mask = torch.zeros(1, 1, L, L).masked_fill(blocked, float("-inf"))
    return hf(x, attention_mask=mask, position_embeddings=pe)


@pytest.mark.parametrize("shape", SHAPES)
@torch.no_grad()
def test_matches_transformers_deepseek_v2(shape):
    cfg, hf, ours = pair(*shape)
    x = torch.randn(2, 11, shape[0])
    ref, ref_w = hf_forward(cfg, hf, x)
    out, w = ours(x)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(w, ref_w, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("shape", SHAPES)
@torch.no_grad()
def test_absorbed_equals_explicit(shape):
    _, _, ours = pair(*shape, seed=1)
    ours = ours.double()
    x = torch.randn(3, 9, shape[0], dtype=torch.float64)
    explicit, w1 = ours(x)
    absorbed, w2 = ours(x, absorb=True)
    torch.testing.assert_close(absorbed, explicit, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(w2, w1, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("absorb", [False, True])
@torch.no_grad()
def test_cached_decoding_equals_one_causal_pass(absorb):
    cfg, hf, ours = pair(*SHAPES[0], seed=2)
    x = torch.randn(2, 12, SHAPES[0][0])
    ref, _ = hf_forward(cfg, hf, x)
    cache = LatentCache()
    outs = [ours(x[:, :5], cache=cache, absorb=absorb)[0]]
    outs += [ours(x[:, t : t + 1], cache=cache, absorb=absorb)[0] for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(outs, dim=1), ref, atol=2e-5, rtol=1e-4)
    assert cache.length == 12


def test_cache_bytes_measured_equal_formula():
    d, h, r, nope, rope, v = 64, 4, 16, 8, 4, 6
    layers = [
        MultiHeadLatentAttention(d, h, kv_lora_rank=r, qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v)
        for _ in range(3)
    ]
    caches = [LatentCache() for _ in layers]
    x = torch.randn(2, 7, d)
    with torch.no_grad():
        for layer, cache in zip(layers, caches, strict=True):
            layer(x, cache=cache)
    measured = sum(c.nbytes for c in caches)
    assert measured == mla_cache_bytes(3, r, rope, 7, batch=2, bytes_per_element=4) == 3 * (16 + 4) * 7 * 2 * 4


def test_cache_bytes_formula_independent_of_heads_and_value_width():
    # DeepSeek-V2: d_c = 512, d_R = 64 -> 576 elements per token and layer (paper, Table 1: (d_c + d_h^R) l)
    assert mla_cache_bytes(1, 512, 64, 1, bytes_per_element=1) == 576
    assert mla_cache_bytes(60, 512, 64, 1000, batch=2) == 60 * 576 * 1000 * 2 * 2


def test_rope_interleaved_equals_complex_rotation():
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    pos = torch.arange(5)
    inv = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    z = torch.view_as_complex(x.reshape(3, 5, 4, 2).contiguous()) * torch.polar(
        torch.ones(5, 4, dtype=torch.float64), pos[:, None] * inv
    )
    torch.testing.assert_close(apply_rope(x, pos, layout="interleaved"), torch.view_as_real(z).reshape(3, 5, 8))
    # a rotation: norms of pairs are kept, and scores depend only on the relative position
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    s = [
        apply_rope(q[None], torch.tensor([a]), layout="interleaved")[0]
        @ apply_rope(k[None], torch.tensor([b]), layout="interleaved")[0]
        for a, b in ((3, 1), (10, 8))
    ]
    torch.testing.assert_close(s[0], s[1])


def test_configs_mla_cache_bytes_match_formula():
    lite = mc.configs.LATENT_MODEL_CONFIGS["DeepSeek-V2-Lite"]
    assert (lite.num_layers, lite.d_model, lite.num_heads, lite.kv_lora_rank, lite.qk_rope_head_dim) == (
        27,
        2048,
        16,
        512,
        64,
    )
    assert lite.kv_cache_bytes(1000) == 27 * 576 * 1000 * 2
    gqa = mc.MODEL_CONFIGS["Llama 3 8B"]
    assert gqa.kv_cache_bytes(10) == mc.kv_cache_bytes(32, 8, 128, 10)


@pytest.mark.parametrize(
    "kwargs, err",
    [
        ({"kv_lora_rank": 0}, ValueError),
        ({"qk_rope_head_dim": 3}, ValueError),
        ({"v_head_dim": 2.0}, TypeError),
    ],
)
def test_bad_arguments(kwargs, err):
    args = {"kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 4} | kwargs
    with pytest.raises(err, match=next(iter(kwargs))):
        MultiHeadLatentAttention(16, 2, **args)


def test_bad_inputs():
    layer = MultiHeadLatentAttention(16, 2, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4)
    with pytest.raises(ValueError, match="d_model=16"):
        layer(torch.randn(1, 3, 12))
    with pytest.raises(TypeError, match="LatentCache"):
        layer(torch.randn(1, 3, 16), cache=mc.KVCache())


@pytest.mark.parametrize("heads, q_len", [(4, 1), (16, 2), (128, 1)])
def test_decode_intensity_counts_what_the_kernels_do(heads, q_len):
    """FLOPs counted by PyTorch's FlopCounterMode on the two forms' attention matmuls, bytes from
    the tensors they read."""
    from torch.utils.flop_counter import FlopCounterMode

    from mha_course.latent import decode_intensity

    r, rope, nope, dv, T = 32, 8, 16, 16, 50
    with torch.device("meta"):
        q_latent = torch.empty(heads, q_len, r + rope, dtype=torch.bfloat16)
        cache = torch.empty(T, r + rope, dtype=torch.bfloat16)  # [c_KV ; k_R] per token
        q = torch.empty(heads, q_len, nope + rope, dtype=torch.bfloat16)
        k = torch.empty(heads, T, nope + rope, dtype=torch.bfloat16)
        v = torch.empty(heads, T, dv, dtype=torch.bfloat16)
        with FlopCounterMode(display=False) as absorbed:
            w = q_latent @ cache.T  # (h, q_len, T)
            _ = w @ cache[:, :r]  # (h, q_len, r)
        with FlopCounterMode(display=False) as explicit:
            w = q @ k.transpose(1, 2)
            _ = w @ v
    args = dict(kv_lora_rank=r, qk_rope_head_dim=rope, qk_nope_head_dim=nope, v_head_dim=dv, q_len=q_len)
    got = decode_intensity(heads, **args)
    assert got == pytest.approx(absorbed.get_total_flops() / (cache.numel() * 2), rel=1e-12)
    got = decode_intensity(heads, absorbed=False, **args)
    assert got == pytest.approx(explicit.get_total_flops() / ((k.numel() + v.numel()) * 2), rel=1e-12)
    assert got == pytest.approx(q_len)  # 2 FLOPs per number, 2 bytes per number


def test_decode_intensity_bad_input():
    from mha_course.latent import decode_intensity

    with pytest.raises(ValueError, match="num_heads"):
        decode_intensity(0)
