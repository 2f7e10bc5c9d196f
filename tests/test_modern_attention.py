"""Today's attention additions against transformers 5 on tiny random configs: soft-capped
scores (Gemma 2), QK-norm (Qwen3), the output gate (Qwen3-Next), sinks and sliding windows
(gpt-oss), and ``mc.attention_from_hf`` for each supported family."""

import math

import pytest
import torch
from torch import nn

import mha_course as mc

transformers = pytest.importorskip("transformers")
masking = pytest.importorskip("transformers.masking_utils")
gemma2 = pytest.importorskip("transformers.models.gemma2.modeling_gemma2")

lesson = pytest.importorskip("mha_course.lessons.modern_layers")


def _configs():
    """Tiny random configs of the supported families (no weights are downloaded): the notebook's
    five, plus a plain-RoPE Llama with one K/V head (MQA)."""
    configs = lesson.tiny_configs()
    mqa = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=1,
        num_hidden_layers=1,
    )
    mqa._attn_implementation = "eager"
    return configs | {"Llama MQA": mqa}


def _model(name, dtype, seed):
    return lesson.tiny_model(_configs()[name], seed=seed).to(dtype)


CASES = [
    ("Llama MQA", 0),
    ("Llama 3.1", 0),  # llama3 rope scaling
    ("Qwen3", 0),
    ("Qwen3-Next", 3),  # the full-attention layer (layers 0–2 are Gated DeltaNet)
    ("Gemma 2", 0),  # sliding
    ("Gemma 2", 1),  # global
    ("gpt-oss", 0),  # sliding, YaRN, sinks, biases
    ("gpt-oss", 1),  # full
]


@pytest.mark.parametrize("name,layer_idx", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_attention_from_hf_equals_the_transformers_module(name, layer_idx, dtype):
    model = _model(name, dtype, seed=layer_idx + 7)
    hf_attn = model.model.layers[layer_idx].self_attn
    ours = mc.attention_from_hf(hf_attn, model.config)
    g = torch.Generator().manual_seed(3)
    for B, L in [(2, 11), (1, 6)]:
        x = torch.randn(B, L, 32, generator=g, dtype=dtype)
        with torch.no_grad():
            ref = lesson.hf_attention_output(model, layer_idx, x)
            out, _ = ours(x, is_causal=True)
            fast, _ = ours(x, is_causal=True, need_weights=False)
        # transformers runs RMSNorm, RoPE angles and (Gemma 2) the softmax in float32 even for float64
        tol = 2e-6 if dtype == torch.float64 else 2e-5
        torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
        torch.testing.assert_close(fast, ref, atol=tol, rtol=tol)
        assert ref.abs().max() > 0.1  # a real output, not all zeros


def test_the_reference_uses_transformers_own_masks():
    """The sliding layers' mask (from transformers.masking_utils) is the course's window mask."""
    for L, window in [(9, 4), (6, 1)]:
        fn = masking.sliding_window_causal_mask_function(window)
        allowed = fn(0, 0, torch.arange(L)[:, None], torch.arange(L)[None, :])
        assert torch.equal(allowed, mc.sliding_window_mask(L, window))


def test_attention_from_hf_reads_each_family_s_options():
    seen = {}
    for name, layer_idx in CASES:
        model = _model(name, torch.float32, seed=0)
        ours = mc.attention_from_hf(model.model.layers[layer_idx].self_attn, model.config)
        seen[name, layer_idx] = (
            ours.q_norm is not None,
            ours.output_gate,
            ours.softcap,
            ours.window,
            ours.sinks is not None,
            ours.rope.rotary_dim,
            round(ours.scale, 4),
        )
    assert seen["Llama MQA", 0] == (False, False, None, None, False, 8, round(8**-0.5, 4))
    assert seen["Qwen3", 0] == (True, False, None, None, False, 16, 0.25)
    assert seen["Qwen3-Next", 3] == (True, True, None, None, False, 4, 0.25)  # partial_rotary_factor 0.25
    assert seen["Gemma 2", 0] == (False, False, 5.0, 4, False, 16, round(24**-0.5, 4))
    assert seen["Gemma 2", 1] == (False, False, 5.0, None, False, 16, round(24**-0.5, 4))
    assert seen["gpt-oss", 0][3:5] == (4, True) and seen["gpt-oss", 1][3:5] == (None, True)


def test_attention_from_hf_rejects_other_modules():
    with pytest.raises(TypeError, match="LlamaAttention.*Gemma2Attention.*GptOssAttention.*got Linear"):
        mc.attention_from_hf(nn.Linear(4, 4), _configs()["Qwen3"])
    model = _model("Qwen3", torch.float32, 0)
    with pytest.raises(TypeError, match="hf_config"):
        mc.attention_from_hf(model.model.layers[0].self_attn, {"hidden_size": 32})


# ---- soft-capping -----------------------------------------------------------------------------


def _gemma2_eager(q, k, v, mask, scaling, softcap):
    module = nn.Module()
    module.num_key_value_groups, module.training, module.head_dim = 1, False, q.shape[-1]
    additive = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, torch.finfo(q.dtype).min)
    out, w = gemma2.eager_attention_forward(module, q, k, v, additive, scaling=scaling, softcap=softcap)
    return out.transpose(1, 2), w


