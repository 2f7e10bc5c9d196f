"""What heads cost, shown rather than told: the FLOPs split, the real-model table, the h explorer.

Builds on :mod:`mha_course.accounting` (the formulas) and :mod:`mha_course.configs` (the models):

- :func:`flops_split` — forward FLOPs of one self-attention layer as (projections, scores);
  :func:`crossover_seq_len` — the length L at which the two are equal (2·d_model for MHA).
- :func:`measured_flops` — the FLOPs PyTorch itself counts when a module runs
  (``torch.utils.flop_counter``), grouped by operator, to check the formulas against.
- :func:`meta_attention_module` — a real-sized attention layer of a :class:`ModelConfig`, built
  on the ``meta`` device (shapes only, no memory); :func:`numel` counts its parameters.
- :func:`model_rows` / :func:`format_table` — the table of ``MODEL_CONFIGS`` as aligned text.
- :func:`draw_flops_vs_length` and :func:`draw_head_budget` — the figures of notebook 03.

Conventions as in ``accounting``: a multiply-add is 2 FLOPs; softmax, scaling and biases are
not counted (they are O(B·h·L²) and O(B·L·d), a factor d_head or d smaller than the matmuls).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Patch
from matplotlib.ticker import ScalarFormatter
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .. import validation
from ..accounting import attention_flops, count_attention_params
from ..configs import MODEL_CONFIGS, ModelConfig
from ..gqa import GroupedQueryAttention

__all__ = [
    "flops_split",
    "crossover_seq_len",
    "measured_flops",
    "meta_attention_module",
    "numel",
    "model_rows",
    "format_table",
    "head_dim_note",
    "draw_flops_vs_length",
    "draw_head_budget",
]

#: d_head of the models in MODEL_CONFIGS ranges over 64–256; 64–128 is the usual band
TYPICAL_HEAD_DIMS = (64, 128)


def flops_split(batch, seq_len, d_model, num_heads, num_kv_heads=None, *, head_dim=None) -> tuple[int, int]:
    """Forward FLOPs of one self-attention layer, as (projections, scores).

    projections: X W_Q, X W_K, X W_V and the output projection — 2·B·L·d·(2·h·hd + 2·h_kv·hd),
        i.e. 8·B·L·d² for MHA (hd = d/h, h_kv = h): linear in L.
    scores: Q Kᵀ and weights @ V, each 2·B·h·L²·hd — together 4·B·L²·d for MHA: quadratic in L.
    The two add up to :func:`mha_course.attention_flops`.
    """
    total = attention_flops(batch, seq_len, d_model, num_heads, num_kv_heads, head_dim=head_dim)
    _, hd = validation.head_shape(d_model, num_heads, num_kv_heads, head_dim)
    scores = 2 * 2 * batch * num_heads * seq_len * seq_len * hd  # QKᵀ (B,h,L,L) and weights@V (B,h,L,hd)
    return total - scores, scores


def crossover_seq_len(d_model, num_heads, num_kv_heads=None, *, head_dim=None) -> float:
    """The length L at which score FLOPs equal projection FLOPs: d·(h + h_kv)/h.

    From 2·B·L·d·(2·h·hd + 2·h_kv·hd) = 4·B·h·L²·hd. For MHA (h_kv = h) that is L = 2·d_model;
    sharing K/V heads (GQA) shrinks the projections and moves the crossover down towards d.
    Longer sequences spend most of the layer's FLOPs on the L×L scores.
    """
    h_kv, _ = validation.head_shape(d_model, num_heads, num_kv_heads, head_dim)
    return d_model * (num_heads + h_kv) / num_heads


def measured_flops(module: nn.Module, *inputs, **kwargs) -> dict[str, int]:
    """Run ``module(*inputs, **kwargs)`` under PyTorch's FLOP counter; FLOPs per aten operator.

    E.g. ``{"aten.addmm": ..., "aten.bmm": ...}``: linear layers appear as ``addmm``/``mm``,
    the batched Q Kᵀ and weights @ V products as ``bmm``. Works on the ``meta`` device too.
    """
    with FlopCounterMode(display=False) as counter:
        module(*inputs, **kwargs)
    return {str(op): int(n) for op, n in counter.get_flop_counts()["Global"].items()}


def meta_attention_module(config: ModelConfig) -> nn.Module:
    """One attention layer of ``config`` at its real size, on the ``meta`` device (no memory).

    MHA models with h·d_head = d_model use ``torch.nn.MultiheadAttention`` (biases on all four
    projections or none); the others (GQA, Gemma 2's head_dim 256) use
    :class:`~mha_course.GroupedQueryAttention`. ``attention_bias == "qkv"`` (Qwen2.5) gives
    q/k/v projections with bias and an o_proj without.
    """
    c = config
    with torch.device("meta"):
        if c.num_kv_heads == c.num_heads and c.num_heads * c.head_dim == c.d_model and c.attention_bias != "qkv":
            return nn.MultiheadAttention(c.d_model, c.num_heads, bias=bool(c.attention_bias))
        m = GroupedQueryAttention(
            c.d_model, c.num_heads, c.num_kv_heads, head_dim=c.head_dim, bias=c.attention_bias is not False
        )
        if c.attention_bias == "qkv":
            m.o_proj = nn.Linear(c.num_heads * c.head_dim, c.d_model, bias=False)
    return m


def numel(module: nn.Module) -> int:
    """Number of parameters of ``module`` (works on the meta device)."""
    return sum(p.numel() for p in module.parameters())


def model_rows(configs=None) -> list[dict]:
    """One row per model: its attention shape, parameters per layer and in total, and the
    ``numel()`` of a real-sized layer built on the meta device (``numel_ok`` when they agree)."""
    rows = []
    for c in MODEL_CONFIGS.values() if configs is None else configs:
        measured = numel(meta_attention_module(c))
        rows.append(
            {
                "model": c.name,
                "layers": c.num_layers,
                "attn modules": c.n_attention_modules,
                "d_model": c.d_model,
                "heads": c.num_heads,
                "KV heads": c.num_kv_heads,
                "d_head": c.head_dim,
                "h·d_head": c.num_heads * c.head_dim,
                "bias": {True: "all", False: "none"}.get(c.attention_bias, "qkv"),
                "params/layer": c.params_per_layer,
                "numel (meta)": measured,
                "params total": c.params_total,
                "numel_ok": measured == c.params_per_layer,
                "source": c.source,
            }
        )
    return rows


def format_table(rows: list[dict], columns: list[str]) -> str:
    """``rows`` as an aligned plain-text table: text left-aligned, numbers right-aligned with
    thousands separators, booleans as ✓/✗."""

    def cell(v):
        if isinstance(v, bool):
            return "✓" if v else "✗"
        return f"{v:,}" if isinstance(v, int) else str(v)

    cells = [[cell(r[c]) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(r[c], int) and not isinstance(r[c], bool) for r in rows) for c in columns]

    def line(values):
        return "  ".join(
            v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)
        ).rstrip()

    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells])


def head_dim_note(d_head: int, num_heads: int) -> str:
    """A one-line reading of what this head width means (the d_head trade-off)."""
    if num_heads == 1:
        return "One wide head: one softmax per token, so one question at a time (notebook 01's blurred lookup)."
    lo, hi = TYPICAL_HEAD_DIMS
    if d_head < 32:
        return (
            f"Very narrow heads: each head's L×L scores have rank ≤ {d_head} and its value carries "
            f"{d_head} numbers — many questions, each too coarse."
        )
    if d_head < lo:
        return f"Narrower than real models use (they keep {lo}–{hi}): more questions, each less precise."
    if d_head <= hi:
        return f"The {lo}–{hi} band real models use: enough dimensions per question, several questions at once."
    return f"Few wide heads: precise questions but only {num_heads} of them per token (Gemma 2 uses 256)."


def draw_flops_vs_length(d_model: int = 512, *, batch: int = 1, max_len: int | None = None):
    """Projection, score and total FLOPs of one MHA layer against L (log–log), crossover marked.

    The crossover L = 2·d_model is where the 4·B·L²·d scores overtake the 8·B·L·d² projections.
    """
    validation.positive_int("d_model", d_model)
    cross = crossover_seq_len(d_model, 1)
    max_len = int(16 * cross) if max_len is None else validation.positive_int("max_len", max_len)
    lengths = sorted({max(1, round(2 ** (k / 4))) for k in range(4 * max_len.bit_length())} | {max_len})
    lengths = [n for n in lengths if n <= max_len]
    proj, scores = zip(*(flops_split(batch, n, d_model, 1) for n in lengths), strict=True)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.loglog(lengths, proj, label="projections  8·B·L·d²", color="tab:blue")
    ax.loglog(lengths, scores, label="scores  4·B·L²·d", color="tab:orange")
    ax.loglog(lengths, [p + s for p, s in zip(proj, scores, strict=True)], label="total", color="black", ls="--")
    if cross <= max_len:
        ax.axvline(cross, color="grey", lw=1)
        ax.annotate(
            f"crossover L = 2·d = {cross:,.0f}",
            (cross, sum(flops_split(batch, int(cross), d_model, 1))),
            xytext=(8, -30),
            textcoords="offset points",
            fontsize=9,
        )
    ax.set_title(f"FLOPs of one attention layer (d_model = {d_model}, B = {batch})")
    ax.set_xlabel("sequence length L (tokens)")
    ax.set_ylabel("forward FLOPs")
    ax.legend()
    fig.tight_layout()
    return fig


def draw_head_budget(d_model: int = 512, num_heads: int = 8, seq_len: int = 1024):
    """The explorer figure: h heads at fixed d_model — the budget is fixed, only its slicing changes.

    Left: parameters of one head's share (log bars) against the whole layer's 4·d² + 4·d (flat)
    for h = 1, 2, 4, … ; right: d_head = d_model / h with the 64–128 band real models use.
    The chosen ``num_heads`` is highlighted; the title gives d_head, parameters and FLOPs at
    ``seq_len``, and the bottom line reads the trade-off (:func:`head_dim_note`).
    """
    d_head = validation.divisible(d_model, num_heads)
    validation.positive_int("seq_len", seq_len)
    hs = [h for h in (2**k for k in range(d_model.bit_length())) if d_model % h == 0 and h <= max(128, num_heads)]
    if num_heads not in hs:
        hs = sorted(set(hs) | {num_heads})
    total = count_attention_params(d_model, num_heads)
    per_head = [4 * d_model * (d_model // h) for h in hs]  # one head's slices of W_Q, W_K, W_V, W_O (no biases)
    flops = attention_flops(1, seq_len, d_model, num_heads)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    colours = ["tab:red" if h == num_heads else "tab:blue" for h in hs]
    ax1.bar([str(h) for h in hs], per_head, color=colours)
    line = ax1.axhline(total, color="black", ls="--")
    ax1.set_yscale("log")
    ax1.set_title("Parameters: the total is the same for every h")
    ax1.set_xlabel("number of heads h")
    ax1.set_ylabel("parameters")
    handles = [line, Patch(color="tab:blue"), Patch(color="tab:red")]
    labels = [f"all heads: 4·d² + 4·d = {total:,}", "one head's weights: 4·d·d_head", f"h = {num_heads}"]
    ax1.set_ylim(min(per_head) / 2, total * 10)  # headroom above the total line for the legend
    ax1.legend(handles, labels, loc="upper right", fontsize=8)
    lo, hi = TYPICAL_HEAD_DIMS
    ax2.axhspan(lo, hi, color="tab:green", alpha=0.15, label=f"d_head {lo}–{hi} (real models)")
    ax2.plot([str(h) for h in hs], [d_model // h for h in hs], "o-", color="tab:blue")
    ax2.plot([str(num_heads)], [d_head], "o", color="tab:red", ms=10, label=f"h = {num_heads}: d_head = {d_head}")
    ax2.set_yscale("log", base=2)
    ax2.yaxis.set_major_formatter(ScalarFormatter())  # 64, not 2^6
    ax2.set_title("Head width d_head = d_model / h")
    ax2.set_xlabel("number of heads h")
    ax2.set_ylabel("d_head")
    ax2.legend(loc="upper right", fontsize=8)
    fig.suptitle(
        f"d_model = {d_model}, h = {num_heads} → d_head = {d_head}: {total:,} parameters, "
        f"{flops / 1e9:,.2f} GFLOPs at L = {seq_len} (B = 1) — for every h"
    )
    fig.text(0.5, 0.01, head_dim_note(d_head, num_heads), ha="center", fontsize=9, style="italic")
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    return fig
