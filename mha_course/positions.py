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


ROPE_TYPES = ("default", "linear", "llama3", "yarn")
_SCALING_KEYS = {  # rope_type -> (required keys, optional keys), as in transformers' rope_parameters
    "default": (set(), set()),
    "linear": ({"factor"}, set()),
    "llama3": ({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}, set()),
    "yarn": (
        {"factor", "original_max_position_embeddings"},
        {"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"},
    ),
}


def _scaling_params(scaling, theta: float) -> tuple[str, dict]:
    """Validate a transformers ``rope_scaling`` / ``rope_parameters`` dict; return (rope_type, dict)."""
    if scaling is None:
        return "default", {}
    if not isinstance(scaling, dict):
        raise TypeError(f"scaling must be a dict like transformers' rope_scaling, got {type(scaling).__name__}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))  # "type": transformers v4's old key
    if kind == "dynamic":
        raise ValueError(
            "scaling rope_type 'dynamic' changes θ with the running sequence length, so it has no fixed "
            "frequencies: at s times max_position_embeddings it is plain RoPE with "
            "theta · (factor·s − factor + 1)^(d/(d−2)) (NTK-aware scaling: factor = 1)"
        )
    if kind not in _SCALING_KEYS:
        raise ValueError(f"scaling rope_type must be one of {ROPE_TYPES}, got {kind!r}")
    required, optional = _SCALING_KEYS[kind]
    missing = sorted(required - set(scaling))
    unknown = sorted(set(scaling) - required - optional - {"rope_type", "type", "rope_theta"})
    if missing or unknown:
        raise ValueError(f"scaling for rope_type {kind!r}: missing keys {missing}, unknown keys {unknown}")
    if "rope_theta" in scaling and float(scaling["rope_theta"]) != float(theta):
        raise ValueError(f"scaling has rope_theta={scaling['rope_theta']} but theta={theta}: pass the same value")
    if "factor" in scaling and not float(scaling["factor"]) >= 1.0:
        raise ValueError(f"scaling factor must be >= 1 (the context grows by it), got {scaling['factor']}")
    return kind, scaling


def _llama3(freqs: torch.Tensor, p: dict) -> torch.Tensor:
    """Llama 3.1: pairs slower than the trained context divided by ``factor``, fast ones kept,
    a linear blend (in 1/wavelength) in between. freqs (d/2,) -> (d/2,)."""
    factor, low, high = float(p["factor"]), float(p["low_freq_factor"]), float(p["high_freq_factor"])
    old_len = float(p["original_max_position_embeddings"])
    wavelen = 2 * math.pi / freqs  # (d/2,) positions per turn
    smooth = ((old_len / wavelen - low) / (high - low)).clamp(0, 1)  # 0: slow (interpolate), 1: fast (keep)
    return (1 - smooth) * freqs / factor + smooth * freqs


def _yarn(freqs: torch.Tensor, theta: float, head_dim: int, p: dict) -> torch.Tensor:
    """YaRN (Peng et al. 2023, "NTK-by-parts"): pairs that turn more than beta_fast times within
    the trained context keep their speed, pairs turning less than beta_slow times are divided by
    ``factor``, a linear ramp over the pair index in between. freqs (d/2,) -> (d/2,)."""
    factor, old_len = float(p["factor"]), float(p["original_max_position_embeddings"])
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def pair_index(turns):  # the (fractional) pair i that turns `turns` times in old_len positions
        return head_dim * math.log(old_len / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = pair_index(beta_fast), pair_index(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(head_dim // 2, dtype=freqs.dtype) - low) / (high - low)).clamp(0, 1)  # (d/2,)
    keep = 1 - ramp  # (d/2,) 1: the pair keeps its speed, 0: it is divided by factor
    slow = 1.0 / (factor / freqs)  # (d/2,) ω_i / factor, rounded as transformers rounds it
    return slow * (1 - keep) + freqs * keep


def rope_frequencies(head_dim: int, theta: float = 10000.0, *, scaling=None, device=None) -> torch.Tensor:
    """The rotation speed of each pair, (head_dim / 2,) float32: ω_i = theta^(-2i / head_dim),
    from 1 radian per position (i = 0) down to theta^(-(head_dim-2)/head_dim).

    ``scaling``: a ``transformers`` ``rope_scaling`` / ``rope_parameters`` dict that stretches a
    model's context after training (keys and defaults as in transformers; ``rope_theta`` may be in
    it if it equals ``theta``):

    * ``{"rope_type": "linear", "factor": s}``: position interpolation (Chen et al. 2023), ω_i / s;
    * ``{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
      "original_max_position_embeddings"}``: Llama 3.1's scaling by wavelength;
    * ``{"rope_type": "yarn", "factor", "original_max_position_embeddings", ...}``: YaRN's
      frequencies (its attention factor: :func:`rope_attention_factor`).

    Equal to ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type]``'s inverse
    frequencies. (NTK-aware scaling is plain RoPE with theta · s^(d/(d-2)).)
    """
    _check_head_dim(head_dim)
    if not theta > 0:
        raise ValueError(f"theta must be positive, got {theta}")
    kind, params = _scaling_params(scaling, theta)
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim  # (head_dim/2,)
    freqs = 1.0 / (theta**exponents)  # (head_dim/2,) ω_i, float32 as in Llama's code
    if kind == "linear":
        freqs = freqs / float(params["factor"])
    elif kind == "llama3":
        freqs = _llama3(freqs, params)
    elif kind == "yarn":
        freqs = _yarn(freqs, theta, head_dim, params)
    return freqs.to(device)


def rope_attention_factor(scaling=None) -> float:
    """The factor cos and sin are multiplied by (so each q·k by its square): YaRN's
    ``attention_factor`` if given, else 0.1 · ln(factor) + 1 (or its mscale / mscale_all_dim
    variant, DeepSeek's); 1.0 for every other rope_type. As ``transformers``' attention_scaling."""
    kind, p = _scaling_params(scaling, float((scaling or {}).get("rope_theta", 10000.0)))
    if kind != "yarn":
        return 1.0
    if p.get("attention_factor") is not None:
        return float(p["attention_factor"])

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    factor = float(p["factor"])
    if p.get("mscale") and p.get("mscale_all_dim"):
        return float(mscale(factor, p["mscale"]) / mscale(factor, p["mscale_all_dim"]))
    return float(mscale(factor))


def _positions(positions) -> torch.Tensor:
    if not isinstance(positions, torch.Tensor):
        positions = torch.as_tensor(positions)
    if positions.dtype.is_floating_point or positions.dtype == torch.bool or positions.dim() != 1:
        raise TypeError(f"positions must be a 1-D integer tensor (L,), got {positions.dtype} {tuple(positions.shape)}")
    return positions


def rope_cos_sin(
    positions, head_dim: int, theta: float = 10000.0, *, layout: str = "half", dtype=torch.float32, scaling=None
):
    """cos and sin of every coordinate's angle, each (L, head_dim) in ``dtype``.

    positions: (L,) integers. The angle of pair i at position p is p · ω_i (in float32, ω_i from
    :func:`rope_frequencies` with ``scaling``); the "half" layout repeats the head_dim/2 angles as
    [a_0 … a_{d/2-1}, a_0 … a_{d/2-1}], the "interleaved" layout as [a_0, a_0, a_1, a_1, …].
    Both are multiplied by :func:`rope_attention_factor` (YaRN's; 1 otherwise), as in transformers.
    """
    _check_layout(layout)
    positions = _positions(positions)
    freqs = rope_frequencies(head_dim, theta, scaling=scaling, device=positions.device)  # (d/2,)
    angles = positions[:, None].float() * freqs  # (L, d/2)
    if layout == "half":
        angles = torch.cat([angles, angles], dim=-1)  # (L, head_dim)
    else:
        angles = angles.repeat_interleave(2, dim=-1)  # (L, head_dim)
    factor = rope_attention_factor(scaling)
    return (angles.cos() * factor).to(dtype), (angles.sin() * factor).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dim: the 90° turn of
    every pair (i, i + d/2) in the "half" layout."""
    x1, x2 = x.chunk(2, dim=-1)  # (..., d/2) each
    return torch.cat([-x2, x1], dim=-1)  # (..., d)


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """(x_2i, x_2i+1) -> (-x_2i+1, x_2i): the 90° turn of every adjacent pair ("interleaved" layout)."""
    pairs = x.unflatten(-1, (-1, 2))  # (..., d/2, 2)
    return torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)  # (..., d)


def apply_rotation(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str = "half",
) -> torch.Tensor:
    """Rotate every pair of x by the angles whose cos and sin are given (from
    :func:`rope_cos_sin`): x · cos + turn90(x) · sin. x (..., L, head_dim); cos, sin
    broadcastable to x."""
    _check_layout(layout)
    turn = rotate_half if layout == "half" else rotate_pairs
    return x * cos + turn(x) * sin


def apply_rope(
    x: torch.Tensor, positions, *, theta: float = 10000.0, layout: str = "half", scaling=None
) -> torch.Tensor:
    """Rotary position embedding of queries or keys.

    x: (..., L, head_dim), e.g. (B, h, L, head_dim); positions: (L,) integer positions of the L
    rows (absolute: during cached decoding the new rows start at the cache length).
    Returns x with pair i of the row at position p turned by p · theta^(-2i/head_dim), same shape
    and dtype. Apply it to q and k, never to v. Equal to ``transformers``' ``apply_rotary_pos_emb``
    with layout="half"; to multiplying by e^{i·p·ω} in the complex view with layout="interleaved".
    ``scaling``: a context-extension dict (see :func:`rope_frequencies`).
    """
    _validate.tensor("x", x, floating=True)
    if x.dim() < 2:
        raise ValueError(f"x must be (..., L, head_dim), got shape {tuple(x.shape)}")
    positions = _positions(positions)
    if positions.shape[0] != x.shape[-2]:
        raise ValueError(f"positions has {positions.shape[0]} entries but x has L={x.shape[-2]} rows")
    cos, sin = rope_cos_sin(
        positions.to(x.device), x.shape[-1], theta, layout=layout, dtype=x.dtype, scaling=scaling
    )  # (L, head_dim) each
    return apply_rotation(x, cos, sin, layout=layout)


class RotaryEmbedding(nn.Module):
    """RoPE for one attention layer: ``rope(x, start)`` rotates x (B, h, L, head_dim) as
    positions start, start+1, …, start+L-1 (start = the number of positions already cached).
    Holds no parameters; pass it to ``GroupedQueryAttention.forward(..., rope=rope)``.
    ``scaling``: a context-extension dict (transformers' rope_scaling, see :func:`rope_frequencies`).
    ``rotary_dim``: partial rotary (Qwen3-Next, GLM, Phi): only the first ``rotary_dim``
    coordinates of each head turn, with the frequencies of a ``rotary_dim``-wide RoPE; the rest
    pass unchanged (transformers' ``partial_rotary_factor`` = rotary_dim / head_dim)."""

    def __init__(self, head_dim: int, theta: float = 10000.0, *, layout: str = "half", scaling=None, rotary_dim=None):
        super().__init__()
        _check_layout(layout)
        self.head_dim, self.theta, self.layout = _check_head_dim(head_dim), float(theta), layout
        self.rotary_dim = head_dim if rotary_dim is None else _check_head_dim(rotary_dim)
        if self.rotary_dim > head_dim:
            raise ValueError(f"rotary_dim must be at most head_dim={head_dim}, got rotary_dim={rotary_dim}")
        self.scaling = None if scaling is None else dict(scaling)
        rope_frequencies(self.rotary_dim, theta, scaling=scaling)  # validates theta and scaling

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        _validate.positive_int("start", start, allow_zero=True)
        positions = torch.arange(start, start + x.shape[-2], device=x.device)  # (L,)
        if self.rotary_dim == x.shape[-1]:
            return apply_rope(x, positions, theta=self.theta, layout=self.layout, scaling=self.scaling)
        turned, kept = x[..., : self.rotary_dim], x[..., self.rotary_dim :]  # (..., L, rd), (..., L, hd - rd)
        turned = apply_rope(turned, positions, theta=self.theta, layout=self.layout, scaling=self.scaling)
        return torch.cat([turned, kept], dim=-1)  # (..., L, head_dim)

    def extra_repr(self) -> str:
        kind = (self.scaling or {}).get("rope_type", "default")
        partial = f", rotary_dim={self.rotary_dim}" if self.rotary_dim != self.head_dim else ""
        return f"head_dim={self.head_dim}, theta={self.theta:g}, layout={self.layout!r}, scaling={kind!r}{partial}"


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
