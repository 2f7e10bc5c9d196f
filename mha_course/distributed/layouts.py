"""Context parallelism's layouts: which positions each rank holds, contiguous blocks or the
balanced (zigzag) layout of 2P chunks (rank r holds chunks r and 2P-1-r)."""

from __future__ import annotations

import torch

from .. import validation

_LAYOUTS = ("contiguous", "balanced")


def sequence_positions(length: int, rank: int, world_size: int, layout: str = "contiguous") -> torch.Tensor:
    """int64 positions (L/P,) that rank ``rank`` holds.

    "contiguous": rank r holds block r of P equal blocks. "balanced" (for causal attention): the
    sequence is cut into 2P chunks and rank r holds chunk r and chunk 2P-1-r, an early and a late
    one, so every rank has the same number of (query, key) pairs below the causal diagonal.
    """
    validation.positive_int("length", length)
    validation.positive_int("world_size", world_size)
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {_LAYOUTS}, got layout={layout!r}")
    parts = world_size if layout == "contiguous" else 2 * world_size
    if length % parts:
        raise ValueError(
            f"length={length} must be divisible by {parts} for layout={layout!r} with {world_size} ranks "
            f"({'P' if layout == 'contiguous' else '2P'} equal chunks)"
        )
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got rank={rank}")
    c = length // parts
    chunks = [rank] if layout == "contiguous" else [rank, 2 * world_size - 1 - rank]
    return torch.cat([torch.arange(i * c, (i + 1) * c) for i in chunks])  # (L/P,)


def shard_sequence(x, rank: int, world_size: int, layout: str = "contiguous", *, dim: int = -2):
    """The positions of ``x`` along ``dim`` that rank ``rank`` holds (:func:`sequence_positions`)."""
    validation.tensor("x", x)
    positions = sequence_positions(x.shape[dim], rank, world_size, layout)
    return x.index_select(dim, positions.to(x.device))


def unshard_sequence(shards, layout: str = "contiguous", *, dim: int = -2):
    """Inverse of :func:`shard_sequence`: put the ranks' shards (rank order) back in position order."""
    P = len(shards)
    length = sum(s.shape[dim] for s in shards)
    stacked = torch.cat(list(shards), dim=dim)
    order = torch.cat([sequence_positions(length, r, P, layout) for r in range(P)])  # where each row belongs
    return stacked.index_select(dim, torch.argsort(order).to(stacked.device))


def _chunks(positions: torch.Tensor, n: int):
    size = len(positions) // n
    return [slice(i * size, (i + 1) * size) for i in range(n)]
