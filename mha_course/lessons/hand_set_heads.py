"""Notebook 02's example sentence, with hand-set heads that each answer one question.

    "Xiaoming handed the book to Xiaohong because she wanted to read it"

Every token is a vector of d_model = 12 named features (:data:`FEATURES`): which entity it names
(Xiaoming, Xiaohong, book), its kind (male, female, thing), which verb it is (handed, wanted,
read), whether it is a pronoun or a subject, and its clause (+1 in "Xiaoming handed the book to
Xiaohong", -1 in "because she wanted to read it"). Three heads (d_head = 4) get their own W_Q,
W_K, W_V, written by hand so that each head asks one question (:data:`HEAD_NAMES`):

    head 0 "who is it?"      queries ask for a kind; keys say which entity a token names:
                             "she" -> Xiaohong, "it" -> book (a noun finds itself)
    head 1 "what do I do?"   a subject asks for a verb of its own clause:
                             "Xiaoming" -> handed, "she" -> wanted and read
    head 2 "acted on what?"  a transitive verb asks for a named thing: "handed", "read" -> book

Head 0 and head 2 hand over the identity of the entity they found, head 1 the identity of the verb.
W_O writes each head's answer into its own output features (:data:`OUT_FEATURES`: "refers to ·",
"does ·", "acts on ·") and adds heads 0 and 2 into "involves ·" — output features that read two
heads at once.

Weights use the math convention of the formulas, ``Q_i = X @ W_Q[i]``: ``W_Q[i]`` is
(d_model, d_head) and ``W_O`` is (h * d_head, d_model). No biases.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Rectangle

from ..multihead import LoopedMultiHeadAttention

TOKENS = ("Xiaoming", "handed", "the", "book", "to", "Xiaohong", "because", "she", "wanted", "to", "read", "it")
FEATURES = (
    "Xiaoming",
    "Xiaohong",
    "book",
    "male",
    "female",
    "thing",
    "handed",
    "wanted",
    "read",
    "pronoun",
    "subject",
    "clause",
)
HEAD_NAMES = ("who is it?", "what do I do?", "acted on what?")
#: what each head's four output dims hold (its value features; the 4th is unused)
HEAD_DIMS = (
    ("Xiaoming", "Xiaohong", "book", "-"),
    ("handed", "wanted", "read", "-"),
    ("Xiaoming", "Xiaohong", "book", "-"),
)
OUT_FEATURES = (
    "refers to Xiaoming",
    "refers to Xiaohong",
    "refers to book",
    "does handed",
    "does wanted",
    "does read",
    "acts on Xiaoming",
    "acts on Xiaohong",
    "acts on book",
    "involves Xiaoming",
    "involves Xiaohong",
    "involves book",
)
D_MODEL, NUM_HEADS, D_HEAD = 12, 3, 4
#: how strongly a matching query and key agree (a score before the 1/√d_head scaling)
STRENGTH = 12.0

_TOKEN_FEATURES = {
    "Xiaoming": ("Xiaoming", "male", "subject"),
    "handed": ("handed",),
    "book": ("book", "thing"),
    "Xiaohong": ("Xiaohong", "female"),
    "she": ("female", "pronoun", "subject"),
    "wanted": ("wanted",),
    "read": ("read",),
    "it": ("thing", "pronoun"),
}
_ENTITIES, _KINDS, _VERBS = ("Xiaoming", "Xiaohong", "book"), ("male", "female", "thing"), ("handed", "wanted", "read")


def _f(name: str) -> int:
    return FEATURES.index(name)


def embeddings() -> torch.Tensor:
    """X (L=12, d_model=12): one row per token of :data:`TOKENS`, 1.0 on each feature it has,
    and "clause" = +1 for tokens 0-5 and -1 for tokens 6-11. ("the", "to", "because" have only
    their clause.)"""
    x = torch.zeros(len(TOKENS), D_MODEL)
    for i, tok in enumerate(TOKENS):
        for name in _TOKEN_FEATURES.get(tok, ()):
            x[i, _f(name)] = 1.0
        x[i, _f("clause")] = 1.0 if i < TOKENS.index("because") else -1.0
    return x


def head_weights(strength: float = STRENGTH) -> dict[str, torch.Tensor]:
    """The hand-set projections: ``w_q, w_k, w_v`` (h=3, d_model=12, d_head=4) and ``w_o`` (12, 12).

    head 0: q = strength·[male, female, thing, 0];     k = v = [Xiaoming, Xiaohong, book, 0]
    head 1: q = strength·[subject, clause, 0, 0];      k = [handed + wanted + read, clause, 0, 0]
            v = [handed, wanted, read, 0]
    head 2: q = strength·[handed + read, 0, 0, 0];     k = [book, 0, 0, 0]
            v = [Xiaoming, Xiaohong, book, 0]
    """
    w_q, w_k, w_v = (torch.zeros(NUM_HEADS, D_MODEL, D_HEAD) for _ in range(3))
    for j, (kind, entity, verb) in enumerate(zip(_KINDS, _ENTITIES, _VERBS, strict=True)):
        w_q[0, _f(kind), j] = strength  # head 0 asks "which entity of my kind?" ...
        w_k[0, _f(entity), j] = 1.0  # ... and only tokens that name an entity answer
        w_v[0, _f(entity), j] = w_v[2, _f(entity), j] = 1.0  # heads 0, 2 hand over the entity
        w_v[1, _f(verb), j] = 1.0  # head 1 hands over the verb
        w_k[1, _f(verb), 0] = 1.0  # head 1: every verb answers "I am an action" ...
    w_q[1, _f("subject"), 0] = strength  # ... to a subject's question
    w_q[1, _f("clause"), 1] = strength  # same clause: +1·+1 or -1·-1 agree, mixed signs disagree
    w_k[1, _f("clause"), 1] = 1.0
    w_q[2, _f("handed"), 0] = w_q[2, _f("read"), 0] = strength  # head 2: a transitive verb asks ...
    w_k[2, _f("book"), 0] = 1.0  # ... for a thing that is named (the book)
    w_o = torch.zeros(NUM_HEADS * D_HEAD, D_MODEL)  # rows: concat dims; columns: OUT_FEATURES
    for head in range(NUM_HEADS):
        for j in range(3):
            w_o[head * D_HEAD + j, 3 * head + j] = 1.0  # head h's answer -> its own 3 output features
    for j in range(3):  # "involves ·" reads head 0 and head 2
        w_o[j, 9 + j] = w_o[2 * D_HEAD + j, 9 + j] = 1.0
    return {"w_q": w_q, "w_k": w_k, "w_v": w_v, "w_o": w_o}


def describe(w: dict[str, torch.Tensor] | None = None) -> str:
    """The projections in words, read off the matrices: for each head and each of q, k, v,
    what each of its dims computes from the input features (e.g. ``12·female``)."""
    w = head_weights() if w is None else w
    lines = []
    for head in range(NUM_HEADS):
        lines.append(f"head {head} ({HEAD_NAMES[head]})")
        for name in ("q", "k", "v"):
            m = w[f"w_{name}"][head]  # (d_model, d_head)
            dims = []
            for j in range(D_HEAD):
                text = ""
                for i, c in enumerate(m[:, j].tolist()):
                    if c:
                        sign = "-" if c < 0 else ("+" if text else "")
                        coef = "" if abs(c) == 1 else f"{abs(c):g}·"
                        text += f" {sign} {coef}{FEATURES[i]}" if text else f"{sign}{coef}{FEATURES[i]}"
                dims.append(text or "0")
            lines.append(f"  {name} = [{', '.join(dims)}]")
    return "\n".join(lines)


def attention_by_hand(x: torch.Tensor, w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Multi-head attention written out: per head project, score, softmax, weigh; concat; W_O.

    x (L, d_model); w as :func:`head_weights`. Returns ``weights`` (h, L, L), ``heads``
    (h, L, d_head), ``concat`` (L, h*d_head) and ``out`` (L, d_model).
    """
    q, k, v = x @ w["w_q"], x @ w["w_k"], x @ w["w_v"]  # (h, L, d_head): each head, the whole sequence
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (h, L, L)
    weights = torch.softmax(scores, dim=-1)  # one softmax per head and query
    heads = weights @ v  # (h, L, d_head)
    concat = torch.cat(list(heads), dim=-1)  # (L, h*d_head): head i in columns [i*d_head, (i+1)*d_head)
    return {"weights": weights, "heads": heads, "concat": concat, "out": concat @ w["w_o"]}


