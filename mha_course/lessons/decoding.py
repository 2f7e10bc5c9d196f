"""Decoding with a KV cache, and the pictures of notebook 06 (GQA, MQA and the KV cache).

``decode`` runs a :class:`~mha_course.GroupedQueryAttention` layer the way a decoder generates:
a prompt in one call, then one new position per step, either appending each step's K/V to a
:class:`~mha_course.KVCache` or recomputing the whole prefix; ``decode_step`` sets up one cached
step for timing. ``draw_head_groups`` draws which K/V head each query head reads;
``draw_cache_explorer`` is the explorer's figure.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from .. import validation
from ..accounting import kv_cache_bytes
from ..configs import MODEL_CONFIGS
from ..gqa import GroupedQueryAttention, repeat_kv
from ..kv_cache import KVCache

GIB = 2**30  # bytes in a GiB


def family_name(num_heads: int, num_kv_heads: int) -> str:
    """The family name: MHA (num_kv_heads == num_heads), MQA (== 1) or GQA (in between)."""
    _check_heads(num_heads, num_kv_heads)
    if num_kv_heads == num_heads:
        return "MHA"
    return "MQA" if num_kv_heads == 1 else "GQA"


def kv_head_for_query(num_heads: int, num_kv_heads: int) -> list[int]:
    """The K/V head each query head reads, read off :func:`~mha_course.repeat_kv` itself:
    entry i is the KV head that repeat_kv puts at query head i (= i // (num_heads // num_kv_heads))."""
    _check_heads(num_heads, num_kv_heads)
    labels = torch.arange(num_kv_heads).view(1, num_kv_heads, 1, 1)  # (B=1, h_kv, L=1, d=1): KV head ids
    return repeat_kv(labels, num_heads // num_kv_heads).flatten().tolist()  # (h,)


def _check_heads(num_heads, num_kv_heads) -> None:
    validation.positive_int("num_kv_heads", num_kv_heads)
    validation.kv_heads(num_heads, num_kv_heads)


def _group_colour(g: int, num_groups: int):
    if num_groups <= 10:
        return plt.get_cmap("tab10")(g)
    return plt.get_cmap("viridis")(g / (num_groups - 1))


def draw_head_groups(num_heads: int, num_kv_heads: int, *, ax=None, title: str | None = None):
    """Draw query heads (top row) and the K/V heads they read (bottom row), one line per query
    head, coloured by group. Returns the Axes; ``ax.lines[i]`` connects query head i to its KV head."""
    mapping = kv_head_for_query(num_heads, num_kv_heads)
    n_rep = num_heads // num_kv_heads
    if ax is None:
        _, ax = plt.subplots(figsize=(max(6.0, 0.28 * num_heads + 1.5), 2.2))
    kv_x = [g * n_rep + (n_rep - 1) / 2 for g in range(num_kv_heads)]  # each KV head under its group
    for i, g in enumerate(mapping):
        ax.plot([i, kv_x[g]], [0.85, 0.15], color=_group_colour(g, num_kv_heads), lw=1.2)
    for i, g in enumerate(mapping):
        ax.add_patch(plt.Rectangle((i - 0.4, 0.85), 0.8, 0.3, color=_group_colour(g, num_kv_heads)))
    for g, x in enumerate(kv_x):
        ax.add_patch(plt.Rectangle((x - 0.45, -0.15), 0.9, 0.3, color=_group_colour(g, num_kv_heads), ec="black"))
    step = 1 if num_heads <= 16 else 4  # label every head when there is room, else every 4th
    for i in range(0, num_heads, step):
        ax.text(i, 1.25, str(i), ha="center", va="bottom", fontsize=7)
    for g in range(0, num_kv_heads, step if num_kv_heads > 16 else 1):
        ax.text(kv_x[g], -0.25, str(g), ha="center", va="top", fontsize=7)
    ax.set_xlim(-1, num_heads)
    ax.set_ylim(-0.6, 1.6)
    ax.set_yticks([0, 1], [f"K/V heads ({num_kv_heads})", f"query heads ({num_heads})"])
    ax.set_xlabel("head index (query head i reads K/V head i // n_rep)")
    ax.set_xticks([])
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    if title is None:
        if n_rep == 1:
            share = "every query head has its own K/V head"
        elif num_kv_heads == 1:
            share = f"all {num_heads} query heads share one K/V head"
        else:
            share = f"each group of {n_rep} query heads shares one K/V head"
        title = f"{family_name(num_heads, num_kv_heads)}: num_kv_heads={num_kv_heads} — {share}"
    ax.set_title(title)
    return ax


def draw_cache_explorer(
    num_kv_heads: int = 8, context_len: int = 8192, *, model: str = "Llama 3 8B", bytes_per_element: int = 2
):
    """The explorer's figure for ``model``: left, the head-to-group mapping for ``num_kv_heads``;
    right, the KV-cache size (GiB, batch 1) at ``context_len`` tokens for every valid num_kv_heads,
    the chosen one highlighted. Returns the Figure."""
    cfg = MODEL_CONFIGS[model]
    _check_heads(cfg.num_heads, num_kv_heads)
    validation.positive_int("context_len", context_len)
    options = [k for k in range(1, cfg.num_heads + 1) if cfg.num_heads % k == 0]
    gib = [
        kv_cache_bytes(cfg.num_layers, k, cfg.head_dim, context_len, bytes_per_element=bytes_per_element) / GIB
        for k in options
    ]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 3.2), gridspec_kw={"width_ratios": [2.3, 1]})
    draw_head_groups(cfg.num_heads, num_kv_heads, ax=left)
    colours = ["tab:orange" if k == num_kv_heads else "lightgray" for k in options]
    bars = right.bar([str(k) for k in options], gib, color=colours, edgecolor="black")
    right.bar_label(bars, labels=[f"{g:.3g}" for g in gib], fontsize=7)
    right.set_xlabel("num_kv_heads")
    right.set_ylabel("KV cache (GiB)")
    right.set_ylim(0, max(gib) * 1.15)
    chosen = gib[options.index(num_kv_heads)]
    right.set_title(f"KV cache at {context_len:,} tokens: {chosen:.3g} GiB (batch 1)")
    fig.suptitle(
        f"{model} ({cfg.num_layers} layers, head_dim {cfg.head_dim}, {8 * bytes_per_element}-bit cache): "
        f"{family_name(cfg.num_heads, num_kv_heads)} with {num_kv_heads} K/V heads"
    )
    fig.tight_layout()
    return fig


