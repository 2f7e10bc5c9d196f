"""DeepSpeed-Ulysses (context parallelism): an all-to-all turns sequence-sharded Q, K, V into
head-sharded ones over the whole sequence, and a second one turns the output back."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import validation
from ..attention import scaled_dot_product_attention
from ..gqa import repeat_kv
from .layouts import shard_sequence
from .traffic import Traffic


def ulysses_attention(q, k, v, *, causal: bool = False, traffic: Traffic | None = None):
    """DeepSpeed-Ulysses: sequence-sharded in, sequence-sharded out, head-sharded in between.

    q (B, h, L/P, d_head), k and v (B, h_kv, L/P, d_head): this rank's contiguous block of
    positions; h must be divisible by P, and h_kv too, or else P a multiple of h_kv: then each KV
    head is first repeated P/h_kv times (:func:`mha_course.repeat_kv`), so that every rank receives
    the one KV head its query heads read. An all-to-all sends head group j to rank j, so each rank
    gets all L positions of h/P heads (B, h/P, L, d_head); it attends (causal or not) and a second
    all-to-all returns each rank its positions of all heads. Returns (B, h, L/P, d_head).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        validation.tensor(name, t, dims=4, floating=True)
    P = dist.get_world_size()
    if q.shape[1] % P:
        raise ValueError(f"Ulysses gives each rank whole heads: num_heads={q.shape[1]} is not divisible by {P} ranks")
    if k.shape[1] % P:
        if P % k.shape[1]:
            raise ValueError(
                f"Ulysses gives each rank whole heads: num_kv_heads={k.shape[1]} is neither divisible by {P} ranks "
                f"nor a divisor of it (then each KV head could be repeated to one per rank)"
            )
        k, v = repeat_kv(k, P // k.shape[1]), repeat_kv(v, P // k.shape[1])  # (B, P, L/P, d): one KV head per rank
    traffic = Traffic() if traffic is None else traffic
    q, k, v = (traffic.all_to_all(t, dim_out=1, dim_in=2) for t in (q, k, v))  # (B, h/P, L, d): heads ↔ positions
    L = q.shape[2]
    mask = torch.ones(L, L, dtype=torch.bool, device=q.device).tril() if causal else None
    n_rep = q.shape[1] // k.shape[1]
    out, _ = scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask)  # (B, h/P, L, d)
    return traffic.all_to_all(out, dim_out=2, dim_in=1)  # (B, h/P, L, d) -> (B, h, L/P, d)


def ulysses_rank(q, k, v, causal: bool = False):
    """A rank's job: take this rank's block of the full q, k, v (B, h(_kv), L, d), run
    :func:`ulysses_attention`; return ``(out shard, bytes sent per collective)``."""
    rank, P = dist.get_rank(), dist.get_world_size()
    traffic = Traffic()
    out = ulysses_attention(*(shard_sequence(t, rank, P) for t in (q, k, v)), causal=causal, traffic=traffic)
    return out, dict(traffic.sent)
