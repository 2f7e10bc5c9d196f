"""Ring attention (context parallelism): K/V blocks travel around a ring of point-to-point sends,
and each rank folds the block that arrives into its queries' running softmax."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .. import validation
from ..gqa import repeat_kv
from ..tiled import NEG_INF, online_softmax_update
from .layouts import _chunks, sequence_positions, shard_sequence
from .traffic import Traffic


def ring_attention(q, k, v, *, causal: bool = False, layout: str = "contiguous", traffic: Traffic | None = None):
    """Attention over the whole sequence when each rank holds only its positions; call on every rank.

    q (B, h, L/P, d_head), k and v (B, h_kv, L/P, d_head): this rank's positions
    (:func:`shard_sequence` with the same ``layout``). In P steps, every rank attends its queries to
    the K/V block it holds, while sending that block to rank r+1 and receiving the next from r-1;
    each block is folded into the running (max, sum, acc) of :func:`online_softmax_update`. With
    ``causal``, each rank's positions are cut in two chunks and a (query chunk, key chunk) pair wholly
    above the diagonal is skipped.
    Returns ``(out, work)``: out (B, h, L/P, d_head) for this rank's queries, equal to attention over
    all L keys; work = number of query·key scores this rank computed.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        validation.tensor(name, t, dims=4, floating=True)
    rank, P = dist.get_rank(), dist.get_world_size()
    traffic = Traffic() if traffic is None else traffic
    B, h, Lc, d = q.shape
    L, n_rep = Lc * P, h // k.shape[1]
    # chunks per rank, each contiguous in position: 2 in the balanced layout; a causal ring also cuts a
    # contiguous block in 2, so that the upper half of its diagonal block is skipped, not computed
    pieces = 2 if layout == "balanced" or (causal and Lc % 2 == 0) else 1
    pos_q = sequence_positions(L, rank, P, layout)  # (L/P,)
    q = q / math.sqrt(d)
    state = [  # per query chunk: running max m, running sum ℓ, running acc (online_softmax_update)
        (
            q.new_full((B, h, Lc // pieces, 1), NEG_INF),
            q.new_zeros((B, h, Lc // pieces, 1)),
            q.new_zeros((B, h, Lc // pieces, d)),
        )
        for _ in range(pieces)
    ]
    kv, holder, work = torch.stack([k, v]), rank, 0  # (2, B, h_kv, L/P, d); holder = whose block it is
    for step in range(P):
        if step < P - 1:  # pass the block on while computing with it
            incoming, requests = traffic.send_recv(kv, to=(rank + 1) % P, frm=(rank - 1) % P)
        pos_k = sequence_positions(L, holder, P, layout)
        kb, vb = repeat_kv(kv[0], n_rep), repeat_kv(kv[1], n_rep)  # (B, h, L/P, d)
        for i, qs in enumerate(_chunks(pos_q, pieces)):
            for ks in _chunks(pos_k, pieces):
                allowed = pos_q[qs, None] >= pos_k[None, ks] if causal else None  # (cq, ck)
                if allowed is not None and not allowed.any():
                    continue  # the whole chunk pair is in the future: no scores at all
                s = q[:, :, qs] @ kb[:, :, ks].transpose(-2, -1)  # (B, h, cq, ck)
                if allowed is not None and not allowed.all():
                    s = s.masked_fill(~allowed, NEG_INF)
                state[i] = online_softmax_update(*state[i], s, vb[:, :, ks])
                work += s.shape[-2] * s.shape[-1]
        if step < P - 1:
            for request in requests:
                request.wait()
            kv, holder = incoming, (holder - 1) % P
    out = torch.cat([torch.where(total > 0, acc / total, 0.0) for _, total, acc in state], dim=-2)  # (B, h, L/P, d)
    return out, work


def ring_rank(q, k, v, causal: bool = False, layout: str = "contiguous"):
    """A rank's job: take this rank's positions of the full q (B, h, L, d), k, v (B, h_kv, L, d),
    run :func:`ring_attention`; return ``(out shard, work, bytes sent per collective)``."""
    rank, P = dist.get_rank(), dist.get_world_size()
    traffic = Traffic()
    shards = (shard_sequence(t, rank, P, layout) for t in (q, k, v))
    out, work = ring_attention(*shards, causal=causal, layout=layout, traffic=traffic)
    return out, work, dict(traffic.sent)


def block_attention(q, k, v):
    """Attention of this rank's queries over one K/V block, as a fused kernel returns it.

    q (B, h, Lq, d_head), k and v (B, h, Lk, d_head) → ``(out, lse)``: out (B, h, Lq, d_head) =
    softmax(q kᵀ / √d_head) v over this block's keys, lse (B, h, Lq) = the log-sum-exp of those
    scores. Two such results for disjoint blocks merge with :func:`mha_course.merge_partials`."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        validation.tensor(name, t, dims=4, floating=True)
    if k.shape != v.shape or k.shape[:2] != q.shape[:2] or k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"block_attention expects q (B, h, Lq, d) and k, v (B, h, Lk, d) with the same B, h and d, "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, h, Lq, Lk)
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)
