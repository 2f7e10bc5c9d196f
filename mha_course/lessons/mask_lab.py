"""Masks across APIs, leakage tests and the mask explorer of notebook 05.

The course's own masks (``mc.causal_mask``, ``mc.sliding_window_mask``, ``mc.padding_mask``)
are bool with True = may attend. Other APIs spell the same information differently; this module
converts between them, tests a function for information flowing from the future to the past,
and draws the mask explorer.

Conventions (``CONVENTIONS``; names accepted by :func:`convert`):

========== ======= ============================================================================
name       dtype   meaning of an entry
========== ======= ============================================================================
course     bool    True = may attend (``mha_course``)
sdpa       bool    True = may attend (``F.scaled_dot_product_attention``'s bool ``attn_mask``)
torch_mha  bool    True = BLOCKED (``nn.MultiheadAttention``'s ``attn_mask`` and
                   ``key_padding_mask``, ``nn.Transformer*``)
additive   float   0 = may attend, −inf = blocked; added to the scores (accepted by both
                   ``F.scaled_dot_product_attention`` and ``nn.MultiheadAttention``)
hf         int64   1 = real token, 0 = padding (Hugging Face ``attention_mask``, shape (B, L))
========== ======= ============================================================================
"""

from __future__ import annotations

from collections.abc import Callable

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from .. import validation
from ..attention import scaled_dot_product_attention
from ..kit.plotting import heatmap
from ..masks import causal_mask, sliding_window_mask

CONVENTIONS: dict[str, str] = {
    "course": "bool, True = may attend (mha_course)",
    "sdpa": "bool, True = may attend (F.scaled_dot_product_attention attn_mask)",
    "torch_mha": "bool, True = blocked (nn.MultiheadAttention attn_mask / key_padding_mask)",
    "additive": "float, 0 = may attend, -inf = blocked (added to the scores)",
    "hf": "int64, 1 = real token, 0 = padding (Hugging Face attention_mask)",
}


def _to_course(mask: torch.Tensor, src: str) -> torch.Tensor:
    """``mask`` in convention ``src`` -> bool, True = may attend (same shape)."""
    if src in ("course", "sdpa", "torch_mha"):
        if mask.dtype != torch.bool:
            raise TypeError(f"a {src!r} mask must be bool, got {mask.dtype}")
        return ~mask if src == "torch_mha" else mask
    if src == "additive":
        if not mask.is_floating_point():
            raise TypeError(f"an 'additive' mask must be floating point, got {mask.dtype}")
        blocked = torch.isneginf(mask) | (mask == torch.finfo(mask.dtype).min)
        if not (blocked | (mask == 0)).all():
            raise ValueError(
                "an 'additive' mask must hold only 0 and -inf (or the dtype's minimum); other values "
                "are a score bias (e.g. ALiBi), not a mask, and cannot be converted to bool"
            )
        return ~blocked
    if src == "hf":
        if mask.is_floating_point() or not ((mask == 0) | (mask == 1)).all():
            raise ValueError(f"an 'hf' mask must hold integers 0 and 1, got dtype {mask.dtype}")
        return mask.bool()
    raise ValueError(f"unknown mask convention {src!r}; choose one of {sorted(CONVENTIONS)}")


