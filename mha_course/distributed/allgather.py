"""All-gather context parallelism (Llama 3's, and the default rotation of PyTorch's
``context_parallel``): every rank gathers the whole K and V, then attends its own queries to them."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import validation
from ..attention import scaled_dot_product_attention
from ..gqa import repeat_kv
from .layouts import sequence_positions, shard_sequence
from .traffic import Traffic


def allgather_attention(q, k, v, *, causal: bool = False, layout: str = "contiguous", traffic: Traffic | None = None):
    """Attention over the whole sequence when each rank holds only its positions; call on every rank.

    q (B, h, L/P, d_head), k and v (B, h_kv, L/P, d_head): this rank's positions
    (:func:`shard_sequence` with the same ``layout``). One all-gather gives every rank all L keys and
    values (Dubey et al. 2024, §3.3.2: the K/V of GQA are small beside Q, and any mask is easy to
    apply); each rank then attends its queries to them, causal by the true positions of both.
    Sends (P-1) K/V blocks per rank, as a ring does, but holds all L keys at once.
    Returns out (B, h, L/P, d_head) for this rank's queries.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        validation.tensor(name, t, dims=4, floating=True)
    rank, P = dist.get_rank(), dist.get_world_size()
    traffic = Traffic() if traffic is None else traffic
    L, n_rep = q.shape[-2] * P, q.shape[1] // k.shape[1]
    blocks = traffic.all_gather(torch.stack([k, v]))  # P × (2, B, h_kv, L/P, d), in rank order
    kv = torch.cat(blocks, dim=-2)  # (2, B, h_kv, L, d), in the ranks' order of positions
    pos_k = torch.cat([sequence_positions(L, r, P, layout) for r in range(P)])  # (L,)
    pos_q = sequence_positions(L, rank, P, layout)  # (L/P,)
    mask = pos_q[:, None] >= pos_k[None, :] if causal else None  # (L/P, L)
    out, _ = scaled_dot_product_attention(q, repeat_kv(kv[0], n_rep), repeat_kv(kv[1], n_rep), mask)
    return out  # (B, h, L/P, d)


def allgather_rank(q, k, v, causal: bool = False, layout: str = "contiguous"):
    """A rank's job: take this rank's positions of the full q (B, h, L, d), k, v (B, h_kv, L, d),
    run :func:`allgather_attention`; return ``(out shard, bytes sent per collective)``."""
    rank, P = dist.get_rank(), dist.get_world_size()
    traffic = Traffic()
    shards = (shard_sequence(t, rank, P, layout) for t in (q, k, v))
    out = allgather_attention(*shards, causal=causal, layout=layout, traffic=traffic)
    return out, dict(traffic.sent)
