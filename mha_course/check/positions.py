"""Checkers for rotary position embeddings: ``apply_rope`` and one cached decoding step."""

from __future__ import annotations

import torch

from .. import positions as _P
from .framework import Case, CheckResult, Mistake, run_check, tensor_generator

__all__ = ["apply_rope", "rope_step"]


def _rope(x, positions, theta, *, layout="half", exponent=2.0, sign=1.0):
    """RoPE with knobs for the usual slips: pairing layout, exponent 2i/d vs i/d, turn direction."""
    d = x.shape[-1]
    freqs = 1.0 / (theta ** (exponent * torch.arange(d // 2, dtype=torch.float64) / d))  # (d/2,)
    angles = sign * positions.double()[:, None] * freqs  # (L, d/2)
    angles = torch.cat([angles, angles], -1) if layout == "half" else angles.repeat_interleave(2, -1)  # (L, d)
    return _P.apply_rotation(x, angles.cos().to(x.dtype), angles.sin().to(x.dtype), layout=layout)


def _reference(x, positions, theta):
    return _P.apply_rope(x, positions, theta=theta)


APPLY_ROPE_MISTAKES = [
    Mistake(
        "interleaved",
        lambda x, p, t: _rope(x, p, t, layout="interleaved"),
        "you rotated adjacent pairs (2i, 2i+1), Meta's interleaved layout; here pair i is coordinates i and "
        "i + head_dim/2 (rotate-half, as in Hugging Face checkpoints)",
    ),
    Mistake(
        "exponent i/d",
        lambda x, p, t: _rope(x, p, t, exponent=1.0),
        "the frequencies are θ^(-i/head_dim): the exponent is 2i/head_dim (i counts pairs, not coordinates)",
    ),
    Mistake(
        "theta fixed",
        lambda x, p, t: _rope(x, p, 10000.0),
        "the base θ is fixed at 10,000 — use the theta argument (Llama 3 uses 500,000)",
    ),
    Mistake(
        "direction",
        lambda x, p, t: _rope(x, p, t, sign=-1.0),
        "each pair turns the wrong way: (x1, x2) -> (x1·cos + x2·sin, x2·cos - x1·sin); the half that is "
        "negated is the second: rotate_half(x) = (-x2, x1)",
    ),
    Mistake(
        "positions ignored",
        lambda x, p, t: _rope(x, torch.arange(x.shape[-2]), t),
        "the rows are rotated by their index 0, 1, 2, … instead of by the positions given",
    ),
    Mistake(
        "not rotated",
        lambda x, p, t: x.clone(),
        "x comes back unrotated",
    ),
]


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


ROPE_STEP_MISTAKES = [
    Mistake(
        "position 0",
        lambda q, k, v, c, t: _step(q, k, v, c, t, first=0),
        "the new tokens are rotated as positions 0, 1, … — they come after the cached ones: start at cache_length",
    ),
    Mistake(
        "one late",
        lambda q, k, v, c, t: _step(q, k, v, c, t, first=c + 1),
        "off by one: the first new token's position is cache_length (positions count from 0), not cache_length + 1",
    ),
    Mistake(
        "one early",
        lambda q, k, v, c, t: _step(q, k, v, c, t, first=max(c - 1, 0)),
        "off by one: the first new token's position is cache_length, not cache_length - 1",
    ),
    Mistake(
        "v rotated",
        lambda q, k, v, c, t: _step(q, k, v, c, t, rotate_v=True),
        "v was rotated too: RoPE turns only q and k (positions enter the scores, not the values)",
    ),
    Mistake(
        "k not rotated",
        lambda q, k, v, c, t: _step(q, k, v, c, t, rotate_k=False),
        "k goes to the cache unrotated: rotate it before caching (the cached keys are all rotated)",
    ),
    Mistake(
        "interleaved",
        lambda q, k, v, c, t: _step(q, k, v, c, t, layout="interleaved"),
        "adjacent pairs (2i, 2i+1) rotated: use the rotate-half layout (pair i = i and i + head_dim/2)",
    ),
]


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