def convert(mask: torch.Tensor, src: str, dst: str, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rewrite ``mask`` from convention ``src`` to convention ``dst`` (see ``CONVENTIONS``).

    Elementwise, so the shape is unchanged: turning a (B, L) key-padding mask into the
    course's broadcastable (B, 1, 1, L) is :func:`key_padding_to_course`. ``dtype`` is the
    float type of an ``additive`` result. Equivalent to: course→torch_mha ``~mask``;
    course→additive ``zeros.masked_fill(~mask, -inf)``; course→hf ``mask.long()``.
    """
    validation.tensor("mask", mask)
    if dst not in CONVENTIONS:
        raise ValueError(f"unknown mask convention {dst!r}; choose one of {sorted(CONVENTIONS)}")
    allowed = _to_course(mask, src)
    if dst in ("course", "sdpa"):
        return allowed
    if dst == "torch_mha":
        return ~allowed
    if dst == "additive":
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, float("-inf"))
    return allowed.long()  # hf


def key_padding_to_course(key_padding_mask: torch.Tensor) -> torch.Tensor:
    """nn.MultiheadAttention's ``key_padding_mask`` (B, Lk), True = padding ->
    the course's (B, 1, 1, Lk), True = real token (what ``mc.padding_mask`` returns)."""
    validation.tensor("key_padding_mask", key_padding_mask, dims=2)
    return convert(key_padding_mask, "torch_mha", "course")[:, None, None, :]  # (B, 1, 1, Lk)


def course_to_key_padding(mask: torch.Tensor) -> torch.Tensor:
    """The course's padding mask (B, 1, 1, Lk), True = real -> ``key_padding_mask`` (B, Lk),
    True = padding, as ``nn.MultiheadAttention`` wants it."""
    validation.tensor("mask", mask, dims=4)
    if mask.shape[1:3] != (1, 1):
        raise ValueError(f"mask must be a padding mask of shape (B, 1, 1, Lk), got {tuple(mask.shape)}")
    return convert(mask[:, 0, 0, :], "course", "torch_mha")  # (B, Lk)


def leaks(fn: Callable, x: torch.Tensor, *, dim: int = 1) -> bool:
    """True if some output position of ``fn(x)`` depends on a later input position (a
    :func:`leakage` above 0 for some t)."""
    return any(leakage(fn, x, t, dim=dim) > 0 for t in range(x.shape[dim] - 1))


# ---------------------------------------------------------------------------------------------
# An encoder layer that accepts a mask and ignores it, and the fix
# ---------------------------------------------------------------------------------------------


class MaskIgnoringEncoderLayer(nn.Module):
    """A ``TransformerEncoderLayer`` as tutorials often write it: post-norm, built on
    ``nn.MultiheadAttention`` in its default sequence-first layout, (L, B, d_model). Its
    ``forward`` accepts ``src_mask`` — and never passes it on."""

    def __init__(self, d_model=512, num_heads=8, d_ff=2048, dropout=0.1):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, num_heads, dropout=dropout)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, src, src_mask=None):
        attn_out, _ = self.self_attn(src, src, src)
        src = self.norm1(src + self.dropout1(attn_out))
        ff_out = self.linear2(F.relu(self.linear1(src)))
        src = self.norm2(src + self.dropout2(ff_out))
        return src


class MaskRespectingEncoderLayer(MaskIgnoringEncoderLayer):
    """The same layer with the mask passed on. ``src_mask`` is in the course's convention
    (bool, True = may attend, as ``mc.causal_mask`` makes it); ``nn.MultiheadAttention``
    reads True as blocked, so the mask is inverted at the call."""

    def forward(self, src, src_mask=None):
        blocked = None if src_mask is None else ~src_mask  # True = blocked, as nn.MultiheadAttention wants
        attn_out, _ = self.self_attn(src, src, src, attn_mask=blocked)
        src = self.norm1(src + self.dropout1(attn_out))
        ff_out = self.linear2(F.relu(self.linear1(src)))
        src = self.norm2(src + self.dropout2(ff_out))
        return src


# ---------------------------------------------------------------------------------------------
# Leakage: does information flow from later positions to earlier ones?
# ---------------------------------------------------------------------------------------------


def _first(y):
    return y[0] if isinstance(y, (tuple, list)) else y


@torch.no_grad()
def leakage(fn: Callable, x: torch.Tensor, t: int, *, dim: int = 1, noise: float = 1.0, seed: int = 0) -> float:
    """How much the outputs at positions <= t change when the inputs at positions > t change.

    ``fn(x)`` maps a sequence to a sequence along ``dim`` (if it returns a tuple, the first
    element is used, e.g. ``(out, weights)``); ``x`` (..., L, ...) with L along ``dim``.
    Adds Gaussian noise (std ``noise``, generator seeded with ``seed``) to x at positions
    t+1 .. L-1 and returns max |fn(x') - fn(x)| over output positions 0 .. t.
    A causal function gives 0 (up to float rounding); anything larger is a leak from the future.
    """
    validation.tensor("x", x, floating=True)
    L = x.shape[dim]
    if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= L - 2:
        raise ValueError(f"t must be an int in [0, L-2] = [0, {L - 2}] so that some position follows it, got {t!r}")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x2 = x.clone()
    future = x2.narrow(dim, t + 1, L - t - 1)
    future += noise * torch.randn(future.shape, generator=gen, dtype=x.dtype).to(x.device)
    before, after = _first(fn(x)), _first(fn(x2))
    return (after.narrow(dim, 0, t + 1) - before.narrow(dim, 0, t + 1)).abs().max().item()


