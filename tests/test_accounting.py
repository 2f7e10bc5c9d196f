"""Parameter, FLOP and KV-cache accounting against things that can be counted directly:
numel() of real modules (real-sized ones on the meta device), published per-layer counts,
PyTorch's FlopCounterMode on an actual forward pass, and the bytes of real tensors. Also the
MODEL_CONFIGS table against the published configurations."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import mha_course as mc

SETTINGS = settings(max_examples=40, deadline=None, database=None)


def numel(module):
    return sum(p.numel() for p in module.parameters())


@st.composite
def shapes(draw):
    h_kv, n_rep = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    h = h_kv * n_rep
    head_dim = draw(st.integers(1, 6))
    return h * head_dim, h, h_kv, head_dim


@SETTINGS
@given(shapes(), st.booleans())
def test_params_match_numel_of_real_modules(shape, bias):
    d, h, h_kv, hd = shape
    assert mc.count_attention_params(d, h, bias=bias) == numel(nn.MultiheadAttention(d, h, bias=bias))
    assert mc.count_attention_params(d, h, bias=bias) == numel(mc.MultiHeadAttention(d, h, bias=bias))
    assert mc.count_attention_params(d, h, bias=bias) == numel(mc.LoopedMultiHeadAttention(d, h, bias=bias))
    assert mc.count_attention_params(d, h, h_kv, bias=bias) == numel(mc.GroupedQueryAttention(d, h, h_kv, bias=bias))
    # MHA: 4·d² (+ 4·d), whatever the number of heads
    assert mc.count_attention_params(d, h, bias=bias) == 4 * d * d + (4 * d if bias else 0)


@SETTINGS
@given(st.integers(1, 12), shapes(), st.sampled_from([True, False, "qkv"]))
def test_params_with_free_head_dim_and_qkv_bias(d_model, shape, bias):
    _, h, h_kv, hd = shape
    layers = [  # q, k, v, o as in a Llama/Qwen2-style checkpoint
        nn.Linear(d_model, h * hd, bias=bool(bias)),
        nn.Linear(d_model, h_kv * hd, bias=bool(bias)),
        nn.Linear(d_model, h_kv * hd, bias=bool(bias)),
        nn.Linear(h * hd, d_model, bias=bias is True),
    ]
    expected = sum(numel(m) for m in layers)
    assert mc.count_attention_params(d_model, h, h_kv, head_dim=hd, bias=bias) == expected
    if bias != "qkv":
        gqa = mc.GroupedQueryAttention(d_model, h, h_kv, head_dim=hd, bias=bias)
        assert numel(gqa) == expected


def meta_attention(cfg):
    """A real-sized attention layer of this model, on the meta device (no memory allocated)."""
    d, h, h_kv, hd = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    with torch.device("meta"):
        if cfg.attention_bias == "qkv":
            return nn.ModuleDict(
                {
                    "q_proj": nn.Linear(d, h * hd, bias=True),
                    "k_proj": nn.Linear(d, h_kv * hd, bias=True),
                    "v_proj": nn.Linear(d, h_kv * hd, bias=True),
                    "o_proj": nn.Linear(h * hd, d, bias=False),
                }
            )
        return mc.GroupedQueryAttention(d, h, h_kv, head_dim=hd, bias=cfg.attention_bias)


def test_every_model_config_matches_a_real_sized_module_on_meta():
    assert len(mc.MODEL_CONFIGS) >= 16
    for name, cfg in mc.MODEL_CONFIGS.items():
        m = meta_attention(cfg)
        assert all(p.is_meta for p in m.parameters()), name
        assert numel(m) == cfg.params_per_layer, name
        if cfg.num_heads == cfg.num_kv_heads and cfg.num_heads * cfg.head_dim == cfg.d_model:
            with torch.device("meta"):
                tm = nn.MultiheadAttention(cfg.d_model, cfg.num_heads, bias=cfg.attention_bias is True)
            assert numel(tm) == cfg.params_per_layer, name
        assert cfg.params_total == cfg.params_per_layer * cfg.n_attention_modules


# Published per-layer attention parameter counts, each checked by arithmetic:
PUBLISHED_PER_LAYER = {
    # BERT base: 4·768² + 4·768 = 2,359,296 + 3,072 = 2,362,368 (Q, K, V, O weights + biases)
    "BERT base": 2_362_368,
    # GPT-2 small has the same shape as BERT base (c_attn 768x2304 + 2304, c_proj 768x768 + 768)
    "GPT-2 small": 768 * 2304 + 2304 + 768 * 768 + 768,
    # GPT-3 175B: 4·12288² + 4·12288 = 603,979,776 + 49,152 = 604,028,928
    "GPT-3 175B": 604_028_928,
    # Llama 2 7B: 4·4096² = 67,108,864 (no biases, 32 KV heads)
    "Llama 2 7B": 67_108_864,
    # Llama 3 8B: q 4096·4096 = 16,777,216; k, v 4096·1024 = 4,194,304 each; o 16,777,216
    #   -> 41,943,040 (8 KV heads x 128 = 1024 wide K/V projections)
    "Llama 3 8B": 41_943_040,
    "Mistral 7B": 41_943_040,  # the same attention shape as Llama 3 8B
    # Llama 2/3 70B: q, o 8192² = 67,108,864 each; k, v 8192·1024 = 8,388,608 each -> 150,994,944
    "Llama 2 70B": 150_994_944,
    "Llama 3 70B": 150_994_944,
    # Qwen2.5-7B: q 3584² + 3584, k, v 3584·512 + 512 each, o 3584² (no bias)
    #   = 12,845,056 + 3,584 + 2·(1,835,008 + 512) + 12,845,056 = 29,364,736
    "Qwen2.5-7B": 29_364_736,
    # Gemma 2 9B: q 3584·4096 = 14,680,064; k, v 3584·2048 = 7,340,032 each; o 14,680,064 -> 44,040,192
    "Gemma 2 9B": 44_040_192,
}


def test_published_per_layer_counts():
    for name, count in PUBLISHED_PER_LAYER.items():
        assert mc.MODEL_CONFIGS[name].params_per_layer == count, name
    assert mc.count_attention_params(768, 12) == 2_362_368
    assert mc.count_attention_params(4096, 32, 8, bias=False) == 41_943_040


def counted_flops(module, x):
    with FlopCounterMode(display=False) as counter:
        module(x, need_weights=True)
    return counter.get_total_flops()


@settings(SETTINGS, max_examples=15)  # the flop counter costs ~50 ms a forward
@given(st.integers(1, 3), st.integers(1, 7), shapes())
@torch.no_grad()
def test_flops_match_flop_counter_of_a_real_forward(batch, seq_len, shape):
    """FlopCounterMode counts 2·m·n·k per matmul (projections and the two attention bmm's).
    need_weights=True so the attention runs as explicit matmuls: the counter does not count
    the CPU kernel behind F.scaled_dot_product_attention."""
    d, h, h_kv, hd = shape
    x = torch.randn(batch, seq_len, d)
    expected = mc.attention_flops(batch, seq_len, d, h, h_kv)
    assert counted_flops(mc.GroupedQueryAttention(d, h, h_kv), x) == expected
    mha_flops = mc.attention_flops(batch, seq_len, d, h)
    assert mha_flops == 8 * batch * seq_len * d * d + 4 * batch * seq_len**2 * d
    assert counted_flops(mc.MultiHeadAttention(d, h), x) == mha_flops
    assert counted_flops(mc.LoopedMultiHeadAttention(d, h), x) == mha_flops  # h small heads cost the same


@SETTINGS
@given(
    st.integers(1, 3),
    st.integers(1, 4),
    st.integers(1, 6),
    st.integers(0, 7),
    st.integers(1, 2),
    st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8]),
)
def test_kv_cache_bytes_match_real_tensors(num_layers, h_kv, head_dim, seq_len, batch, dtype):
    cache = [  # per layer: K and V, (B, h_kv, L, head_dim)
        (
            torch.zeros(batch, h_kv, seq_len, head_dim, dtype=dtype),
            torch.zeros(batch, h_kv, seq_len, head_dim, dtype=dtype),
        )
        for _ in range(num_layers)
    ]
    real = sum(t.untyped_storage().nbytes() for layer in cache for t in layer)
    itemsize = torch.empty((), dtype=dtype).element_size()
    assert mc.kv_cache_bytes(num_layers, h_kv, head_dim, seq_len, batch=batch, bytes_per_element=itemsize) == real


def test_kv_cache_bytes_published_figures():
    # Llama 3 8B, bf16: 2 · 32 layers · 8 KV heads · 128 · 2 bytes = 131,072 bytes = 128 KiB per token
    assert mc.MODEL_CONFIGS["Llama 3 8B"].kv_cache_bytes(1) == 128 * 1024
    assert mc.MODEL_CONFIGS["Llama 3 8B"].kv_cache_bytes(8192) == 2**30  # 1 GiB at 8k context
    # Llama 2 7B (MHA, 32 KV heads): 4x that, 512 KiB per token
    assert mc.MODEL_CONFIGS["Llama 2 7B"].kv_cache_bytes(1) == 512 * 1024
    assert mc.kv_cache_bytes(32, 8, 128, 0) == 0


# §3 row 03 of the course design, and the published configuration of each model:
# (num_layers, d_model, num_heads, num_kv_heads, head_dim, attention_bias)
PUBLISHED = {
    "Transformer base": (6, 512, 8, 8, 64, True),  # Vaswani et al. 2017, Table 3
    "Transformer big": (6, 1024, 16, 16, 64, True),
    "BERT base": (12, 768, 12, 12, 64, True),  # Devlin et al. 2019
    "BERT large": (24, 1024, 16, 16, 64, True),
    "GPT-2 small": (12, 768, 12, 12, 64, True),  # openai-community/gpt2* config.json
    "GPT-2 medium": (24, 1024, 16, 16, 64, True),
    "GPT-2 large": (36, 1280, 20, 20, 64, True),
    "GPT-2 XL": (48, 1600, 25, 25, 64, True),
    "GPT-3 175B": (96, 12288, 96, 96, 128, True),  # Brown et al. 2020, Table 2.1
    "Llama 2 7B": (32, 4096, 32, 32, 128, False),  # meta-llama/Llama-2-*-hf config.json
    "Llama 2 70B": (80, 8192, 64, 8, 128, False),
    "Llama 3 8B": (32, 4096, 32, 8, 128, False),  # meta-llama/Meta-Llama-3-* config.json
    "Llama 3 70B": (80, 8192, 64, 8, 128, False),
    "Mistral 7B": (32, 4096, 32, 8, 128, False),  # mistralai/Mistral-7B-v0.1 config.json
    "Qwen2.5-7B": (28, 3584, 28, 4, 128, "qkv"),  # Qwen/Qwen2.5-7B config.json; Qwen2 attention
    "Gemma 2 9B": (42, 3584, 16, 8, 256, False),  # google/gemma-2-9b config.json
}


def test_model_configs_match_published_configurations():
    assert set(PUBLISHED) <= set(mc.MODEL_CONFIGS)
    for name, (layers, d, h, h_kv, hd, bias) in PUBLISHED.items():
        cfg = mc.MODEL_CONFIGS[name]
        got = (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.attention_bias)
        assert got == (layers, d, h, h_kv, hd, bias), name
    # encoder-decoder: 6 encoder self + 6 decoder self + 6 decoder cross attention layers
    assert mc.MODEL_CONFIGS["Transformer base"].n_attention_modules == 18
    assert mc.MODEL_CONFIGS["BERT base"].n_attention_modules == 12


def test_model_configs_are_consistent_and_sourced():
    for name, cfg in mc.MODEL_CONFIGS.items():
        assert cfg.name == name
        assert isinstance(cfg.source, str) and cfg.source.strip(), name
        assert cfg.num_heads % cfg.num_kv_heads == 0, name
        assert cfg.attention_bias in (True, False, "qkv"), name
        # head_dim · heads is the model width, except where a model widens its heads on purpose
        if name != "Gemma 2 9B":
            assert cfg.num_heads * cfg.head_dim == cfg.d_model, name
    gemma = mc.MODEL_CONFIGS["Gemma 2 9B"]
    assert gemma.num_heads * gemma.head_dim == 4096 != gemma.d_model
