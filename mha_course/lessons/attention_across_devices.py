"""Notebook 14's lesson code: a first collective, the figures of who holds what, and the tables of
equality and communication. The attention itself lives in :mod:`mha_course.distributed`."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import distributed as md

__all__ = [
    "hello",
    "source",
    "draw_head_layout",
    "draw_ring_schedule",
    "ring_schedule",
    "communication_rows",
    "format_table",
]


def hello():
    """A rank's first job: its rank, the world size, and the sum of every rank's number (one all-reduce)."""
    x = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(x)  # every rank ends with 0 + 1 + ... + (P - 1)
    return dist.get_rank(), dist.get_world_size(), int(x.item())


def source(fn) -> str:
    """The source of ``fn`` without its docstring (the code a learner reads)."""
    import inspect
    import textwrap

    text = textwrap.dedent(inspect.getsource(fn))
    if not fn.__doc__:
        return text
    first = text.index('"""')
    end = text.index('"""', first + 3) + 3  # the docstring's closing quotes
    return text[: text.rfind("\n", 0, first) + 1] + text[text.index("\n", end) + 1 :]


def draw_head_layout(num_heads: int, num_kv_heads: int, world_size: int):
    """Figure: which rank holds each query head (top row) and each KV head (bottom row, with every
    rank that holds a copy) under :func:`mha_course.distributed.heads_of_rank`."""
    import matplotlib.pyplot as plt

    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(1.0 + 0.62 * num_heads, 2.5))
    owners = {kv: [] for kv in range(num_kv_heads)}
    for rank in range(world_size):
        q_heads, kv_heads = md.heads_of_rank(rank, world_size, num_heads, num_kv_heads)
        for i in q_heads.tolist():
            ax.add_patch(plt.Rectangle((i, 1.2), 0.9, 0.8, color=colours(rank)))
            ax.text(i + 0.45, 1.6, f"q{i}", ha="center", va="center", color="white", fontsize=9)
        for kv in kv_heads.tolist():
            owners[kv].append(rank)
    width = num_heads / num_kv_heads  # a KV head sits under the query heads that read it
    for kv, ranks in owners.items():
        for j, rank in enumerate(ranks):  # one copy per rank that holds it
            x0, w = kv * width + j * width / len(ranks), width / len(ranks) - 0.1
            ax.add_patch(plt.Rectangle((x0, 0), w, 0.8, color=colours(rank)))
            ax.text(x0 + w / 2, 0.4, f"kv{kv}", ha="center", va="center", color="white", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours(r)) for r in range(world_size)]
    ax.legend(handles, [f"rank {r}" for r in range(world_size)], loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set(xlim=(-0.1, num_heads), ylim=(-0.1, 2.1), yticks=[0.4, 1.6], yticklabels=["KV heads", "query heads"])
    ax.set_xlabel("head index (a KV head is drawn under the query heads that read it)")
    ax.set_title(f"{num_heads} query heads, {num_kv_heads} KV heads on {world_size} ranks")
    fig.tight_layout()
    return fig


def ring_schedule(world_size: int, layout: str, causal: bool = True) -> torch.Tensor:
    """int64 (2P, 2P) over (query chunk, key chunk) of a sequence cut into 2P chunks: the ring step
    at which the rank holding the query chunk computes that pair, or -1 if the causal mask skips it."""
    P = world_size
    L = 2 * P  # one position per chunk
    step_of = torch.full((L, L), -1, dtype=torch.long)
    for rank in range(P):
        rows = md.sequence_positions(L, rank, P, layout)
        for step in range(P):
            cols = md.sequence_positions(L, (rank - step) % P, P, layout)  # the K/V block held at this step
            for i in rows.tolist():
                for j in cols.tolist():
                    if not causal or j <= i:
                        step_of[i, j] = step
    return step_of


def draw_ring_schedule(world_size: int):
    """Figure: the causal ring's (query chunk, key chunk) pairs for the contiguous and the balanced
    layout — colour = ring step at which they are computed, blank = skipped; rows labelled by the rank
    that holds the queries, with each rank's count of computed pairs."""
    import matplotlib.pyplot as plt

    P = world_size
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 5.0), gridspec_kw={"wspace": 0.6})
    for ax, layout in zip(axes, ("contiguous", "balanced"), strict=True):
        steps = ring_schedule(P, layout).double()
        shown = steps.masked_fill(steps < 0, float("nan"))
        image = ax.imshow(shown, cmap="viridis", vmin=0, vmax=P - 1)
        owner = {}
        for rank in range(P):
            for i in md.sequence_positions(2 * P, rank, P, layout).tolist():
                owner[i] = rank
        work = {r: int((ring_schedule(P, layout)[[i for i in owner if owner[i] == r]] >= 0).sum()) for r in range(P)}
        ax.set_yticks(range(2 * P), [f"chunk {i} · rank {owner[i]}" for i in range(2 * P)], fontsize=8)
        ax.set_xticks(range(2 * P), [str(i) for i in range(2 * P)], fontsize=8)
        ax.set(xlabel="key chunk", ylabel="query chunk · the rank that holds it")
        pairs = ", ".join(str(w) for w in work.values())
        ax.set_title(f"{layout} layout\npairs computed by ranks 0…{P - 1}: {pairs}", fontsize=10)
    fig.colorbar(image, ax=axes, label="ring step", ticks=range(P), shrink=0.8)
    fig.suptitle(f"Causal ring attention on {P} ranks: which pair is computed at which step")
    return fig


def communication_rows(configs, *, bytes_per_element: int = 2, direction: str = "forward"):
    """Rows (config..., tensor MiB, ring MiB, Ulysses MiB) of the bytes one rank sends over the wire
    per layer in ``direction`` ("forward" or "backward"), from
    :func:`mha_course.distributed.communication_bytes`; ``configs``: dicts with batch, length,
    num_heads, num_kv_heads, head_dim, world_size. Ulysses is None where it cannot split the heads."""
    rows = []
    for c in configs:
        sent = []
        for scheme in ("tensor", "ring", "ulysses"):
            try:
                nbytes = md.communication_bytes(scheme, **c, bytes_per_element=bytes_per_element, direction=direction)
                sent.append(nbytes / 2**20)
            except ValueError:  # heads that cannot be dealt out whole
                sent.append(None)
        rows.append((c["length"], c["world_size"], c["num_heads"], c["num_kv_heads"], *sent))
    return rows


def format_table(header, rows, formats) -> str:
    """A fixed-width text table: ``formats`` holds one format spec per column (e.g. ",", ".1f", "");
    None is shown as "—"."""
    cells = [["—" if v is None else format(v, f) for v, f in zip(row, formats, strict=True)] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)
