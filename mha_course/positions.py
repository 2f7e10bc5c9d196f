"""Where a token stands: absolute position embeddings, ALiBi and rotary position embeddings (RoPE).

Attention alone cannot see order (it is permutation-equivariant). The families below fix that:

* **absolute**, added to the token vectors before the first layer: a learned table
  (``nn.Embedding(max_len, d_model)``, BERT, GPT-2) or :func:`sinusoidal_positions` (Vaswani et al.
  2017);
* **ALiBi** (Press et al. 2022): a per-head penalty ``-slope_h · (i - j)`` added to the scores,
  i.e. a float mask (:func:`alibi_bias`);
* **RoPE** (Su et al. 2021): q and k rotated by angles proportional to their position, so that
  q·k depends on the two contents and on the offset between the positions only (:func:`apply_rope`).

RoPE conventions. A head vector of size ``head_dim`` (even) is cut into ``head_dim / 2`` pairs;
pair i turns by the angle ``position · ω_i`` with ``ω_i = theta ** (-2i / head_dim)``. Which two
coordinates form pair i is the *layout*:

* ``"half"`` (rotate-half, Hugging Face ``transformers``): coordinates i and i + head_dim/2;
* ``"interleaved"`` (Meta's original Llama code, the complex-number view): coordinates 2i and 2i+1.

A checkpoint trained in one layout runs in the other once the rows of each head of W_Q and W_K
are permuted (:func:`interleaved_to_half`). Like Meta's and Hugging Face's Llama code, the angles
are computed in float32 whatever the dtype of q and k (in bf16, ``position · ω`` would be wrong
by whole radians long before position 4,096), then cos and sin are cast to that dtype.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from . import validation as _validate

LAYOUTS = ("half", "interleaved")


# ---------------------------------------------------------------------------------------------
# absolute positions and ALiBi


def sinusoidal_positions(length: int, d_model: int, *, base: float = 10000.0, device=None) -> torch.Tensor:
    """The fixed positional encoding of Vaswani et al. (2017), (length, d_model), float32 on ``device``:
    PE[p, 2i] = sin(p / base^(2i/d_model)), PE[p, 2i+1] = cos(p / base^(2i/d_model))."""
    _validate.positive_int("length", length)
    _validate.positive_int("d_model", d_model)
    if d_model % 2:
        raise ValueError(f"d_model must be even (sin and cos pairs), got {d_model}")
    pos = torch.arange(length, dtype=torch.float32, device=device)[:, None]  # (L, 1)
    freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float32, device=device) / d_model)  # (d_model/2,)
    pe = torch.empty(length, d_model, device=device)
    pe[:, 0::2] = torch.sin(pos * freq)  # (L, d_model/2)
    pe[:, 1::2] = torch.cos(pos * freq)
    return pe


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's per-head slopes (Press et al. 2022), (num_heads,): for a power of two n the
    geometric sequence 2^(-8/n), 2^(-16/n), ..., 2^(-8); otherwise the slopes of the nearest
    smaller power of two, completed by every other slope of the next power of two."""
    _validate.positive_int("num_heads", num_heads)

    def geometric(n):
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    p = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = geometric(p) + geometric(2 * p)[0::2][: num_heads - p]
    return torch.tensor(slopes)


def alibi_bias(
    num_heads: int, q_len: int, k_len: int | None = None, *, causal: bool = True, device=None
) -> torch.Tensor:
    """ALiBi as a float mask to add to the scores, (num_heads, q_len, k_len):
    ``-slope_h · |i - j|`` for query i and key j, with query i at absolute position
    ``i + k_len - q_len`` (bottom-right aligned, as in cached decoding). With ``causal=True`` the
    future (j after i) is ``-inf``, so the bias is also the causal mask."""
    k_len = q_len if k_len is None else k_len
    _validate.positive_int("q_len", q_len)
    _validate.positive_int("k_len", k_len)
    if q_len > k_len:
        raise ValueError(f"q_len ({q_len}) cannot exceed k_len ({k_len}): queries are the last positions")
    qpos = torch.arange(k_len - q_len, k_len, device=device)[:, None]  # (Lq, 1)
    kpos = torch.arange(k_len, device=device)[None, :]  # (1, Lk)
    minus_distance = -(qpos - kpos).abs()  # (Lq, Lk) integers: 0 on the diagonal is +0.0, not -0.0
    bias = alibi_slopes(num_heads).to(device)[:, None, None] * minus_distance  # (h, Lq, Lk)
    if causal:
        bias = bias.masked_fill(kpos > qpos, float("-inf"))
    return bias


# ---------------------------------------------------------------------------------------------
# RoPE


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _check_head_dim(head_dim) -> int:
    _validate.positive_int("head_dim", head_dim)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (RoPE rotates pairs of coordinates), got {head_dim}")
    return head_dim


def rope_frequencies(head_dim: int, theta: float = 10000.0, *, device=None) -> torch.Tensor:
    """The rotation speed of each pair, (head_dim / 2,) float32: ω_i = theta^(-2i / head_dim),
    from 1 radian per position (i = 0) down to nearly theta^(-1)."""
    _check_head_dim(head_dim)
    if not theta > 0:
        raise ValueError(f"theta must be positive, got {theta}")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim  # (head_dim/2,)
    return 1.0 / (theta**exponents)


def _positions(positions) -> torch.Tensor:
    if not isinstance(positions, torch.Tensor):
        positions = torch.as_tensor(positions)
    if positions.dtype.is_floating_point or positions.dtype == torch.bool or positions.dim() != 1:
        raise TypeError(f"positions must be a 1-D integer tensor (L,), got {positions.dtype} {tuple(positions.shape)}")
    return positions


