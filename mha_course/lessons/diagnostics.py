"""Diagnostics for attention layers: the evidence behind the troubleshooting table (notebook 17).

========================  ===========================================  =======================
symptom                   diagnostic                                   healthy value
========================  ===========================================  =======================
uniform weights           :func:`attention_entropy` (normalised) ≈ 1   well below 1 once trained
saturated / one-hot       :func:`attention_entropy` (normalised) ≈ 0   above 0 for most heads
identical heads           :func:`head_similarity` off-diagonal ≈ 1     well below 1
NaN / inf outputs         :func:`find_nonfinite` names the module       nothing found
mask without effect       :func:`causal_leakage` > 0 (causal models)    exactly 0
========================  ===========================================  =======================

:func:`report` runs them all on a model and a batch; :func:`draw_report` draws its dashboard and
:func:`draw_dependency` the causal dependency matrix. Attention weights are read with forward
hooks (:func:`capture_attention`) from every module that returns ``(out, weights)`` with
weights (B, h, Lq, Lk) — ``mc.MultiHeadAttention``, ``mc.GroupedQueryAttention`` and their
subclasses. The leakage test reuses ``mha_course.mask_tools.dependency_matrix`` (notebook 05).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import torch
from torch import nn

from .. import validation
from ..kit.plotting import heatmap
from ..kit.verify import mark
from .mask_lab import dependency_matrix

# ---------------------------------------------------------------------------------------------
# attention weights: entropy and head similarity
# ---------------------------------------------------------------------------------------------


def _weights(weights: torch.Tensor) -> torch.Tensor:
    """Validate and return weights as (B, h, Lq, Lk) float64 (a 3-D (h, Lq, Lk) gets B = 1)."""
    validation.tensor("weights", weights, dims=(3, 4), floating=True)
    w = weights.detach().double()
    return w[None] if w.dim() == 3 else w


def attention_entropy(weights: torch.Tensor, *, normalize: bool = False) -> torch.Tensor:
    """Mean entropy of each head's attention rows, in nats: (h,).

    weights: (B, h, Lq, Lk) or (h, Lq, Lk), each row a distribution over the keys.
    Row entropy H = -Σ_j p_j log p_j with 0·log 0 = 0; the mean is over batch and query rows.
    ``normalize=True`` divides each row's entropy by log(n), n = the number of keys the row
    could attend to: 1 = uniform over the allowed keys, 0 = one-hot. A masked key gets weight
    exactly 0, so n counts the keys that get weight > 0 in *any* head of the same (batch, query)
    row (masks are shared by the heads, and a saturated head's underflow is not mistaken for a
    mask); when that is 1, n = Lk. Rows that are all zero (fully masked) and rows holding NaN
    are skipped. A head whose rows are all skipped gets NaN.
    """
    w = _weights(weights)
    plogp = torch.where(w > 0, w * torch.log(w.clamp_min(1e-300)), torch.zeros_like(w))
    h_row = -plogp.sum(dim=-1)  # (B, h, Lq)
    valid = torch.isfinite(w).all(dim=-1) & (w.sum(dim=-1) > 0)  # (B, h, Lq)
    if normalize:
        n = (w > 0).any(dim=1, keepdim=True).sum(dim=-1)  # (B, 1, Lq) keys some head could see
        n = torch.where(n > 1, n, torch.full_like(n, w.shape[-1]))
        h_row = h_row / torch.log(n.double()).clamp_min(1e-12)
    h_row = torch.where(valid, h_row, torch.nan)
    return h_row.nanmean(dim=(0, 2)).float()  # (h,)


def head_similarity(weights: torch.Tensor) -> torch.Tensor:
    """How alike the heads' attention patterns are: (h, h), 1 on the diagonal.

    Entry [i, j] = 1 - mean over (batch, query) of the total-variation distance
    ½ Σ_k |p_ik - p_jk| between head i's and head j's row: 1 = the two heads attend identically
    (one is redundant), 0 = they never put weight on the same keys. weights: (B, h, Lq, Lk) or
    (h, Lq, Lk). Rows holding NaN are skipped.
    """
    w = _weights(weights)  # (B, h, Lq, Lk)
    tv = 0.5 * (w[:, :, None] - w[:, None, :]).abs().sum(dim=-1)  # (B, h, h, Lq)
    return (1 - tv.nanmean(dim=(0, 3))).clamp(0, 1).float()  # (h, h)


def column_concentration(weights: torch.Tensor) -> torch.Tensor:
    """Attention collapse: how much of a sequence's attention one key receives, per head: (h,).

    In each sequence, the weight each key receives is averaged over the query rows, and the
    largest average is kept (the most-attended key's share); the result is the mean over the
    batch. 1 = in every sequence, every query puts all its weight on one and the same key
    (collapse); 1/Lk = every key receives the same share. A one-hot head that looks at a
    *different* key from each query (a lookup) scores low: only a shared target scores high.
    weights: (B, h, Lq, Lk) or (h, Lq, Lk). Rows holding NaN are skipped.
    """
    w = _weights(weights)  # (B, h, Lq, Lk)
    received = w.nanmean(dim=2)  # (B, h, Lk): each key's mean weight over the queries
    return received.max(dim=-1).values.mean(dim=0).float()  # (h,)


@torch.no_grad()
def capture_attention(model: nn.Module, *args, **kwargs) -> dict[str, torch.Tensor]:
    """Run ``model(*args, **kwargs)`` once and return the attention weights of every layer:
    module name -> (B, h, Lq, Lk), in the order the layers ran. A layer is any submodule whose
    output is a tuple ``(out, weights)`` with 4-D weights (``mc.MultiHeadAttention`` and kin,
    called with ``need_weights=True``, as ``EncoderBlock`` does)."""
    found: dict[str, torch.Tensor] = {}

    def hook(name):
        def fn(module, inputs, output):
            if isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], torch.Tensor):
                if output[1].dim() == 4:
                    found[name] = output[1].detach()

        return fn

    handles = [m.register_forward_hook(hook(name)) for name, m in model.named_modules() if name]
    try:
        model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return found


# ---------------------------------------------------------------------------------------------
# NaN / inf: where does the first non-finite value appear?
# ---------------------------------------------------------------------------------------------


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _tensors(item)]
    if isinstance(x, dict):
        return [t for item in x.values() for t in _tensors(item)]
    return []


def _kind(tensors: list[torch.Tensor]) -> str:
    nan = any(t.is_floating_point() and torch.isnan(t).any() for t in tensors)
    inf = any(t.is_floating_point() and torch.isinf(t).any() for t in tensors)
    return " and ".join(k for k, present in (("NaN", nan), ("inf", inf)) if present)


@dataclass(frozen=True)
class NonFinite:
    """What :func:`find_nonfinite` saw.

    ``first``: the module where the first NaN or inf was created — ``"input"`` when the batch
    itself was not finite, None when everything was finite. ``kind``: "NaN", "inf" or
    "NaN and inf" (of that first bad output). ``trace``: (module name, fraction of its main
    output that is not finite) for every module that ran, in execution order (no-op
    Dropout/Identity modules left out): how the values spread.
    """

    first: str | None
    kind: str
    trace: list[tuple[str, float]] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return self.first is not None

    def __repr__(self) -> str:
        if not self.found:
            return f"{mark(True)} · no NaN or inf anywhere (inputs, every module's output)"
        spread = sum(frac > 0 for _, frac in self.trace)
        final = f", {self.trace[-1][1]:.0%} of the final output" if self.trace else ""
        return (
            f"⚠️ {self.kind} first appears in {self.first}; then non-finite in {spread} of "
            f"{len(self.trace)} module outputs{final}"
        )


@torch.no_grad()
def find_nonfinite(model: nn.Module, *args, **kwargs) -> NonFinite:
    """Run ``model(*args, **kwargs)`` with a forward hook on every submodule and report where
    the first NaN or inf was created (see :class:`NonFinite`).

    Hooks fire when a module finishes, so inner modules report before the module that contains
    them. The first module whose output is not finite is the culprit if its own inputs were
    finite; if its inputs were already bad, the value was made by the code of the module that
    contains it (e.g. a softmax between two sub-layers), and that module is named, with
    "(its own code, before <child>)".
    """
    inputs = [t for t in _tensors(args) + _tensors(kwargs) if t.is_floating_point()]
    bad_input = _kind(inputs)
    trace: list[tuple[str, float]] = []
    first: list[tuple[str, str]] = [("input", bad_input)] if bad_input else []

    def hook(name):
        def fn(module, inp_args, inp_kwargs, output):
            tensors = [t for t in _tensors(output) if t.is_floating_point()]
            if not tensors:
                return
            trace.append((name, (~torch.isfinite(tensors[0])).float().mean().item()))
            kind = _kind(tensors)
            if kind and not first:
                given = [t for t in _tensors(inp_args) + _tensors(inp_kwargs) if t.is_floating_point()]
                where = name
                if _kind(given) and "." in name:  # made before this module ran: by its parent's code
                    parent, _, child = name.rpartition(".")
                    where = f"{parent} (its own code, before {child})"
                first.append((where, kind))

        return fn

    skip = (nn.Dropout, nn.Identity)
    handles = [
        m.register_forward_hook(hook(name or "(model)"), with_kwargs=True)
        for name, m in model.named_modules()
        if not isinstance(m, skip)
    ]
    try:
        model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    if not first:
        return NonFinite(None, "", trace)
    return NonFinite(first[0][0], first[0][1], trace)


# ---------------------------------------------------------------------------------------------
# causal leakage
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def causal_leakage(fn: Callable, x: torch.Tensor, *, dim: int = 1, seed: int = 0) -> tuple[float, torch.Tensor]:
    """Does information flow from later positions to earlier ones? Returns ``(leak, matrix)``.

    ``matrix`` (L_out, L_in) is ``mask_tools.dependency_matrix(fn, x)``: entry [i, j] = max
    change of output position i when only input position j is perturbed. ``leak`` = its largest
    entry above the diagonal (j > i): exactly 0 for a causal function, > 0 when a future input
    reaches a past output — a causal mask that was not passed, inverted or misaligned.
    ``fn(x)`` maps (B, L, d) -> (B, L, d') (a tuple's first element is used).
    """
    matrix = dependency_matrix(fn, x, dim=dim, seed=seed)  # (L_out, L_in)
    above = torch.ones_like(matrix, dtype=torch.bool).triu(diagonal=1)
    leak = matrix[above].max().item() if above.any() else 0.0
    return leak, matrix


# ---------------------------------------------------------------------------------------------
# one report over a model and a batch
# ---------------------------------------------------------------------------------------------

UNIFORM = 0.95  # normalised entropy at or above: (nearly) uniform
ONE_HOT = 0.02  # normalised entropy at or below: (nearly) one-hot, the softmax is saturated
REDUNDANT = 0.99  # head similarity at or above: the two heads attend identically
LEAK_TOL = 1e-6  # leakage above this is information from the future


@dataclass
class Report:
    """The findings of :func:`report`; ``repr`` is a short table with ✅ / ⚠️ per diagnostic.

    ``entropy``: layer -> (h,) normalised entropy; ``similarity``: layer -> (h, h);
    ``nonfinite``: :class:`NonFinite`; ``leakage`` and ``dependency``: from
    :func:`causal_leakage` (None when the model was not declared causal);
    ``findings``: one line per problem found (empty when healthy).
    """

    entropy: dict[str, torch.Tensor]
    similarity: dict[str, torch.Tensor]
    nonfinite: NonFinite
    leakage: float | None = None
    dependency: torch.Tensor | None = None
    findings: list[str] = field(default_factory=list)
    causal: bool = False

    @property
    def healthy(self) -> bool:
        return not self.findings

    def __repr__(self) -> str:
        lines = ["attention entropy per head (1 = uniform, 0 = one-hot):"]
        for name, ent in self.entropy.items():
            values = " ".join("  nan" if math.isnan(e) else f"{e:5.2f}" for e in ent.tolist())
            lines.append(f"  {name:<24} {values}")
        lines.append("most similar pair of heads (1 = identical):")
        for name, sim in self.similarity.items():
            i, j, s = _most_similar(sim)
            lines.append(f"  {name:<24} " + ("n/a" if i < 0 else f"heads {i} and {j}: {s:.3f}"))
        lines.append(f"non-finite values: {self.nonfinite!r}")
        if self.leakage is not None:
            leak = "0 (exactly)" if self.leakage == 0 else f"{self.leakage:.3g}"
            lines.append(f"causal leakage (max change of a past output when the future changes): {leak}")
        elif self.causal and self.nonfinite.found:
            lines.append("causal leakage: not measured (the outputs are not finite)")
        lines += [f"⚠️ {f}" for f in self.findings] or [f"{mark(True)} · no problem found"]
        return "\n".join(lines)


def _most_similar(sim: torch.Tensor) -> tuple[int, int, float]:
    """(i, j, similarity) of the most similar pair of distinct heads; (-1, -1, nan) for one head."""
    h = sim.shape[0]
    off = sim.masked_fill(torch.eye(h, dtype=torch.bool) | sim.isnan(), -math.inf)
    if h < 2 or not torch.isfinite(off).any():
        return -1, -1, math.nan
    flat = int(off.argmax())
    return flat // h, flat % h, float(sim.view(-1)[flat])


def report(model: nn.Module, x: torch.Tensor, *, causal: bool = False, trained: bool = True, **kwargs) -> Report:
    """Run every diagnostic on ``model(x, **kwargs)`` (in eval mode); x (B, L, d) float.

    ``causal=True`` declares that the model must not let the future reach the past: then the
    leakage test runs too (when the outputs are finite). ``trained=False`` says the model is
    freshly initialised, where near-uniform attention is normal, so it is not a finding.
    Findings (thresholds in this module): heads whose normalised entropy is >= ``UNIFORM``
    (uniform) or <= ``ONE_HOT`` (saturated); pairs of heads with similarity >= ``REDUNDANT``;
    the first NaN/inf; leakage > ``LEAK_TOL``.
    """
    validation.tensor("x", x, dims=3, floating=True)
    was_training = model.training
    model.eval()
    try:
        weights = capture_attention(model, x, **kwargs)
        nonfinite = find_nonfinite(model, x, **kwargs)
        test_leak = causal and not nonfinite.found
        leak, dep = causal_leakage(lambda t: model(t, **kwargs), x) if test_leak else (None, None)
    finally:
        model.train(was_training)
    entropy = {name: attention_entropy(w, normalize=True) for name, w in weights.items()}
    similarity = {name: head_similarity(w) for name, w in weights.items()}
    findings = []
    for name, ent in entropy.items():
        checks = [(f"one-hot attention (entropy <= {ONE_HOT})", ent <= ONE_HOT)]
        if trained:
            checks.insert(0, (f"uniform attention (entropy >= {UNIFORM})", ent >= UNIFORM))
        for label, flagged in checks:
            heads = flagged.nonzero().flatten().tolist()
            if heads:
                findings.append(f"{label}: {name} heads {heads}")
    for name, sim in similarity.items():
        i, j, s = _most_similar(sim)
        if i >= 0 and s >= REDUNDANT:
            findings.append(f"identical heads (similarity >= {REDUNDANT}): {name} heads {i} and {j}")
    if nonfinite.found:
        findings.append(f"{nonfinite.kind} first appears in {nonfinite.first}")
    if leak is not None and leak > LEAK_TOL:
        findings.append(f"causal leakage {leak:.3g}: past outputs change when only the future changes")
    return Report(entropy, similarity, nonfinite, leak, dep, findings, causal)


def draw_report(rep: Report, *, title: str = "diagnostics") -> plt.Figure:
    """A 2×2 figure of a :class:`Report`: normalised entropy per head and layer (bars, with the
    uniform and one-hot thresholds; NaN heads marked), the head-similarity matrix of the layer
    with the most similar pair, the non-finite fraction of each module's output in execution
    order, and the causal dependency matrix (or why it was not measured)."""
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    ax = axes[0, 0]
    names = list(rep.entropy)
    h = max((len(e) for e in rep.entropy.values()), default=1)
    width = 0.8 / max(len(names), 1)
    for k, name in enumerate(names):
        xs = [i + (k - (len(names) - 1) / 2) * width for i in range(len(rep.entropy[name]))]
        ent = rep.entropy[name].tolist()
        ax.bar(xs, [0.0 if math.isnan(e) else e for e in ent], width=width, label=name)
        for x, e in zip(xs, ent, strict=True):
            if math.isnan(e):
                ax.text(x, 0.03, "NaN", ha="center", color="tab:red", fontsize=8, rotation=90)
    ax.axhline(UNIFORM, color="tab:red", ls="--", lw=1, label=f"uniform ({UNIFORM})")
    ax.axhline(ONE_HOT, color="tab:purple", ls=":", lw=1.5, label=f"one-hot ({ONE_HOT})")
    ax.set(
        ylim=(0, 1.4),  # the band above 1 holds the legend, clear of the bars
        xticks=range(h),
        yticks=[0, 0.2, 0.4, 0.6, 0.8, 1.0],
        title="attention entropy per head",
        xlabel="head",
        ylabel="normalised entropy (1 = uniform)",
    )
    ax.legend(fontsize=7, loc="upper center", ncol=2)

    ax = axes[0, 1]
    if rep.similarity:
        name = max(rep.similarity, key=lambda n: _most_similar(rep.similarity[n])[2])
        sim = rep.similarity[name]
        labels = [f"head {i}" for i in range(sim.shape[0])]
        heatmap(
            sim,
            row_labels=labels,
            col_labels=labels,
            ax=ax,
            vmin=0,
            vmax=1,
            xlabel="head",
            ylabel="head",
            title=f"head similarity (1 = identical): {name}",
        )
        ax.images[0].colorbar.set_label("1 − mean total-variation distance")
    else:
        ax.set_axis_off()
        ax.set_title("head similarity: no attention weights captured")

    ax = axes[1, 0]
    trace = rep.nonfinite.trace
    ax.barh(range(len(trace)), [f for _, f in trace], color="tab:red")
    ax.set_yticks(range(len(trace)))
    ax.set_yticklabels([n for n, _ in trace], fontsize=7)
    ax.invert_yaxis()
    found = f"first: {rep.nonfinite.first}" if rep.nonfinite.found else "none found"
    ax.set(xlim=(0, 1), title=f"NaN/inf per module output ({found})", xlabel="fraction of the output not finite")

    ax = axes[1, 1]
    if rep.dependency is not None:
        draw_dependency(rep.dependency, ax=ax, title=f"causal leakage: {rep.leakage:.3g} (above the diagonal)")
    else:
        ax.set_axis_off()
        why = "the outputs are not finite" if rep.causal and rep.nonfinite.found else "model not declared causal"
        ax.set_title("causal leakage")
        ax.text(0.5, 0.5, f"not measured:\n{why}", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def draw_dependency(matrix: torch.Tensor, *, title: str, ax=None, vmax: float | None = None):
    """The causal dependency matrix of :func:`causal_leakage` (L_out, L_in) as a heatmap with
    position labels: entry [i, j] = how much output i moves when only input j changes; a causal
    model is dark above the diagonal. ``vmax`` caps the colour scale. Returns the Axes."""
    ticks = [str(i) for i in range(matrix.shape[0])]
    ax = heatmap(
        matrix,
        row_labels=ticks,
        col_labels=[str(j) for j in range(matrix.shape[1])],
        ax=ax,
        cmap="magma",
        annotate=False,
        vmin=0,
        vmax=vmax,
        xlabel="perturbed input position j",
        ylabel="output position i",
        title=title,
    )
    ax.images[0].colorbar.set_label("max change of output i")
    return ax