@pytest.mark.parametrize("shape", [(2, 3, 7, 8), (1, 2, 12, 16)])
@pytest.mark.parametrize("softcap", [50.0, 2.0, 0.5])
@pytest.mark.parametrize("window", [None, 3])
def test_softcap_equals_gemma2_eager_attention(shape, softcap, window):
    B, h, L, d = shape
    g = torch.Generator().manual_seed(L + d)
    q, k, v = (3 * torch.randn(B, h, L, d, generator=g, dtype=torch.float64) for _ in range(3))
    mask = mc.causal_mask(L) if window is None else mc.sliding_window_mask(L, window)
    scale = 24**-0.5
    ref_out, ref_w = _gemma2_eager(q, k, v, mask, scale, softcap)
    out, w = mc.scaled_dot_product_attention(q, k, v, mask, scale=scale, softcap=softcap)
    torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=0)  # Gemma 2's softmax runs in float32
    torch.testing.assert_close(out, ref_out, atol=5e-6, rtol=0)  # |v| up to ~10


def test_softcap_by_hand():
    """Two keys with scores 3 and −1 under cap 2: weights softmax(2·tanh(1.5), 2·tanh(−0.5))."""
    q = torch.tensor([[[3.0, -1.0]]], dtype=torch.float64)  # (1, 1, 2): scale 1 makes q·k the score
    k = torch.eye(2, dtype=torch.float64)[None]  # (1, 2, 2)
    v = torch.tensor([[[1.0], [0.0]]], dtype=torch.float64)  # (1, 2, 1)
    _, w = mc.scaled_dot_product_attention(q, k, v, scale=1.0, softcap=2.0)
    a, b = 2 * math.tanh(1.5), 2 * math.tanh(-0.5)
    expected = torch.tensor([math.exp(a), math.exp(b)], dtype=torch.float64) / (math.exp(a) + math.exp(b))
    torch.testing.assert_close(w[0, 0], expected, atol=1e-15, rtol=0)
    # a masked key stays masked (capping after the mask would give it the score −cap instead)
    _, w = mc.scaled_dot_product_attention(q, k, v, torch.tensor([[True, False]]), scale=1.0, softcap=2.0)
    assert w[0, 0].tolist() == [1.0, 0.0]


def test_softcap_bounds_the_scores_and_large_cap_changes_nothing():
    g = torch.Generator().manual_seed(0)
    q, k, v = (10 * torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    _, w_plain = mc.scaled_dot_product_attention(q, k, v)
    _, w_big = mc.scaled_dot_product_attention(q, k, v, softcap=1e6)
    torch.testing.assert_close(w_big, w_plain, atol=1e-9, rtol=0)
    _, w_cap = mc.scaled_dot_product_attention(q, k, v, softcap=1.0)
    # scores within (−1, 1): no weight can exceed e^1 / (e^1 + (Lk−1)·e^−1)
    assert w_cap.max() < math.e / (math.e + 4 / math.e)


def test_softcap_works_with_sinks():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g, dtype=torch.float64) for _ in range(3))
    sinks = torch.tensor([0.5, -1.0], dtype=torch.float64)
    _, w = mc.scaled_dot_product_attention(q, k, v, mc.causal_mask(4), sinks=sinks, softcap=3.0)
    s = 3.0 * torch.tanh((q @ k.transpose(-1, -2)) / math.sqrt(8) / 3.0)  # capped scores
    s = s.masked_fill(~mc.causal_mask(4), float("-inf"))
    e, e_sink = s.exp(), sinks.exp()[:, None, None]
    torch.testing.assert_close(w, e / (e.sum(-1, keepdim=True) + e_sink), atol=1e-14, rtol=0)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan")])
def test_softcap_must_be_positive(bad):
    x = torch.randn(1, 3, 4)
    with pytest.raises(ValueError, match="softcap must be a positive"):
        mc.scaled_dot_product_attention(x, x, x, softcap=bad)
    with pytest.raises(ValueError, match="softcap must be a positive"):
        mc.GroupedQueryAttention(8, 2, 1, softcap=bad)


