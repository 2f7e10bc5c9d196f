"""Ring attention with a backward: the forward keeps each query's global log-sum-exp, and in the
backward the dK/dV accumulators travel around the ring with their K/V blocks.

Design (FlashAttention-2's backward, Dao 2023, arXiv:2307.08691, Algorithm 2, spread over ranks as
in ring-flash-attention, github.com/zhuzilin/ring-flash-attention):

* forward (:func:`ring_attention`'s loop, on any process group): P steps; at step s rank r holds the
  K/V block of rank r-s, folds it into its queries' running (max m, sum ℓ, acc) with
  :func:`~mha_course.tiled.online_softmax_update`, and passes it on (P-1 sends). It saves
  O and lse = m + log ℓ, the log-sum-exp over ALL L keys, one number per query;
* backward: D = rowsum(dO ⊙ O) once; P steps again; at step s rank r holds block r-s and that
  block's dK/dV accumulator; every (query chunk, key chunk) tile goes through notebook 13's
  :func:`~mha_course.backward.backward_tile` with the global lse (so the recomputed weights are the
  softmax over all keys, not over the block), adds its dQ share into this rank's dq and its
  dK/dV shares into the accumulator; then the K/V block (P-1 sends) and the accumulator (P sends:
  one step more, which brings it home to its owner) move to rank r+1. A block's accumulator has
  visited every rank — every query — when it arrives home, so it is the block's whole gradient.

Bytes per rank: forward (P-1)·|K,V block|, backward (2P-1)·|K,V block|, with |K,V block| =
2·B·h_kv·(L/P)·d_head elements: :func:`communication_bytes` ("ring").
"""

from __future__ import annotations

import math

import torch

from .. import validation
from ..backward import backward_tile, repeat_kv_backward
from ..gqa import repeat_kv
from ..tiled import NEG_INF, online_softmax_update
from .collectives import GroupTraffic
from .layouts import _chunks, sequence_positions, shard_sequence


def _pieces(layout: str, causal: bool, Lc: int) -> int:
    # as ring_attention: 2 contiguous chunks per rank in the balanced layout, or for a causal ring
    return 2 if layout == "balanced" or (causal and Lc % 2 == 0) else 1


def _tiles(pos_q, pos_k, pieces, causal):
    """The (query chunk, key chunk, mask) triples that have any allowed pair; mask None = all allowed."""
    for qs in _chunks(pos_q, pieces):
        for ks in _chunks(pos_k, pieces):
            allowed = pos_q[qs, None] >= pos_k[None, ks] if causal else None  # (cq, ck)
            if allowed is not None and not allowed.any():
                continue  # the whole chunk pair is in the future
            yield qs, ks, (None if allowed is None or allowed.all() else allowed)


class RingAttentionFunction(torch.autograd.Function):
    """``RingAttentionFunction.apply(q, k, v, causal, layout, traffic, backward_traffic)``: see
    :func:`ring_attention_autograd`."""

    @staticmethod
    def forward(ctx, q, k, v, causal, layout, traffic, backward_traffic):
        rank, P = traffic.rank, traffic.size
        B, h, Lc, d = q.shape
        L, n_rep, scale = Lc * P, h // k.shape[1], 1.0 / math.sqrt(d)
        pieces = _pieces(layout, causal, Lc)
        pos_q = sequence_positions(L, rank, P, layout)
        size = Lc // pieces
        m = q.new_full((B, h, Lc, 1), NEG_INF)
        total, acc = q.new_zeros((B, h, Lc, 1)), q.new_zeros((B, h, Lc, d))
        kv, holder = torch.stack([k, v]), rank  # (2, B, h_kv, L/P, d)
        for step in range(P):
            if step < P - 1:
                incoming, requests = traffic.send_recv(kv, to=(rank + 1) % P, frm=(rank - 1) % P)
            kb, vb = repeat_kv(kv[0], n_rep), repeat_kv(kv[1], n_rep)  # (B, h, L/P, d)
            for qs, ks, mask in _tiles(pos_q, sequence_positions(L, holder, P, layout), pieces, causal):
                s = q[:, :, qs] @ kb[:, :, ks].transpose(-2, -1) * scale  # (B, h, cq, ck)
                if mask is not None:
                    s = s.masked_fill(~mask, NEG_INF)
                m[:, :, qs], total[:, :, qs], acc[:, :, qs] = online_softmax_update(
                    m[:, :, qs], total[:, :, qs], acc[:, :, qs], s, vb[:, :, ks]
                )
            if step < P - 1:
                for request in requests:
                    request.wait()
                kv, holder = incoming, (holder - 1) % P
        out = torch.where(total > 0, acc / total, 0.0)  # (B, h, L/P, d)
        lse = torch.where(total > 0, m + torch.log(total), NEG_INF)  # (B, h, L/P, 1): over all L keys
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.setup = (causal, layout, traffic, backward_traffic, pieces, scale, size)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        causal, layout, _, traffic, pieces, scale, _ = ctx.setup
        rank, P = traffic.rank, traffic.size
        B, h, Lc, d = q.shape
        L, n_rep = Lc * P, h // k.shape[1]
        pos_q = sequence_positions(L, rank, P, layout)
        grad_out = grad_out.contiguous()
        delta = (grad_out * out).sum(dim=-1, keepdim=True)  # (B, h, L/P, 1): D = rowsum(dO ⊙ O)
        dq = torch.zeros_like(q)
        kv, holder = torch.stack([k, v]), rank
        dkv = torch.zeros_like(kv)  # (2, B, h_kv, L/P, d): the accumulator of the block held
        for step in range(P):
            if step < P - 1:  # the K/V block moves on while this rank computes with it
                incoming, requests = traffic.send_recv(kv, to=(rank + 1) % P, frm=(rank - 1) % P)
            kb, vb = repeat_kv(kv[0], n_rep), repeat_kv(kv[1], n_rep)  # (B, h, L/P, d)
            dk, dv = torch.zeros_like(kb), torch.zeros_like(vb)  # per query head, summed per group below
            for qs, ks, mask in _tiles(pos_q, sequence_positions(L, holder, P, layout), pieces, causal):
                dq_i, dk_j, dv_j = backward_tile(
                    q[:, :, qs], kb[:, :, ks], vb[:, :, ks], grad_out[:, :, qs], lse[:, :, qs], delta[:, :, qs],
                    scale=scale, mask=mask,
                )  # fmt: skip
                dq[:, :, qs] += dq_i
                dk[:, :, ks] += dk_j
                dv[:, :, ks] += dv_j
            dkv = dkv + torch.stack([repeat_kv_backward(dk, n_rep), repeat_kv_backward(dv, n_rep)])
            # the accumulator follows its block to rank r+1; after the last step, that is its owner
            dkv_in, dkv_requests = traffic.send_recv(dkv, to=(rank + 1) % P, frm=(rank - 1) % P, tag=1)
            for request in dkv_requests + (requests if step < P - 1 else []):
                request.wait()
            dkv = dkv_in
            if step < P - 1:
                kv, holder = incoming, (holder - 1) % P
        return dq, dkv[0], dkv[1], None, None, None, None