@torch.no_grad()
def dependency_matrix(
    fn: Callable, x: torch.Tensor, *, dim: int = 1, noise: float = 1.0, seed: int = 0
) -> torch.Tensor:
    """(L_out, L_in) float: entry [i, j] = max |change of output position i| when only input
    position j of ``x`` is perturbed (as in :func:`leakage`). For a causal function it is lower
    triangular; a nonzero entry above the diagonal is a leak from position j to position i < j."""
    validation.tensor("x", x, floating=True)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    base = _first(fn(x))
    cols = []
    for j in range(x.shape[dim]):
        x2 = x.clone()
        pos = x2.narrow(dim, j, 1)
        pos += noise * torch.randn(pos.shape, generator=gen, dtype=x.dtype).to(x.device)
        diff = (_first(fn(x2)) - base).abs().movedim(dim, 0)  # (L_out, ...)
        cols.append(diff.reshape(diff.shape[0], -1).amax(dim=1))
    return torch.stack(cols, dim=1)  # (L_out, L_in)


# ---------------------------------------------------------------------------------------------
# The mask explorer
# ---------------------------------------------------------------------------------------------

WORDS = ["the", "cat", "sat", "on", "a", "warm", "mat", "and", "soon", "fell", "fast", "asleep"]


def build_mask(length: int, *, num_pad: int = 0, causal: bool = False, window: int = 0) -> torch.Tensor:
    """bool (length, length), True = query i may attend to key j, for one sequence whose last
    ``num_pad`` tokens are padding (right padding: those keys are blocked for every query).

    ``causal`` keeps keys j <= i. ``window`` > 0 keeps at most ``window`` keys per query: the
    causal sliding window (i - window < j <= i, as ``mc.sliding_window_mask``) when ``causal``,
    else the symmetric local window |i - j| < window. ``window=0`` means no window.
    """
    validation.positive_int("length", length)
    validation.positive_int("num_pad", num_pad, allow_zero=True)
    validation.positive_int("window", window, allow_zero=True)
    if num_pad > length:
        raise ValueError(f"num_pad={num_pad} exceeds length={length}")
    mask = torch.ones(length, length, dtype=torch.bool)
    if causal:
        mask &= sliding_window_mask(length, window) if window else causal_mask(length)
    elif window:
        pos = torch.arange(length)
        mask &= (pos[:, None] - pos[None, :]).abs() < window
    mask[:, length - num_pad :] = False  # padded keys
    return mask


def draw_mask_explorer(length: int = 8, num_pad: int = 2, causal: bool = True, window: int = 0, seed: int = 0):
    """Figure with two panels for one sequence: the mask of :func:`build_mask` and the attention
    weights that random queries/keys (d_k = 8, seeded) get under it. Fully masked rows show 0.
    ``num_pad`` is capped at ``length`` (so independent sliders cannot ask for more)."""
    num_pad = min(num_pad, length)
    mask = build_mask(length, num_pad=num_pad, causal=causal, window=window)
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, length, 8, generator=gen).unbind(0)
    _, weights = scaled_dot_product_attention(q, k, k, mask)  # (L, L)
    labels = [WORDS[i % len(WORDS)] for i in range(length - num_pad)] + ["<pad>"] * num_pad
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    heatmap(
        mask.float(),
        row_labels=labels,
        col_labels=labels,
        ax=axes[0],
        cmap="Greys",
        vmin=0,
        vmax=1,
        title="mask (1 = may attend)",
        fmt="{:.0f}",
    )
    heatmap(
        weights,
        row_labels=labels,
        col_labels=labels,
        ax=axes[1],
        vmin=0,
        vmax=1,
        title="attention weights (each row sums to 1)",
    )
    pattern = "causal" if causal else "bidirectional"
    win = f"window {window}" if window else "no window"
    fig.suptitle(f"L = {length}, {num_pad} padding, {pattern}, {win}")
    fig.tight_layout()
    return fig
