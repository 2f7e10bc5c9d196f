"""The Llama-architecture decoder against transformers' LlamaForCausalLM: same random config
and weights, same logits, same greedy tokens; its parts against torch's own modules."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from mha_course.decoder import DecoderConfig, LlamaDecoder, RMSNorm, SwiGLU, generate_greedy

transformers = pytest.importorskip("transformers")


def tiny_llama(*, tie=False, attn="sdpa", theta=500.0, head_dim=None, seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=head_dim,
        rope_theta=theta,  # transformers v5 turns it into rope_parameters, v4 keeps it
        tie_word_embeddings=tie,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        attn_implementation=attn,
    )
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("dtype, bound", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_logits_equal_llama_for_causal_lm(tie, dtype, bound):
    hf = tiny_llama(tie=tie).to(dtype)
    ours = LlamaDecoder.from_hf(hf)
    ids = torch.randint(0, 97, (3, 13))
    with torch.no_grad():
        expected, got = hf(ids).logits, ours(ids)
    assert got.dtype == dtype
    assert (got - expected).abs().max() < bound
    assert (ours.lm_head.weight is ours.embed_tokens.weight) == tie


def test_logits_equal_the_eager_attention_path_too():
    """transformers' eager attention (its own matmul-softmax, softmax in float32)."""
    hf = tiny_llama(attn="eager", head_dim=16)  # head_dim ≠ d_model / num_heads
    ours = LlamaDecoder.from_hf(hf)
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max() < 1e-5


def test_cached_forward_equals_full_forward_and_hf_cache():
    hf = tiny_llama().double()
    ours = LlamaDecoder.from_hf(hf)
    ids = torch.randint(0, 97, (2, 10))
    caches = ours.new_caches()
    with torch.no_grad():
        parts = [ours(ids[:, :6], caches)] + [ours(ids[:, t : t + 1], caches) for t in range(6, 10)]
        full = ours(ids)
    assert (torch.cat(parts, dim=1) - full).abs().max() < 1e-12
    assert all(c.length == 10 for c in caches)


@pytest.mark.parametrize("tie", [False, True])
def test_greedy_generation_equals_transformers_generate(tie):
    hf = tiny_llama(tie=tie, seed=3)
    ours = LlamaDecoder.from_hf(hf)
    ids = torch.randint(0, 97, (2, 5))
    expected = hf.generate(ids, max_new_tokens=20, do_sample=False, use_cache=True, eos_token_id=None, pad_token_id=0)
    assert torch.equal(generate_greedy(ours, ids, 20), expected)
    assert torch.equal(generate_greedy(ours, ids, 20, use_cache=False), expected)


def test_generation_stops_at_eos():
    hf = tiny_llama(seed=3)
    ours = LlamaDecoder.from_hf(hf)
    ids = torch.randint(0, 97, (1, 5))
    free = generate_greedy(ours, ids, 10)
    eos = int(free[0, 7])  # the third generated token
    stopped = generate_greedy(ours, ids, 10, eos_token_id=eos)
    assert stopped.shape[1] <= 8 and stopped[0, -1] == eos


def test_rmsnorm_equals_torch_rmsnorm_and_llama_rmsnorm():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    x = torch.randn(3, 5, 16, dtype=torch.float64)
    ours = RMSNorm(16, 1e-5, compute_dtype=None).double()
    torch.nn.init.normal_(ours.weight)
    ref = torch.nn.RMSNorm(16, eps=1e-5).double()
    ref.weight.data.copy_(ours.weight)
    with torch.no_grad():
        assert (ours(x) - ref(x)).abs().max() < 1e-12
        llama32 = RMSNorm(16, 1e-5)
        hf = LlamaRMSNorm(16, 1e-5)
        hf.weight.data.copy_(ours.weight.float())
        llama32.weight.data.copy_(ours.weight.float())
        assert (llama32(x.float()) - hf(x.float())).abs().max() < 1e-6


def test_swiglu_formula():
    torch.manual_seed(0)
    mlp = SwiGLU(8, 20)
    x = torch.randn(2, 3, 8)
    g, u = x @ mlp.gate_proj.weight.T, x @ mlp.up_proj.weight.T
    expected = (g * torch.sigmoid(g) * u) @ mlp.down_proj.weight.T
    assert torch.allclose(mlp(x), expected, atol=1e-6)