@torch.no_grad()
def looped_module(w: dict[str, torch.Tensor] | None = None) -> LoopedMultiHeadAttention:
    """A bias-free :class:`~mha_course.LoopedMultiHeadAttention` holding the hand-set weights.

    ``nn.Linear`` stores its weight transposed, (out, in): head i's ``q.weight`` is ``w_q[i].T``.
    """
    w = head_weights() if w is None else w
    m = LoopedMultiHeadAttention(D_MODEL, NUM_HEADS, bias=False)
    for i, head in enumerate(m.heads):
        for name in ("q", "k", "v"):
            head[name].weight.copy_(w[f"w_{name}"][i].T)
    m.out_proj.weight.copy_(w["w_o"].T)
    return m


def token_labels() -> list[str]:
    """Tick labels "0 Xiaoming", "1 handed", ... (the two "to"s stay distinguishable)."""
    return [f"{i} {t}" for i, t in enumerate(TOKENS)]


def draw_head(head: int = 0, query: int = 7):
    """Explorer figure for the hand-set heads: head ``head``'s attention map (L×L) with the row of
    token ``query`` outlined in red, and that row as bars over the keys. Returns the Figure; its
    second Axes holds one bar per token whose heights are the row's weights."""
    if head not in range(NUM_HEADS):
        raise ValueError(f"head must be in 0..{NUM_HEADS - 1}, got head={head}")
    if query not in range(len(TOKENS)):
        raise ValueError(f"query must be a token position in 0..{len(TOKENS) - 1}, got query={query}")
    from ..kit.plotting import heatmap

    weights = attention_by_hand(embeddings(), head_weights())["weights"][head]  # (L, L)
    labels = token_labels()
    fig, (ax_map, ax_row) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [5, 4]})
    heatmap(
        weights,
        row_labels=labels,
        col_labels=labels,
        ax=ax_map,
        vmin=0,
        vmax=1,
        cmap="Blues",
        title=f"head {head} ({HEAD_NAMES[head]}): every query row",
        xlabel="key (attended to)",
        ylabel="query (attending)",
    )
    ax_map.add_patch(Rectangle((-0.5, query - 0.5), len(TOKENS), 1, fill=False, edgecolor="red", linewidth=2))
    row = weights[query]
    bars = ax_row.bar(range(len(TOKENS)), row.tolist(), color="tab:blue")
    ax_row.bar_label(bars, labels=[f"{p:.2f}" if p >= 0.05 else "" for p in row.tolist()], fontsize=8)
    ax_row.set_xticks(range(len(TOKENS)))
    ax_row.set_xticklabels(labels, rotation=45, ha="right")
    ax_row.set_ylim(0, 1.1)
    ax_row.set_xlabel("key (attended to)")
    ax_row.set_ylabel("attention weight (the row sums to 1)")
    top = int(row.argmax())
    ax_row.set_title(f"row of '{TOKENS[query]}': most weight on '{TOKENS[top]}' ({row[top]:.3f})")
    fig.suptitle(f"Head {head} — {HEAD_NAMES[head]} — seen from token {query} '{TOKENS[query]}'")
    fig.tight_layout()
    return fig
