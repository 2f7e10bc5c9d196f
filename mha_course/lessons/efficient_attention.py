"""Notebook 09's helpers: the figures of tiled attention, and the readable multi-head attention
turned into :class:`mha_course.fast.FastMultiHeadAttention` one optimisation at a time."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from ..attention import attention_weights
from ..fast import FastMultiHeadAttention
from ..heads import merge_heads, split_heads
from ..masks import causal_mask, sliding_window_mask
from ..multihead import MultiHeadAttention
from ..tiled import tile_counts, tile_states


def draw_tiles(masks: dict, block_size: int):
    """Figure: for each named (Lq, Lk) mask, its tiles — skipped, partly masked or fully computed."""
    from matplotlib.colors import ListedColormap

    fig, axes = plt.subplots(1, len(masks), figsize=(4.2 * len(masks), 4.2), squeeze=False, layout="constrained")
    cmap = ListedColormap(["#f0f0f0", "#f4a259", "#2a6f97"])
    for ax, (name, mask) in zip(axes[0], masks.items(), strict=True):
        states = tile_states(mask, block_size)
        computed, skipped, total = tile_counts(mask, block_size)
        im = ax.imshow(states.cpu().numpy(), cmap=cmap, vmin=-0.5, vmax=2.5)
        ax.set_title(f"{name}\n{computed} of {total} tiles computed, {skipped} skipped")
        ax.set_xlabel(f"key block (size {block_size})")
        ax.set_ylabel(f"query block (size {block_size})")
    bar = fig.colorbar(im, ax=axes[0].tolist(), ticks=[0, 1, 2], fraction=0.03)
    bar.ax.set_yticklabels(["skipped", "partly masked", "all allowed"])
    fig.suptitle(f"Which score tiles tiled attention computes (L = {mask.shape[0]}, block {block_size})")
    return fig


def draw_tile_explorer(seq_len: int = 1024, block_size: int = 128, window: int = 256):
    """The explorer's figure: the tiles of a causal mask and of a causal sliding window of
    ``window`` keys (:func:`mha_course.sliding_window_mask`) at ``seq_len`` and ``block_size``."""
    masks = {"causal": causal_mask(seq_len), f"sliding window {window}": sliding_window_mask(seq_len, window)}
    return draw_tiles(masks, block_size)


# ---------------------------------------------------------------------------------------------
# from the readable module to the fast one, one change at a time


def speed_steps(mha: MultiHeadAttention) -> dict:
    """Four self-attention functions ``f(x, mask) -> (out, weights)`` (x (B, L, d_model), mask a
    bool (L, L), True = may attend), all computing ``mha``'s function with per-head weights, each
    adding one optimisation to the one before:

    ``readable``       ``mha`` itself: three projections, scale q, scores, mask, softmax, weighted sum
    ``+ fused QKV``    one (3·d_model × d_model) matmul for the three projections
    ``+ folded scale`` W_Q stored pre-multiplied by 1/√d_head: nothing is scaled per call
    ``+ in place``     mask and softmax overwrite one score buffer (``FastMultiHeadAttention``)
    """
    fast = FastMultiHeadAttention.from_module(mha).eval()
    h = mha.num_heads
    w_qkv = torch.cat([mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight]).detach()  # unscaled
    b_qkv = None if mha.q_proj.bias is None else torch.cat([mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias])

    def fused_qkv(x, mask):
        q, k, v = (split_heads(t, h) for t in F.linear(x, w_qkv, b_qkv).chunk(3, dim=-1))  # 3 × (B, h, L, d_head)
        weights = attention_weights(q, k, mask)  # (B, h, L, L): scales q, then the readable steps
        return mha.out_proj(merge_heads(weights @ v)), weights  # (B, L, d_model)

    def folded_scale(x, mask):
        q, k, v = (split_heads(t, h) for t in fast.qkv_proj(x).chunk(3, dim=-1))  # q already × 1/√d_head
        scores = (q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf"))  # (B, h, L, L), a new buffer
        weights = torch.softmax(scores, dim=-1)  # (B, h, L, L), a second buffer
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # rows with no allowed key
        return mha.out_proj(merge_heads(weights @ v)), weights  # (B, L, d_model)

    return {
        "readable": lambda x, mask: mha(x, mask=mask),
        "+ fused QKV": fused_qkv,
        "+ folded scale": folded_scale,
        "+ in place": lambda x, mask: fast(x, mask=mask),
    }