def test_config_from_hf_reads_every_field():
    hf = tiny_llama(tie=True, theta=100000.0, head_dim=16)
    c = DecoderConfig.from_hf(hf.config)
    assert (c.vocab_size, c.d_model, c.num_layers, c.num_heads, c.num_kv_heads, c.d_ff) == (97, 48, 2, 6, 2, 80)
    assert (c.head_dim, c.rope_theta, c.rms_norm_eps, c.tie_embeddings) == (16, 100000.0, 1e-5, True)


def test_loader_rejects_a_mismatched_state_dict():
    ours = LlamaDecoder(DecoderConfig(97, 48, 2, 6, 2, 80))
    sd = tiny_llama().state_dict()
    del sd["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match="missing"):
        ours.load_hf_state_dict(sd)
    sd = tiny_llama().state_dict()
    sd["model.norm.weight"] = torch.ones(5)
    with pytest.raises(ValueError, match="shape"):
        ours.load_hf_state_dict(sd)


def test_config_from_a_v4_style_config():
    v4 = SimpleNamespace(
        vocab_size=10,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=16,
        rms_norm_eps=1e-6,
        rope_theta=500000.0,
        rope_scaling=None,
    )
    assert DecoderConfig.from_hf(v4).rope_theta == 500000.0 and DecoderConfig.from_hf(v4).head_dim is None
    v4.rope_scaling = {"rope_type": "llama3", "factor": 8.0}  # incomplete: three keys missing
    with pytest.raises(ValueError, match="missing keys"):
        DecoderConfig.from_hf(v4)
    v4.rope_scaling = {"type": "linear", "factor": 2.0}  # v4's older spelling of rope_type
    assert DecoderConfig.from_hf(v4).rope_scaling == {"type": "linear", "factor": 2.0}


def test_bad_input_ids():
    ours = LlamaDecoder(DecoderConfig(97, 48, 1, 6, 2, 80))
    with pytest.raises(TypeError, match="integer"):
        ours(torch.randn(1, 3))
    with pytest.raises(ValueError, match="one KVCache per layer"):
        ours(torch.zeros(1, 3, dtype=torch.long), caches=[])
    with pytest.raises(ValueError, match="rope_type must be one of"):
        DecoderConfig.from_hf(
            transformers.LlamaConfig(
                rope_parameters={
                    "rope_type": "longrope",
                    "rope_theta": 1e4,
                    "short_factor": [1.0],
                    "long_factor": [1.0],
                }
            )
        )


LLAMA31_SMALL = {  # Llama 3.1's rule and ratios, the trained context shrunk to 16 positions
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
YARN_SMALL = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}


@pytest.mark.parametrize("scaling", [LLAMA31_SMALL, YARN_SMALL, {"rope_type": "linear", "factor": 3.0}])
def test_scaled_rope_decoder_equals_llama_for_causal_lm(scaling):
    """Llama 3.1's scaling (and YaRN's, with its attention factor; and interpolation), 40 tokens
    past a 16-token "trained" context: logits and the cached greedy tokens equal transformers'."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=int(16 * scaling["factor"]),
        rope_parameters={**scaling, "rope_theta": 500.0},
        initializer_range=0.2,
    )
    hf = transformers.LlamaForCausalLM(config).eval().double()
    ours = LlamaDecoder.from_hf(hf)
    assert ours.config.rope_scaling["rope_type"] == scaling["rope_type"] and ours.config.rope_theta == 500.0
    ids = torch.randint(0, 97, (2, 40))
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max() < 1e-10
        plain = LlamaDecoder(replace(ours.config, rope_scaling=None)).double()
        plain.load_state_dict(ours.state_dict())
        assert (plain(ids) - hf(ids).logits).abs().max() > 1e-3  # the scaling matters here
    prompt = ids[:, :6]
    theirs = hf.generate(prompt, max_new_tokens=30, do_sample=False, use_cache=True, pad_token_id=0)
    assert torch.equal(generate_greedy(ours, prompt, 30), theirs)
