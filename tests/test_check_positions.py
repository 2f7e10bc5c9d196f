"""The RoPE checkers: every correct approach passes, each listed mistake is named, nothing raises.

The learner functions here are written independently of the checkers' own wrong variants.
"""

from __future__ import annotations

import pytest
import torch

import mha_course as mc


def assert_passes(result):
    assert result.passed and result.status == "passed", repr(result)


def assert_fails(result, *words):
    assert not result.passed and result.status == "failed", repr(result)
    for word in words:
        assert word.lower() in result.message.lower(), f"{word!r} not in {result.message!r}"


# ---------------------------------------------------------------------------------------------
# learners' apply_rope, several styles


def rope_float64_halves(x, positions, theta):  # the formula, in float64
    d = x.shape[-1]
    i = torch.arange(d // 2, dtype=torch.float64)
    angle = positions[:, None].double() * theta ** (-2 * i / d)  # (L, d/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rope_complex(x, positions, theta):  # complex numbers on the (i, i + d/2) pairs
    d = x.shape[-1]
    freqs = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    z = torch.complex(x[..., : d // 2], x[..., d // 2 :])
    z = z * torch.polar(torch.ones(len(positions), d // 2), positions[:, None].float() * freqs)
    return torch.cat([z.real, z.imag], dim=-1)


def rope_loop(x, positions, theta):  # one pair at a time
    d = x.shape[-1]
    out = x.clone()
    for i in range(d // 2):
        a = positions.double() * theta ** (-2 * i / d)  # (L,)
        c, s = torch.cos(a).to(x.dtype)[:, None], torch.sin(a).to(x.dtype)[:, None]
        x1, x2 = x[..., i : i + 1], x[..., i + d // 2 : i + d // 2 + 1]
        out[..., i : i + 1] = x1 * c - x2 * s
        out[..., i + d // 2 : i + d // 2 + 1] = x2 * c + x1 * s
    return out


def rope_hf(x, positions, theta):  # transformers' own function
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    emb = torch.cat([positions[:, None].float() * inv] * 2, dim=-1)  # (L, d)
    q, _ = apply_rotary_pos_emb(x, x, emb.cos(), emb.sin(), unsqueeze_dim=0)
    return q.reshape(x.shape)  # unsqueeze_dim adds a leading 1 to a 2-D x


@pytest.mark.parametrize("fn", [rope_float64_halves, rope_complex, rope_loop, rope_hf])
def test_apply_rope_correct_variants_pass(fn):
    assert_passes(mc.check.apply_rope(fn))


def rope_interleaved(x, positions, theta):
    d = x.shape[-1]
    angle = positions[:, None].double() * theta ** (-2 * torch.arange(d // 2, dtype=torch.float64) / d)
    cos, sin = angle.cos().float(), angle.sin().float()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


def rope_exponent(x, positions, theta):
    d = x.shape[-1]
    angle = positions[:, None].double() * theta ** (-torch.arange(d // 2, dtype=torch.float64) / d)
    cos, sin = angle.cos().float(), angle.sin().float()
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rope_fixed_base(x, positions, theta):
    return rope_float64_halves(x, positions, 10000.0)


def rope_backwards(x, positions, theta):
    return rope_float64_halves(x, -positions, theta)


def rope_by_index(x, positions, theta):
    return rope_float64_halves(x, torch.arange(x.shape[-2]), theta)


@pytest.mark.parametrize(
    "fn, words",
    [
        (rope_interleaved, "interleaved"),
        (rope_exponent, "2i/head_dim"),
        (rope_fixed_base, "theta argument"),
        (rope_backwards, "wrong way"),
        (rope_by_index, "positions given"),
        (lambda x, positions, theta: x, "unrotated"),
    ],
)
def test_apply_rope_mistakes_are_diagnosed(fn, words):
    assert_fails(mc.check.apply_rope(fn), "likely mistake", words)


# ---------------------------------------------------------------------------------------------
# learners' rope_step


def step_apply_rope(q, k, v, cache_length, theta):
    pos = torch.arange(cache_length, cache_length + q.shape[-2])
    return mc.apply_rope(q, pos, theta=theta), mc.apply_rope(k, pos, theta=theta), v


def step_own_rotation(q, k, v, cache_length, theta):
    n = q.shape[-2]
    pos = torch.arange(n) + cache_length
    return rope_float64_halves(q, pos, theta), rope_loop(k, pos, theta), v.clone()


def step_rotary_module(q, k, v, cache_length, theta):
    rope = mc.RotaryEmbedding(q.shape[-1], theta)
    return rope(q, cache_length), rope(k, cache_length), v


@pytest.mark.parametrize("fn", [step_apply_rope, step_own_rotation, step_rotary_module])
def test_rope_step_correct_variants_pass(fn):
    assert_passes(mc.check.rope_step(fn))


def shifted(first_of):
    def step(q, k, v, cache_length, theta):
        first = first_of(cache_length)
        pos = torch.arange(first, first + q.shape[-2])
        return rope_float64_halves(q, pos, theta), rope_float64_halves(k, pos, theta), v

    return step


def step_rotates_v(q, k, v, cache_length, theta):
    q, k, _ = step_apply_rope(q, k, v, cache_length, theta)
    return q, k, rope_float64_halves(v, torch.arange(cache_length, cache_length + v.shape[-2]), theta)


def step_forgets_k(q, k, v, cache_length, theta):
    pos = torch.arange(cache_length, cache_length + q.shape[-2])
    return rope_loop(q, pos, theta), k, v


def step_interleaved(q, k, v, cache_length, theta):
    pos = torch.arange(cache_length, cache_length + q.shape[-2])
    return rope_interleaved(q, pos, theta), rope_interleaved(k, pos, theta), v


@pytest.mark.parametrize(
    "fn, words",
    [
        (shifted(lambda c: 0), "start at cache_length"),
        (shifted(lambda c: c + 1), "not cache_length + 1"),
        (shifted(lambda c: c - 1), "not cache_length - 1"),
        (step_rotates_v, "only q and k"),
        (step_forgets_k, "unrotated"),
        (step_interleaved, "rotate-half"),
    ],
)
def test_rope_step_mistakes_are_diagnosed(fn, words):
    assert_fails(mc.check.rope_step(fn), "likely mistake", words)


def test_not_attempted_and_exceptions_never_raise():
    def todo(*args):
        raise NotImplementedError

    for check in (mc.check.apply_rope, mc.check.rope_step):
        assert check(todo).status == "not attempted"
        assert check(lambda *a: 1 / 0).status == "failed"
        assert check(lambda *a: None).status == "failed"


# ---------------------------------------------------------------------------------------------
# learners' Llama 3.1 frequency scaling, several styles


def llama3_where(freqs, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings):
    """transformers' style: three bands with torch.where."""
    import math

    low_wl = original_max_position_embeddings / low_freq_factor
    high_wl = original_max_position_embeddings / high_freq_factor
    wavelen = 2 * math.pi / freqs
    out = torch.where(wavelen > low_wl, freqs / factor, freqs)
    smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    mid = (wavelen >= high_wl) & (wavelen <= low_wl)
    return torch.where(mid, (1 - smooth) * freqs / factor + smooth * freqs, out)


def llama3_loop(freqs, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings):
    """Meta's llama-models style: one frequency at a time, a list back to a tensor."""
    import math

    new = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < original_max_position_embeddings / high_freq_factor:
            new.append(f)
        elif wavelen > original_max_position_embeddings / low_freq_factor:
            new.append(f / factor)
        else:
            s = (original_max_position_embeddings / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            new.append((1 - s) * f / factor + s * f)
    return torch.tensor(new, dtype=freqs.dtype)


def llama3_via_transformers(freqs, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings):
    """Ask transformers itself (float32 inside, so only close: within the checker's tolerance)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d = 2 * len(freqs)
    theta = float(1.0 / freqs[-1]) ** (d / (d - 2))  # recover θ from the slowest pair
    config = LlamaConfig(
        hidden_size=d,
        num_attention_heads=1,
        head_dim=d,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": theta,
            "factor": factor,
            "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position_embeddings,
        },
    )
    return ROPE_INIT_FUNCTIONS["llama3"](config)[0].to(freqs.dtype)


@pytest.mark.parametrize("fn", [llama3_where, llama3_loop, llama3_via_transformers])
def test_llama3_frequencies_correct_variants_pass(fn):
    assert_passes(mc.check.llama3_frequencies(fn))


def _wavelen_blend(freqs, factor, lo, hi, old):  # linear in the wavelength instead of its inverse
    import math

    wl = 2 * math.pi / freqs
    w = ((old / lo - wl) / (old / lo - old / hi)).clamp(0, 1)
    return w * freqs + (1 - w) * freqs / factor


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda f, s, lo, hi, n: f / s, ["plain position interpolation"]),
        (lambda f, s, lo, hi, n: llama3_where(f, 1 / s, lo, hi, n), ["multiplied"]),
        (
            lambda f, s, lo, hi, n: llama3_where(f * 2 * 3.141592653589793, s, lo, hi, n) / (2 * 3.141592653589793),
            ["2π"],
        ),
        (lambda f, s, lo, hi, n: llama3_loop(f, s, hi, lo, n), ["no blend", "trade places"]),
        (lambda f, s, lo, hi, n: torch.where(2 * torch.pi / f > n / lo, f / s, f), ["no blend", "came back unchanged"]),
        (lambda f, s, lo, hi, n: torch.where(2 * torch.pi / f < n / hi, f, f / s), ["no blend", "all divided"]),
        (_wavelen_blend, ["linear in 1/wavelength"]),
        (lambda f, s, lo, hi, n: f, ["unchanged"]),
    ],
)
def test_llama3_frequencies_mistakes_are_named(wrong, words):
    assert_fails(mc.check.llama3_frequencies(wrong), *words)


def test_llama3_frequencies_not_attempted_and_never_raises():
    def todo(*args):
        raise NotImplementedError

    assert mc.check.llama3_frequencies(todo).status == "not attempted"
    result = mc.check.llama3_frequencies(lambda *a: 1 / 0)
    assert not result.passed and "ZeroDivisionError" in result.message
    assert not mc.check.llama3_frequencies(lambda *a: torch.zeros(3)).passed