def ring_attention_autograd(
    q, k, v, *, causal: bool = False, layout: str = "contiguous", traffic=None, backward_traffic=None
):
    """Ring attention that autograd can differentiate; call on every rank of the group.

    q (B, h, L/P, d_head), k and v (B, h_kv, L/P, d_head): this rank's positions
    (:func:`shard_sequence` with the same ``layout``, "contiguous" or "balanced"); h a multiple of
    h_kv. ``traffic`` / ``backward_traffic``: :class:`GroupTraffic` counters (their ``group`` is the
    ring; None = a new counter on every rank); the backward's sends go to ``backward_traffic``.
    Returns out (B, h, L/P, d_head), equal to :func:`ring_attention`'s; ``out.backward(...)`` gives
    q, k, v the gradients of attention over the whole sequence.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        validation.tensor(name, t, dims=4, floating=True)
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(
            f"q (B, h, L/P, d), k and v (B, h_kv, L/P, d) must agree: got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"num_heads={q.shape[1]} must be a multiple of num_kv_heads={k.shape[1]}")
    traffic = GroupTraffic() if traffic is None else traffic
    if not isinstance(traffic, GroupTraffic):
        raise TypeError(f"traffic must be a GroupTraffic, got {type(traffic).__name__}")
    backward_traffic = GroupTraffic(group=traffic.group) if backward_traffic is None else backward_traffic
    if not isinstance(backward_traffic, GroupTraffic):
        raise TypeError(f"backward_traffic must be a GroupTraffic, got {type(backward_traffic).__name__}")
    sequence_positions(q.shape[2] * traffic.size, traffic.rank, traffic.size, layout)  # checks layout, length
    return RingAttentionFunction.apply(q, k, v, causal, layout, traffic, backward_traffic)


@torch.enable_grad()  # a job runs the backward even where the caller turned gradients off
def ring_backward_rank(q, k, v, grad_out, causal: bool = False, layout: str = "contiguous"):
    """A rank's job: this rank's positions of the full q (B, h, L, d), k, v (B, h_kv, L, d) and
    grad_out (B, h, L, d); ring attention forward, then ``out.backward(grad_out shard)``. Returns
    ``(out, dq, dk, dv, forward bytes, backward bytes)``: shards, and bytes sent per collective."""
    traffic, backward_traffic = GroupTraffic(), GroupTraffic()
    P, rank = traffic.size, traffic.rank
    q, k, v = (shard_sequence(t, rank, P, layout).requires_grad_() for t in (q, k, v))
    out = ring_attention_autograd(
        q, k, v, causal=causal, layout=layout, traffic=traffic, backward_traffic=backward_traffic
    )
    out.backward(shard_sequence(grad_out, rank, P, layout))
    return out.detach(), q.grad, k.grad, v.grad, dict(traffic.sent), dict(backward_traffic.sent)
