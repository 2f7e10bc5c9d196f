"""Checkers for rotary position embeddings: ``apply_rope`` and one cached decoding step."""

from __future__ import annotations

import torch

from .. import positions as _P
from ..i18n import tr
from .framework import Case, CheckResult, mistakes, run_check, tensor_generator

__all__ = ["apply_rope", "llama3_frequencies", "rope_step"]


def _rope(x, positions, theta, *, layout="half", exponent=2.0, sign=1.0):
    """RoPE with knobs for the usual slips: pairing layout, exponent 2i/d vs i/d, turn direction."""
    d = x.shape[-1]
    freqs = 1.0 / (theta ** (exponent * torch.arange(d // 2, dtype=torch.float64) / d))  # (d/2,)
    angles = sign * positions.double()[:, None] * freqs  # (L, d/2)
    angles = torch.cat([angles, angles], -1) if layout == "half" else angles.repeat_interleave(2, -1)  # (L, d)
    return _P.apply_rotation(x, angles.cos().to(x.dtype), angles.sin().to(x.dtype), layout=layout)


def _reference(x, positions, theta):
    return _P.apply_rope(x, positions, theta=theta)


APPLY_ROPE_MISTAKES = mistakes(
    "apply_rope",
    {
        "interleaved": lambda x, p, t: _rope(x, p, t, layout="interleaved"),
        "exponent i/d": lambda x, p, t: _rope(x, p, t, exponent=1.0),
        "theta fixed": lambda x, p, t: _rope(x, p, 10000.0),
        "direction": lambda x, p, t: _rope(x, p, t, sign=-1.0),
        "positions ignored": lambda x, p, t: _rope(x, torch.arange(x.shape[-2]), t),
        "not rotated": lambda x, p, t: x.clone(),
    },
)


def apply_rope(fn) -> CheckResult:
    """Check ``fn(x, positions, theta)``: x (..., L, head_dim) rotated, "rotate-half" layout (pair i
    = coordinates i and i + head_dim/2), pair i of the row at position p turned by
    p · theta^(-2i/head_dim); positions (L,) integers."""
    g = tensor_generator()
    shapes = [  # (x shape, positions, theta, description)
        ((1, 2, 4, 8), torch.arange(4), 10000.0, "(B=1, h=2, L=4, head_dim=8), positions 0-3"),
        ((2, 3, 5, 16), torch.arange(7, 12), 100.0, "positions 7-11, θ = 100"),
        ((6, 4), torch.tensor([0, 5, 2, 31, 8, 1]), 500000.0, "(L=6, head_dim=4), shuffled positions, θ = 500,000"),
        ((1, 1, 3, 64), torch.tensor([300, 301, 302]), 10000.0, "head_dim 64 at positions 300-302"),
    ]
    cases = [
        Case((torch.randn(*shape, generator=g), pos, theta), description=text) for shape, pos, theta, text in shapes
    ]
    # angles in float32 (as Llama) or float64 (as a formula written out) may differ by ~1e-5 rad here
    return run_check(
        "apply_rope",
        fn,
        cases,
        _reference,
        APPLY_ROPE_MISTAKES,
        arg_names=("x", "positions", "theta"),
        atol=3e-4,
        rtol=1e-4,
    )


def _step(q, k, v, cache_length, theta, *, first=None, rotate_k=True, rotate_v=False, layout="half"):
    first = cache_length if first is None else first
    pos = torch.arange(first, first + q.shape[-2])  # (n,)
    q = _P.apply_rope(q, pos, theta=theta, layout=layout)
    k = _P.apply_rope(k, pos, theta=theta, layout=layout) if rotate_k else k
    v = _P.apply_rope(v, pos, theta=theta, layout=layout) if rotate_v else v
    return q, k, v


ROPE_STEP_MISTAKES = mistakes(
    "rope_step",
    {
        "position 0": lambda q, k, v, c, t: _step(q, k, v, c, t, first=0),
        "one late": lambda q, k, v, c, t: _step(q, k, v, c, t, first=c + 1),
        "one early": lambda q, k, v, c, t: _step(q, k, v, c, t, first=max(c - 1, 0)),
        "v rotated": lambda q, k, v, c, t: _step(q, k, v, c, t, rotate_v=True),
        "k not rotated": lambda q, k, v, c, t: _step(q, k, v, c, t, rotate_k=False),
        "interleaved": lambda q, k, v, c, t: _step(q, k, v, c, t, layout="interleaved"),
    },
)


def rope_step(fn) -> CheckResult:
    """Check ``fn(q, k, v, cache_length, theta) -> (q, k, v)``: the new positions' queries (B, h, n, hd)
    and keys/values (B, h_kv, n, hd) of one cached decoding step, as they go to attention and into
    the cache: q and k rotated at the absolute positions cache_length … cache_length + n - 1, v as is."""
    g = tensor_generator()
    shapes = [  # (B, h, h_kv, n, hd, cache_length, theta, description)
        (1, 4, 2, 1, 8, 5, 10000.0, "one new token after 5 cached"),
        (2, 6, 3, 3, 16, 17, 100.0, "3 new tokens after 17 cached, θ = 100"),
        (1, 2, 1, 4, 8, 0, 10000.0, "the prompt: 4 tokens, empty cache"),
        (1, 9, 3, 1, 64, 200, 100000.0, "SmolLM2's heads, token 201, θ = 100,000"),
    ]
    cases = [
        Case(
            (
                torch.randn(B, h, n, hd, generator=g),
                torch.randn(B, h_kv, n, hd, generator=g),
                torch.randn(B, h_kv, n, hd, generator=g),
                cache_len,
                theta,
            ),
            description=text,
        )
        for B, h, h_kv, n, hd, cache_len, theta, text in shapes
    ]
    return run_check(
        "rope_step",
        fn,
        cases,
        _step,
        ROPE_STEP_MISTAKES,
        arg_names=("q", "k", "v", "cache_length", "theta"),
        output_names=("q", "k", "v"),
        atol=3e-4,
    )


def _llama3(freqs, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings):
    params = {
        "factor": factor,
        "low_freq_factor": low_freq_factor,
        "high_freq_factor": high_freq_factor,
        "original_max_position_embeddings": original_max_position_embeddings,
    }
    return _P._llama3(freqs, params)


def _llama3_variant(freqs, factor, low, high, old_len, *, two_pi=True, slow=None, blend="inverse", reverse=False):
    """Llama 3.1's rule with knobs for the usual slips (blend linear in 1/wavelength or in wavelength)."""
    wavelen = (2 * torch.pi if two_pi else 1.0) / freqs  # (d/2,)
    long_wl, short_wl = old_len / low, old_len / high  # the bands' edges in positions per turn
    if blend == "inverse":
        keep = ((old_len / wavelen - low) / (high - low)).clamp(0, 1)  # 1: keep, 0: slow down
    else:
        keep = ((long_wl - wavelen) / (long_wl - short_wl)).clamp(0, 1)
    keep = 1 - keep if reverse else keep
    slowed = freqs / factor if slow is None else slow(freqs)
    return keep * freqs + (1 - keep) * slowed


LLAMA3_FREQUENCIES_MISTAKES = mistakes(
    "llama3_frequencies",
    {
        "all divided": lambda f, s, lo, hi, n: f / s,
        "multiplied": lambda f, s, lo, hi, n: _llama3_variant(f, s, lo, hi, n, slow=lambda x: x * s),
        "no 2π": lambda f, s, lo, hi, n: _llama3_variant(f, s, lo, hi, n, two_pi=False),
        "no blend, middle kept": lambda f, s, lo, hi, n: torch.where(2 * torch.pi / f > n / lo, f / s, f),
        "no blend, middle divided": lambda f, s, lo, hi, n: torch.where(2 * torch.pi / f < n / hi, f, f / s),
        "blend reversed": lambda f, s, lo, hi, n: _llama3_variant(f, s, lo, hi, n, reverse=True),
        "blend in wavelength": lambda f, s, lo, hi, n: _llama3_variant(f, s, lo, hi, n, blend="wavelength"),
        "unchanged": lambda f, s, lo, hi, n: f.clone(),
    },
)


def llama3_frequencies(fn) -> CheckResult:
    """Check ``fn(freqs, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)``:
    RoPE's frequencies (head_dim/2,) rescaled by Llama 3.1's rule (pairs whose wavelength exceeds
    original/low_freq_factor divided by factor, pairs shorter than original/high_freq_factor kept,
    a blend linear in 1/wavelength between). As transformers' "llama3" rope init."""
    cases = [
        Case(
            (_P.rope_frequencies(d, theta).double(), factor, low, high, old),
            description=text,
        )
        for d, theta, factor, low, high, old, text in [
            (128, 500000.0, 8.0, 1.0, 4.0, 8192, "Llama 3.1 8B: head_dim 128, θ = 500,000, factor 8, 1, 4, 8,192"),
            (64, 10000.0, 4.0, 1.0, 4.0, 256, "head_dim 64, θ = 10,000, factor 4, 1, 4, trained on 256"),
            (16, 100.0, 2.0, 1.0, 2.0, 32, "head_dim 16, θ = 100, factor 2, 1, 2, trained on 32"),
            (128, 500000.0, 32.0, 1.0, 4.0, 8192, "Llama 3.2 1B: factor 32, 1, 4, 8,192"),
        ]
    ]
    return run_check(
        "llama3_frequencies",
        fn,
        cases,
        _llama3,
        LLAMA3_FREQUENCIES_MISTAKES,
        arg_names=("freqs", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
        output_label=tr("frequencies", "label"),
        atol=0.0,
        rtol=1e-5,
    )