def rope_cos_sin(positions, head_dim: int, theta: float = 10000.0, *, layout: str = "half", dtype=torch.float32):
    """cos and sin of every coordinate's angle, each (L, head_dim) in ``dtype``.

    positions: (L,) integers. The angle of pair i at position p is p · ω_i (in float32); the
    "half" layout repeats the head_dim/2 angles as [a_0 … a_{d/2-1}, a_0 … a_{d/2-1}], the
    "interleaved" layout as [a_0, a_0, a_1, a_1, …].
    """
    _check_layout(layout)
    positions = _positions(positions)
    angles = positions[:, None].float() * rope_frequencies(head_dim, theta, device=positions.device)  # (L, d/2)
    if layout == "half":
        angles = torch.cat([angles, angles], dim=-1)  # (L, head_dim)
    else:
        angles = angles.repeat_interleave(2, dim=-1)  # (L, head_dim)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dim: the 90° turn of every pair
    (i, i + d/2) in the "half" layout."""
    x1, x2 = x.chunk(2, dim=-1)  # (..., d/2) each
    return torch.cat([-x2, x1], dim=-1)  # (..., d)


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """(x_2i, x_2i+1) -> (-x_2i+1, x_2i): the 90° turn of every adjacent pair ("interleaved" layout)."""
    pairs = x.unflatten(-1, (-1, 2))  # (..., d/2, 2)
    return torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)  # (..., d)


def apply_rotation(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, layout: str = "half") -> torch.Tensor:
    """Rotate every pair of x by the angles whose cos and sin are given (from :func:`rope_cos_sin`):
    x · cos + turn90(x) · sin. x (..., L, head_dim); cos, sin broadcastable to x."""
    _check_layout(layout)
    turn = rotate_half if layout == "half" else rotate_pairs
    return x * cos + turn(x) * sin


def apply_rope(x: torch.Tensor, positions, *, theta: float = 10000.0, layout: str = "half") -> torch.Tensor:
    """Rotary position embedding of queries or keys.

    x: (..., L, head_dim), e.g. (B, h, L, head_dim); positions: (L,) integer positions of the L
    rows (absolute: during cached decoding the new rows start at the cache length).
    Returns x with pair i of the row at position p turned by p · theta^(-2i/head_dim), same shape
    and dtype. Apply it to q and k, never to v. Equal to ``transformers``' ``apply_rotary_pos_emb``
    with layout="half"; to multiplying by e^{i·p·ω} in the complex view with layout="interleaved".
    """
    _validate.tensor("x", x, floating=True)
    if x.dim() < 2:
        raise ValueError(f"x must be (..., L, head_dim), got shape {tuple(x.shape)}")
    positions = _positions(positions)
    if positions.shape[0] != x.shape[-2]:
        raise ValueError(f"positions has {positions.shape[0]} entries but x has L={x.shape[-2]} rows")
    cos, sin = rope_cos_sin(positions.to(x.device), x.shape[-1], theta, layout=layout, dtype=x.dtype)  # (L, hd)
    return apply_rotation(x, cos, sin, layout=layout)


class RotaryEmbedding(nn.Module):
    """RoPE for one attention layer: ``rope(x, start)`` rotates x (B, h, L, head_dim) as
    positions start, start+1, …, start+L-1 (start = the number of positions already cached).
    Holds no parameters; pass it to ``GroupedQueryAttention.forward(..., rope=rope)``."""

    def __init__(self, head_dim: int, theta: float = 10000.0, *, layout: str = "half"):
        super().__init__()
        _check_layout(layout)
        self.head_dim, self.theta, self.layout = _check_head_dim(head_dim), float(theta), layout
        rope_frequencies(head_dim, theta)  # validates theta

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        _validate.positive_int("start", start, allow_zero=True)
        positions = torch.arange(start, start + x.shape[-2], device=x.device)  # (L,)
        return apply_rope(x, positions, theta=self.theta, layout=self.layout)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta:g}, layout={self.layout!r}"


def interleaved_to_half(head_dim: int) -> torch.Tensor:
    """The coordinate order that turns the "interleaved" layout into the "half" one, (head_dim,):
    ``x_half = x_interleaved[..., perm]`` with perm = [0, 2, 4, …, d-2, 1, 3, …, d-1], so that
    pair (2i, 2i+1) lands on (i, i + d/2). Its inverse is ``torch.argsort(perm)``."""
    _check_head_dim(head_dim)
    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])  # (head_dim,)


def permute_rows_for_half(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """W_Q or W_K (num_heads·head_dim, d_model) of a model trained with the "interleaved" layout,
    with the rows of each head reordered by :func:`interleaved_to_half`: run with the "half"
    layout, the permuted weights give the same scores (q·k is unchanged when q and k have
    their coordinates permuted alike). A bias (num_heads·head_dim,) is permuted the same way."""
    _validate.tensor("weight", weight, dims=(1, 2))
    _validate.positive_int("num_heads", num_heads)
    if weight.shape[0] % num_heads:
        raise ValueError(f"weight has {weight.shape[0]} rows, not a multiple of num_heads={num_heads}")
    head_dim = weight.shape[0] // num_heads
    perm = interleaved_to_half(head_dim)
    heads = weight.unflatten(0, (num_heads, head_dim))  # (h, head_dim, ...)
    return heads[:, perm].flatten(0, 1)  # (h*head_dim, ...)
