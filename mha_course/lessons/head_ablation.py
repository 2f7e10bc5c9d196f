"""Which head does what: attention mass on a relation's target, head ablation and pruning (notebook 07).

**Ablating head i** means setting its output to zero before W_O: head i owns the column block
[i·d_head, (i+1)·d_head) of the concatenation (W_O's input), so zeroing that block removes
exactly head i's contribution — the other heads, W_O's bias and the residual path are untouched.
This is the head mask ξ_i ∈ {0, 1} of Michel et al. (2019), ``MultiHead = Σ_i ξ_i · head_i W_O^(i)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import contextmanager

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Rectangle

from ..kit.plotting import heatmap
from ..multihead import MultiHeadAttention

#: outline colours of the two relations' targets in :func:`draw_head_maps`
LOOKUP_COLOUR, OFFSET_COLOUR = "red", "orange"


def column_mask(num_heads: int, d_head: int, removed: Iterable[int]) -> torch.Tensor:
    """(h·d_head,) float: 0 on the column blocks of the removed heads, 1 elsewhere."""
    keep = torch.ones(num_heads)
    for i in removed:
        if not 0 <= i < num_heads:
            raise ValueError(f"head {i} does not exist: the layer has num_heads={num_heads}")
        keep[i] = 0.0
    return keep.repeat_interleave(d_head)  # head i -> columns [i*d_head, (i+1)*d_head)


@contextmanager
def ablated(attn: MultiHeadAttention, removed: Iterable[int]):
    """Inside the ``with`` block, ``attn`` runs with the heads in ``removed`` zeroed.

    Implemented as a forward pre-hook on ``attn.out_proj`` that multiplies its input (the
    concatenated heads, (B, L, h·d_head)) by :func:`column_mask`; the hook is removed on exit.
    """
    mask = column_mask(attn.num_heads, attn.d_head, list(removed))
    handle = attn.out_proj.register_forward_pre_hook(lambda module, args: (args[0] * mask,))
    try:
        yield attn
    finally:
        handle.remove()


def attention_mass(weights: torch.Tensor, target_pos: torch.Tensor, query_pos: torch.Tensor) -> torch.Tensor:
    """Mean attention each head puts on a relation's target, over queries and sequences.

    weights: (B, h, L, L); query_pos: (S,) the query positions looked at; target_pos: (S,) or
    (B, S) the position each of those queries should attend to under the relation.
    Returns (h,): 1.0 means a head always attends only to the target, 1/L a uniform spread.
    """
    B, h = weights.shape[:2]
    target_pos = target_pos.expand(B, -1)  # (B, S)
    rows = weights[:, :, query_pos, :]  # (B, h, S, L)
    index = target_pos[:, None, :, None].expand(B, h, -1, 1)  # (B, h, S, 1)
    return rows.gather(-1, index).squeeze(-1).mean(dim=(0, 2))  # (h,)


def head_importance(attn: MultiHeadAttention, score: Callable[[], float]) -> list[float]:
    """Drop of ``score()`` (e.g. accuracy) when each head alone is removed: [score(all) - score(without i)]."""
    full = score()
    drops = []
    for i in range(attn.num_heads):
        with ablated(attn, [i]):
            drops.append(full - score())
    return drops


def pruning_curve(attn: MultiHeadAttention, score: Callable[[], float], order: Iterable[int]) -> list[float]:
    """``score()`` with 0, 1, 2, … heads removed, the heads removed in ``order`` (least important first)."""
    order = list(order)
    scores = [score()]
    for k in range(1, len(order) + 1):
        with ablated(attn, order[:k]):
            scores.append(score())
    return scores


def draw_ablation(accuracy: Callable[[list[int]], dict[str, float]], num_heads: int, removed=()) -> plt.Figure:
    """Bar chart of the accuracies (exact, lookup, offset) with the heads in ``removed`` zeroed.

    ``accuracy(removed)`` returns {'exact', 'lookup', 'offset'} for a list of removed heads
    (the notebook's explorer passes a function that evaluates a trained model).
    """
    removed = sorted(removed)
    acc = accuracy(removed)
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    names = ["exact", "lookup", "offset"]
    bars = ax.bar(names, [acc[n] for n in names], color=["tab:purple", "tab:blue", "tab:orange"])
    ax.bar_label(bars, fmt="%.3f")
    kept = [i for i in range(num_heads) if i not in removed]
    title = "all heads" if not removed else f"heads removed: {removed}; kept: {kept}"
    ax.set(title=f"Accuracy with {title}", xlabel="part of the answer", ylabel="accuracy", ylim=(0, 1.12))
    fig.tight_layout()
    return fig


def draw_head_maps(weights, labels, rows, lookup_pos, offset_pos, *, title: str) -> plt.Figure:
    """One heatmap per head of one sequence's attention, for the query rows ``rows``.

    weights: (h, L, L); labels: L record names; rows, lookup_pos, offset_pos: (S,) long — the
    query positions shown and, for each, the position of its lookup and offset answer, outlined
    in red (lookup) and orange (offset). Each panel's title gives the head's mean weight on the two.
    """
    h = weights.shape[0]
    rows, lookup_pos, offset_pos = (torch.as_tensor(t) for t in (rows, lookup_pos, offset_pos))
    ncols = 1 if h == 1 else 2
    nrows = -(-h // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.2 * ncols, 2.9 * nrows + 0.5), squeeze=False)
    for ax in axes.flat[h:]:
        ax.set_visible(False)
    for i, ax in enumerate(axes.flat[:h]):
        w = weights[i][rows]  # (S, L)
        on_lookup = w.gather(1, lookup_pos[:, None]).mean().item()
        on_offset = w.gather(1, offset_pos[:, None]).mean().item()
        heatmap(
            w,
            row_labels=[f"{t}: {labels[t]}" for t in rows.tolist()],
            col_labels=list(labels),
            ax=ax,
            vmin=0,
            vmax=1,
            cmap="Blues",
            annotate=False,
            xlabel="key (record attended to)",
            ylabel="query (position: record)",
            title=f"head {i}: on lookup {on_lookup:.2f}, on offset {on_offset:.2f}",
        )
        for r, (j, o) in enumerate(zip(lookup_pos.tolist(), offset_pos.tolist(), strict=True)):
            for col, colour in ((j, LOOKUP_COLOUR), (o, OFFSET_COLOUR)):
                ax.add_patch(Rectangle((col - 0.5, r - 0.5), 1, 1, fill=False, edgecolor=colour, linewidth=2))
    fig.suptitle(f"{title}\n(outlined: lookup answer in {LOOKUP_COLOUR}, offset answer in {OFFSET_COLOUR})")
    fig.tight_layout()
    return fig