def test_softcap_type_error():
    x = torch.randn(1, 3, 4)
    with pytest.raises(TypeError, match="softcap must be None or a positive float, got str"):
        mc.scaled_dot_product_attention(x, x, x, softcap="30")


# ---- QK-norm and the output gate, against independent loops --------------------------------------


def _loop_reference(layer, x):
    """One head at a time, written from the definitions (no shared code with the layer)."""
    B, L, _ = x.shape
    hd, h, n_rep = layer.head_dim, layer.num_heads, layer.n_rep
    qg = x @ layer.q_proj.weight.T
    k_all, v_all = x @ layer.k_proj.weight.T, x @ layer.v_proj.weight.T
    heads = []
    for i in range(h):
        if layer.output_gate:
            q, gate = qg[..., 2 * hd * i : 2 * hd * i + hd], qg[..., 2 * hd * i + hd : 2 * hd * (i + 1)]
        else:
            q, gate = qg[..., hd * i : hd * (i + 1)], None
        j = i // n_rep
        k, v = k_all[..., hd * j : hd * (j + 1)], v_all[..., hd * j : hd * (j + 1)]
        if layer.q_norm is not None:
            q = q / q.pow(2).mean(-1, keepdim=True).add(layer.q_norm.eps).sqrt() * layer.q_norm.weight
            k = k / k.pow(2).mean(-1, keepdim=True).add(layer.k_norm.eps).sqrt() * layer.k_norm.weight
        s = (q @ k.transpose(-1, -2)) * layer.scale
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        o = torch.softmax(s, -1) @ v
        heads.append(o if gate is None else o * torch.sigmoid(gate))
    return torch.cat(heads, -1) @ layer.o_proj.weight.T


@pytest.mark.parametrize("qk_norm,output_gate", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("h,h_kv,hd", [(4, 2, 8), (3, 3, 6), (6, 1, 4)])
def test_qk_norm_and_gate_equal_a_loop_over_heads(qk_norm, output_gate, h, h_kv, hd):
    torch.manual_seed(h * hd)
    layer = mc.GroupedQueryAttention(12, h, h_kv, head_dim=hd, qk_norm=qk_norm, output_gate=output_gate)
    layer = layer.double()
    with torch.no_grad():
        if qk_norm:
            layer.q_norm.weight.uniform_(0.5, 1.5)
            layer.k_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    ref = _loop_reference(layer, x)
    for need_weights in (True, False):
        out, _ = layer(x, is_causal=True, need_weights=need_weights)
        tol = 1e-6 if qk_norm else 1e-12  # the norm computes in float32, as Llama's and Qwen3's RMSNorm
        torch.testing.assert_close(out, ref, atol=tol, rtol=0)


def test_defaults_keep_the_plain_layer():
    torch.manual_seed(0)
    layer = mc.GroupedQueryAttention(16, 4, 2)
    assert layer.q_proj.out_features == 16 and layer.q_norm is None and not layer.output_gate
    x = torch.randn(1, 5, 16)
    out, w = layer(x, is_causal=True)
    q = layer.q_proj(x).view(1, 5, 4, 4).transpose(1, 2)  # (1, 4, 5, 4)
    k, v = (p(x).view(1, 5, 2, 4).transpose(1, 2).repeat_interleave(2, dim=1) for p in (layer.k_proj, layer.v_proj))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # (1, 4, 5, 4)
    torch.testing.assert_close(out, layer.o_proj(ref.transpose(1, 2).reshape(1, 5, 16)), atol=1e-6, rtol=0)
    gated = mc.GroupedQueryAttention(16, 4, 2, output_gate=True)
    assert gated.q_proj.out_features == 32  # query and gate


def test_partial_rotary_turns_only_the_first_dims():
    rope = mc.RotaryEmbedding(8, rotary_dim=4)
    x = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    y = rope(x, 3)
    assert torch.equal(y[..., 4:], x[..., 4:])
    torch.testing.assert_close(y[..., :4], mc.apply_rope(x[..., :4], torch.arange(3, 8)))
    with pytest.raises(ValueError, match="rotary_dim must be at most head_dim=8"):
        mc.RotaryEmbedding(8, rotary_dim=10)


def test_bad_options_name_the_argument():
    with pytest.raises(TypeError, match="qk_norm must be True or False"):
        mc.GroupedQueryAttention(8, 2, 1, qk_norm=1)
    with pytest.raises(TypeError, match="output_gate must be True or False"):
        mc.GroupedQueryAttention(8, 2, 1, output_gate="yes")
    with pytest.raises(ValueError, match="scale must be None or a positive float"):
        mc.GroupedQueryAttention(8, 2, 1, scale=-1.0)
    with pytest.raises(ValueError, match="window must be a positive int"):
        mc.GroupedQueryAttention(8, 2, 1, window=0)