@torch.no_grad()
def decode(layer: GroupedQueryAttention, x, *, prompt_len: int = 1, use_cache: bool = True, preallocate: bool = False):
    """Causal self-attention computed the way a decoder generates: positions [0, prompt_len) in
    one call (the prefill), then one new position per step.

    x (B, L, d_model) -> out (B, L, d_model), equal to ``layer(x, is_causal=True)``.
    ``use_cache=True``: each step feeds only the new position; its K/V are appended to a KVCache
    and the query attends to everything cached (``preallocate=True``: a KVCache with max_length=L,
    written in place). ``use_cache=False``: each step re-runs the layer on the whole prefix
    x[:, :t+1] and keeps the new rows. Returns (out, cache); cache is None without one.
    """
    if not isinstance(layer, GroupedQueryAttention):
        raise TypeError(f"layer must be a GroupedQueryAttention, got {type(layer).__name__}")
    validation.tensor("x", x, dims=3, floating=True)
    L = x.shape[1]
    validation.positive_int("prompt_len", prompt_len)
    if prompt_len > L:
        raise ValueError(f"prompt_len={prompt_len} is longer than the sequence, x has L={L}")
    cache = (KVCache(max_length=L) if preallocate else KVCache()) if use_cache else None
    outs = []
    for start, end in [(0, prompt_len)] + [(t, t + 1) for t in range(prompt_len, L)]:
        if use_cache:  # one newest query may see every cached key: no mask (without padding)
            out, _ = layer(x[:, start:end], cache=cache, is_causal=end - start > 1, need_weights=False)
        else:
            out, _ = layer(x[:, :end], is_causal=True, need_weights=False)  # (B, end, d_model)
            out = out[:, start:]  # keep only the new positions
        outs.append(out)
    return torch.cat(outs, dim=1), cache  # (B, L, d_model)


def decode_step(layer: GroupedQueryAttention, new, cache: KVCache, *, preallocated: bool = False):
    """A function that runs one cached decode step of ``layer``, for timing: the token ``new``
    (B, 1, d_model) attends to the positions ``cache`` holds now, plus itself. ``cache`` is left
    unchanged, so every call does the same work. The function returns out (B, 1, d_model).

    ``preallocated=False``: a growing cache, whose update concatenates — the step copies all
    T + 1 positions' K and V. ``preallocated=True``: a cache with room for T + 1 positions (filled
    once, before timing); the step writes the new position in place and reads views."""
    if not isinstance(layer, GroupedQueryAttention):
        raise TypeError(f"layer must be a GroupedQueryAttention, got {type(layer).__name__}")
    validation.tensor("new", new, dims=3, floating=True)
    if not isinstance(cache, KVCache) or cache.length == 0:
        raise ValueError("cache must be a KVCache that already holds some positions")
    keys, values = cache.keys, cache.values  # (B, h_kv, T, head_dim)
    T = cache.length
    room = KVCache(max_length=T + 1)
    room.update(keys, values)  # copied once, here, not in the timed step

    @torch.no_grad()
    def step():
        if preallocated:
            room.crop(T)  # forget the previous call's new position: the same T at every call
            return layer(new, cache=room, need_weights=False)[0]  # (B, 1, d_model)
        fresh = KVCache()
        fresh.update(keys, values)  # the same T cached positions at every call (stored, not copied)
        return layer(new, cache=fresh, need_weights=False)[0]  # (B, 1, d_model)

    return step


def bytes_written(fn) -> int:
    """Run ``fn()`` and return how many bytes its PyTorch operations wrote: the outputs of every
    operation that creates tensors, plus the target of every in-place write (``copy_`` into a
    slice counts the slice). Views write nothing and count 0. Counted from the operations that
    ran (aten dispatch), not timed — the same on every machine."""
    from torch.utils._python_dispatch import TorchDispatchMode

    def nbytes(t) -> int:
        return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0

    total = 0

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            nonlocal total
            out = func(*args, **(kwargs or {}))
            if func.is_view:
                return out
            if func._schema.is_mutable:  # in place / out=: the written argument(s)
                written = [a for a, spec in zip(args, func._schema.arguments, strict=False) if spec.is_write]
                written += [v for k, v in (kwargs or {}).items() if k == "out"]
                total += sum(nbytes(t) for t in written)
            else:
                outs = out if isinstance(out, (tuple, list)) else (out,)
                total += sum(nbytes(t) for t in outs)
            return out

    with _Count():
        fn()
    return total
