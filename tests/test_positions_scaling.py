"""RoPE context extension (position interpolation, Llama 3.1, YaRN) against transformers'
``ROPE_INIT_FUNCTIONS`` and its rotary module, and against the formulas written out by hand."""

from __future__ import annotations

import math

import pytest
import torch

import mha_course as mc
from mha_course import positions as P

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

LLAMA31 = {  # meta-llama/Llama-3.1-8B config.json, rope_scaling
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
CASES = [  # (head_dim, theta, scaling)
    (128, 10000.0, {"rope_type": "linear", "factor": 4.0}),
    (64, 500000.0, {"rope_type": "linear", "factor": 2.5}),
    (128, 500000.0, LLAMA31),
    (64, 10000.0, {**LLAMA31, "factor": 4.0, "original_max_position_embeddings": 256}),
    (128, 10000.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}),
    (64, 1e6, {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 16}),
    (
        64,
        10000.0,
        {
            "rope_type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "mscale": 1.0,
            "mscale_all_dim": 0.707,
        },
    ),  # DeepSeek-V2's keys
    (16, 100.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "truncate": False}),
    (
        32,
        10000.0,
        {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64, "attention_factor": 1.3},
    ),
]


def hf_config(head_dim, theta, scaling):
    scaling = {"rope_type": "default"} if scaling is None else scaling
    original = scaling.get("original_max_position_embeddings", 2048)
    return transformers.LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=int(original * scaling.get("factor", 1.0)),
        rope_parameters={**scaling, "rope_theta": theta},
    )


@pytest.mark.parametrize("head_dim, theta, scaling", CASES)
def test_frequencies_and_attention_factor_equal_transformers(head_dim, theta, scaling):
    hf_freqs, hf_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](hf_config(head_dim, theta, scaling))
    ours = P.rope_frequencies(head_dim, theta, scaling=scaling)
    assert ours.dtype == torch.float32 and ours.shape == hf_freqs.shape
    assert ((ours.double() - hf_freqs.double()).abs() / hf_freqs.double()).max() < 1e-6
    assert mc.rope_attention_factor(scaling) == pytest.approx(hf_factor, rel=1e-12)
    assert not torch.allclose(ours, P.rope_frequencies(head_dim, theta))  # the scaling does something


def test_llama31_formula_written_out_by_wavelength():
    """Llama 3.1's rule pair by pair (Meta's llama-models apply_scaling, as a loop)."""
    freqs = P.rope_frequencies(128, 500000.0).double().tolist()
    low_wavelen, high_wavelen = 8192 / 1.0, 8192 / 4.0
    expected = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            expected.append(f)
        elif wavelen > low_wavelen:
            expected.append(f / 8.0)
        else:
            smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
            expected.append((1 - smooth) * f / 8.0 + smooth * f)
    got = P.rope_frequencies(128, 500000.0, scaling=LLAMA31).double()
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=0)


