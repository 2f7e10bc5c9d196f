"""The address book of notebook 01: attention as a soft dictionary lookup.

Three records, each a key (what the record is about) and a value (what it hands over):

    record                   key over KEY_FEATURES    value over VALUE_NAMES
    Zhang San · address      [1, 0, 1, 0]             Xi'an    [1, 0, 0]
    Zhang San · phone        [1, 0, 0, 1]             138xxxx  [0, 1, 0]
    Li Si · address          [0, 1, 1, 0]             Beijing  [0, 0, 1]

A query is a vector over the same four features as the keys (d_k = 4); the lookup is one row of
scaled dot-product attention, softmax(q Kᵀ / √d_k) V. Because the values are one-hot, the output
*is* the attention weights, read as "how much of each answer came back".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch

KEY_FEATURES = ("about Zhang San", "about Li Si", "is address", "is phone")
VALUE_NAMES = ("Xi'an", "138xxxx", "Beijing")
RECORDS = ("Zhang San · address", "Zhang San · phone", "Li Si · address")


def address_book() -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh copies of the keys (3, 4) over KEY_FEATURES and the one-hot values (3, 3) over VALUE_NAMES."""
    keys = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
    values = torch.eye(3)
    return keys, values


def query(zhang_san: float = 0.0, li_si: float = 0.0, address: float = 0.0, phone: float = 0.0) -> torch.Tensor:
    """A query (4,) over KEY_FEATURES: how strongly it asks for each feature (negative = avoid it)."""
    return torch.tensor([zhang_san, li_si, address, phone], dtype=torch.float32)


@dataclass
class LookupSteps:
    """Every intermediate of one lookup, for a query of shape (..., 4)."""

    scores: torch.Tensor  # (..., 3)  q · k for each record
    scaled: torch.Tensor  # (..., 3)  scores / √d_k (unchanged when scaling is off)
    weights: torch.Tensor  # (..., 3) softmax over the records (masked records get 0)
    output: torch.Tensor  # (..., 3)  weights @ values, over VALUE_NAMES


def lookup(q: torch.Tensor, *, scaled: bool = True, mask: torch.Tensor | None = None) -> LookupSteps:
    """Look ``q`` (..., 4) up in the address book, keeping every step.

    ``mask``: bool (3,) or broadcastable to (..., 3), True = this record may be read.
    Equivalent to ``mc.scaled_dot_product_attention(q[..., None, :], keys, values, mask)``.
    """
    keys, values = address_book()
    scores = q @ keys.T  # (..., 3)
    s = scores / math.sqrt(keys.shape[-1]) if scaled else scores
    masked = s if mask is None else s.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(masked, dim=-1).nan_to_num(0.0)  # a fully masked query reads nothing
    return LookupSteps(scores=scores, scaled=s, weights=weights, output=weights @ values)


def table(rows, row_labels, col_labels, *, fmt: str = "{:.3f}") -> str:
    """A small fixed-width text table of a 2-D tensor/list (for printing steps of a lookup)."""
    rows = torch.as_tensor(rows, dtype=torch.float32)
    if rows.dim() == 1:
        rows = rows[None]
    width = max(8, *(len(c) for c in col_labels)) + 1
    lead = max(len(r) for r in row_labels) + 1
    lines = [" " * lead + "".join(f"{c:>{width}}" for c in col_labels)]
    for label, row in zip(row_labels, rows, strict=True):
        lines.append(f"{label:<{lead}}" + "".join(f"{fmt.format(x.item()):>{width}}" for x in row))
    return "\n".join(lines)


def draw_bars(series: dict, labels, *, title: str, xlabel: str, ylabel: str):
    """Grouped bar chart of a few lookups side by side: one group per label, one bar per series.

    ``series`` maps a legend name to values of shape (len(labels),), e.g. attention weights over
    RECORDS or outputs over VALUE_NAMES; every bar carries its value (3 decimals). The legend
    sits to the right of the axes, clear of the bars. Returns the Figure.
    """
    n = len(series)
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(10, 3.6))
    for i, (name, values) in enumerate(series.items()):
        x = torch.arange(len(labels)) + (i - (n - 1) / 2) * width  # bar i of every group
        bars = ax.bar(x.tolist(), torch.as_tensor(values).tolist(), width, label=name)
        ax.bar_label(bars, fmt="%.3f", fontsize=8)
    ax.set_xticks(range(len(labels)), labels)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel, ylim=(0, 1.1))
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    return fig


def draw_lookup(
    zhang_san: float = 3.0, li_si: float = 0.0, address: float = 1.0, phone: float = 1.0, scaled: bool = True
):
    """Explorer figure: the query's weight on each record and the answer it reads (bar charts).

    Returns a Figure with three Axes: the query features, the attention weights over RECORDS,
    and the output over VALUE_NAMES. The defaults are the combined "address and phone" query.
    """
    q = query(zhang_san, li_si, address, phone)
    steps = lookup(q, scaled=scaled)
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2), gridspec_kw={"width_ratios": [4, 3, 3]})
    panels = (
        (axes[0], KEY_FEATURES, q, "query q (what you ask)", "feature weight", "tab:gray", (-4.5, 8.5), "%g"),
        (axes[1], RECORDS, steps.weights, "attention weights (sum to 1)", "weight", "tab:blue", (0, 1.12), "%.3f"),
        (
            axes[2],
            VALUE_NAMES,
            steps.output,
            "output = weights @ V",
            "amount of answer",
            "tab:orange",
            (0, 1.12),
            "%.3f",
        ),
    )
    for ax, labels, data, title, ylabel, colour, ylim, fmt in panels:
        bars = ax.bar(range(len(labels)), data.tolist(), color=colour)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=20, ha="right")
        ax.set(title=title, ylabel=ylabel, ylim=ylim)
        ax.bar_label(bars, fmt=fmt, fontsize=8)
        ax.axhline(0, color="black", linewidth=0.6)
    scale_note = "scores / √d_k = /2" if scaled else "unscaled scores"
    fig.suptitle(f"Lookup with q = [{', '.join(f'{x:g}' for x in q.tolist())}]  ({scale_note})")
    fig.tight_layout()
    return fig