def test_linear_scaling_is_position_interpolation():
    """ω/s at position p is ω at position p/s: a 4×-long sequence lands on the trained angles."""
    x = torch.randn(1, 2, 8, 16, dtype=torch.float64)
    pos = torch.arange(0, 32, 4)
    scaled = P.apply_rope(x, pos, scaling={"rope_type": "linear", "factor": 4.0})
    assert torch.allclose(scaled, P.apply_rope(x, pos // 4), atol=1e-6)


@pytest.mark.parametrize("head_dim, theta, scaling", [CASES[2], CASES[4], CASES[8]])
def test_cos_sin_equal_llama_rotary_embedding(head_dim, theta, scaling):
    """Including YaRN's attention factor, which multiplies cos and sin."""
    config = hf_config(head_dim, theta, scaling)
    positions = torch.tensor([0, 1, 7, 300, 4095, 9000, 30000])
    x = torch.zeros(1, 1, len(positions), head_dim)
    cos, sin = LlamaRotaryEmbedding(config)(x, positions[None])  # (1, L, head_dim)
    ours_cos, ours_sin = P.rope_cos_sin(positions, head_dim, theta, scaling=scaling)
    assert torch.allclose(ours_cos, cos[0], atol=2e-5) and torch.allclose(ours_sin, sin[0], atol=2e-5)


def test_rotary_embedding_module_uses_the_scaling():
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    rope = P.RotaryEmbedding(16, 100.0, scaling=yarn)
    x = torch.randn(1, 2, 5, 16)
    expected = P.apply_rope(x, torch.arange(3, 8), theta=100.0, scaling=yarn)
    assert torch.equal(rope(x, 3), expected)
    assert not torch.allclose(rope(x, 3), P.RotaryEmbedding(16, 100.0)(x, 3))
    assert "yarn" in repr(rope)


@pytest.mark.parametrize(
    "scaling, error, match",
    [
        ({"rope_type": "longrope", "factor": 2.0}, ValueError, "rope_type must be one of"),
        ({"rope_type": "dynamic", "factor": 2.0}, ValueError, "running sequence length"),
        ({"rope_type": "llama3", "factor": 8.0}, ValueError, "missing keys"),
        ({"rope_type": "linear", "factor": 2.0, "beta_fast": 3}, ValueError, "unknown keys"),
        ({"rope_type": "linear", "factor": 0.5}, ValueError, "factor must be >= 1"),
        ({"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}, ValueError, "rope_theta=500.0 but theta"),
        ([("rope_type", "linear")], TypeError, "must be a dict"),
    ],
)
def test_bad_scaling_is_named(scaling, error, match):
    with pytest.raises(error, match=match):
        P.rope_frequencies(64, 10000.0, scaling=scaling)
    with pytest.raises(error, match=match):
        P.RotaryEmbedding(64, scaling=scaling)


def test_ntk_aware_theta_is_dynamic_ntk_at_the_stretched_length():
    """The hint in the 'dynamic' error is right: transformers' dynamic NTK at seq_len = s · trained
    length gives the frequencies of plain RoPE with theta · (factor·s − factor + 1)^(d/(d-2))."""
    config = transformers.LlamaConfig(
        hidden_size=256,
        num_attention_heads=4,
        head_dim=64,
        max_position_embeddings=512,
        rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0},
    )
    hf, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=3 * 512)  # s = 3
    ours = P.rope_frequencies(64, 10000.0 * (4.0 * 3 - 4.0 + 1) ** (64 / 62))
    assert ((ours.double() - hf.double()).abs() / hf.double()).max() < 1e-5


def test_default_and_rope_theta_in_the_dict_are_plain_rope():
    plain = P.rope_frequencies(64, 500000.0)
    assert torch.equal(P.rope_frequencies(64, 500000.0, scaling={"rope_type": "default"}), plain)
    v5 = {"rope_type": "default", "rope_theta": 500000.0}  # transformers v5 rope_parameters
    assert torch.equal(P.rope_frequencies(64, 500000.0, scaling=v5), plain)
    assert mc.rope_attention_factor(None) == 1.0 == mc.rope_attention_factor(LLAMA31)


@pytest.mark.parametrize(
    ("head_dim", "factor", "trained", "length"), [(16, 1.0, 17, 65), (64, 4.0, 512, 1536), (32, 2.0, 100, 50)]
)
def test_dynamic_ntk_theta_gives_transformers_dynamic_frequencies(head_dim, factor, trained, length):
    """The notebook's dynamic NTK (plain RoPE with a base from dynamic_ntk_theta) against
    transformers' own 'dynamic' init function at that sequence length (shorter: theta unchanged)."""
    from mha_course.lessons.rope_extension import dynamic_ntk_theta

    config = transformers.LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=trained,
        rope_parameters={"rope_type": "dynamic", "factor": factor, "rope_theta": 10000.0},
    )
    hf, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=length)
    ours = P.rope_frequencies(head_dim, dynamic_ntk_theta(10000.0, head_dim, length, trained, factor))
    assert ((ours.double() - hf.double()).abs() / hf.double()).max() < 1e-5
    if length <= trained:
        assert dynamic_ntk_theta(10000.0, head_dim, length, trained, factor) == 10000.0
