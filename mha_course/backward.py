"""The backward pass of attention, by hand: the gradients of softmax(Q Kᵀ · scale) V with respect
to Q, K and V, and FlashAttention-2's tiled backward that recomputes the weights instead of storing them.

Forward, for one head (scale = 1/√d_k by default)::

    S = Q Kᵀ · scale     (Lq, Lk)       P = softmax(S)  (row-wise)       O = P V   (Lq, d_v)

Backward, given dO = ∂loss/∂O (the same shape as O)::

    dV = Pᵀ dO                        (Lk, d_v)
    dP = dO Vᵀ                        (Lq, Lk)
    dS = P ⊙ (dP − D),  D = rowsum(dO ⊙ O) = rowsum(P ⊙ dP)    (Lq, Lk); D is (Lq, 1)
    dQ = dS K · scale                 (Lq, d_k)
    dK = dSᵀ Q · scale                (Lk, d_k)

The softmax's Jacobian (Lk × Lk per query) is never built: its product with dP is the line for dS.
A blocked key has P = 0, so it gets dS = 0 and no gradient; a query with no allowed key gets 0.

Recomputing the weights instead of storing them is FlashAttention's (Dao et al., 2022,
arXiv:2205.14135, §3.1); FlashAttention-2 (Dao, 2023, arXiv:2307.08691, Algorithm 2) gives the loop
order used here. The forward keeps only O and the log-sum-exp of each query's scores,
lse = log Σ_j exp(s_ij) (one number per query), and the backward recomputes P = exp(S − lse) tile by
tile: for each block of keys j it loops over the blocks of queries i, sums the tiles' shares of
dK_j and dV_j in two accumulators that live for that key block only (written into dk, dv once, at
the end of the step) and adds each tile's share of dQ_i into dq at once. No (Lq, Lk) matrix of
scores or weights is ever held, at the price of computing S a second time.

:class:`FlashAttentionFunction` is a ``torch.autograd.Function`` with this forward and backward, so
``loss.backward()`` runs through the course's own code; :func:`flash_attention` is its front door.
What it always saves is memory. In time, the loops here are Python over small products: they
recompute Q Kᵀ (more FLOPs) but skip every tile that a mask blocks entirely (fewer FLOPs, e.g. the
tiles above a causal diagonal, which autograd through a masked dense softmax computes anyway), so
whether a step is faster or slower than autograd's depends on the mask and the tile size; the
memory traffic that recomputation saves on a GPU plays no part on a CPU.
"""

from __future__ import annotations

import math

import torch

from . import validation
from .gqa import repeat_kv
from .tiled import NEG_INF, tiled_attention

__all__ = [
    "softmax_backward",
    "backward_tile",
    "tiled_attention_backward",
    "attention_backward",
    "repeat_kv_backward",
    "FlashAttentionFunction",
    "flash_attention",
    "key_block_backward",
    "two_pass_backward",
]


def softmax_backward(weights, grad_weights):
    """The gradient of the scores from the gradient of the weights, for weights = softmax(scores)
    along the last dim: dS = P ⊙ (dP − rowsum(P ⊙ dP)). The Jacobian diag(p) − p pᵀ of each row is
    never built.

    weights (..., Lq, Lk) = P, grad_weights (..., Lq, Lk) = dP -> grad_scores (..., Lq, Lk) = dS.
    A row of P that is all 0 (a query with no allowed key) gets dS = 0.
    """
    rowsum = (weights * grad_weights).sum(dim=-1, keepdim=True)  # (..., Lq, 1): Σ_j p_j dp_j
    return weights * (grad_weights - rowsum)  # (..., Lq, Lk)


def backward_tile(q_i, k_j, v_j, grad_out_i, lse_i, delta_i, *, scale, mask=None):
    """One tile's share of the gradients: query block i against key block j.

    Shapes (``...`` = batch dims): q_i (..., bq, d_k), k_j (..., bk, d_k), v_j (..., bk, d_v),
    grad_out_i (..., bq, d_v) = dO_i, lse_i (..., bq, 1) the forward's log-sum-exp of each query's
    scaled scores over ALL keys (-inf for a query with no allowed key), delta_i (..., bq, 1) =
    D_i = rowsum(dO_i ⊙ O_i); mask (..., bq, bk) bool, True = may attend, or None.
    Returns ``(dq_i, dk_j, dv_j)``, the tile's contributions: dS_ij K_j · scale (..., bq, d_k),
    dS_ijᵀ Q_i · scale (..., bk, d_k) and P_ijᵀ dO_i (..., bk, d_v), to be summed over the tiles.
    """
    s = q_i @ k_j.transpose(-2, -1) * scale  # (..., bq, bk): the scores, recomputed
    if mask is not None:
        s = s.masked_fill(~mask, NEG_INF)
    # P = exp(S − lse) is the softmax over all Lk keys; a query with no allowed key has lse = -inf:
    # treat it as +inf there, so that its P is exp(-inf) = 0 rather than exp(-inf + inf) = NaN
    p = torch.exp(s - lse_i.masked_fill(lse_i == NEG_INF, math.inf))  # (..., bq, bk)
    dv_j = p.transpose(-2, -1) @ grad_out_i  # (..., bk, bq) @ (..., bq, d_v) -> (..., bk, d_v)
    dp = grad_out_i @ v_j.transpose(-2, -1)  # (..., bq, d_v) @ (..., d_v, bk) -> (..., bq, bk)
    ds = p * (dp - delta_i)  # (..., bq, bk): softmax_backward with the rowsum precomputed as D
    dq_i = ds @ k_j * scale  # (..., bq, bk) @ (..., bk, d_k) -> (..., bq, d_k)
    dk_j = ds.transpose(-2, -1) @ q_i * scale  # (..., bk, bq) @ (..., bq, d_k) -> (..., bk, d_k)
    return dq_i, dk_j, dv_j


def tiled_attention_backward(q, k, v, out, lse, grad_out, mask=None, *, scale=None, block_size: int = 64):
    """FlashAttention-2's backward: the gradients from the forward's output and log-sum-exp alone.

    q (..., Lq, d_k), k (..., Lk, d_k), v (..., Lk, d_v) with the SAME batch dims ``...`` (expanded,
    not broadcast); out (..., Lq, d_v) and lse (..., Lq, 1) from
    ``tiled_attention(q, k, v, mask, scale=scale, return_lse=True)``; grad_out (..., Lq, d_v);
    mask bool broadcastable to (..., Lq, Lk), True = may attend. Returns ``(dq, dk, dv)`` in the
    shapes of q, k, v. Outer loop over key blocks, inner over query blocks (FlashAttention-2's
    order): dK_j and dV_j are summed over the query blocks in accumulators local to the outer step
    and written once at its end; each tile's share of dQ_i is added into dq as soon as it is made
    (read, add, write for every tile: the update that a GPU running the key blocks in parallel must
    make atomic). A tile whose mask is all False is skipped. This function checks nothing:
    :func:`attention_backward` validates.
    """
    *batch, Lq, Lk = (*q.shape[:-1], k.shape[-2])
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if mask is not None:
        mask = torch.broadcast_to(mask, (*batch, Lq, Lk))  # a view: no memory
    delta = (grad_out * out).sum(dim=-1, keepdim=True)  # (..., Lq, 1): D = rowsum(dO ⊙ O), once
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for j in range(0, Lk, block_size):
        cols = slice(j, j + block_size)
        dk_acc, dv_acc = torch.zeros_like(k[..., cols, :]), torch.zeros_like(v[..., cols, :])  # (..., bk, d)
        for i in range(0, Lq, block_size):
            rows = slice(i, i + block_size)
            tile = None if mask is None else mask[..., rows, cols]  # (..., bq, bk)
            if tile is not None and not tile.any():
                continue  # every pair blocked: P = 0 here, nothing flows
            dq_i, dk_j, dv_j = backward_tile(
                q[..., rows, :], k[..., cols, :], v[..., cols, :], grad_out[..., rows, :],
                lse[..., rows, :], delta[..., rows, :], scale=scale, mask=tile,
            )  # fmt: skip
            dq[..., rows, :] += dq_i  # (..., bq, d_k): dQ_i, updated by every key block
            dk_acc += dk_j  # (..., bk, d_k): dK_j, local to this key block
            dv_acc += dv_j  # (..., bk, d_v)
        dk[..., cols, :], dv[..., cols, :] = dk_acc, dv_acc  # written once, when key block j is done
    return dq, dk, dv


def repeat_kv_backward(grad, n_rep: int):
    """The backward of :func:`mha_course.repeat_kv`: sum each group's n_rep query-head gradients
    into their shared key/value head. grad (B, h_kv*n_rep, L, d) -> (B, h_kv, L, d); query head i
    used KV head i // n_rep, so heads [g*n_rep, (g+1)*n_rep) sum into head g."""
    validation.positive_int("n_rep", n_rep)
    *lead, h, L, d = grad.shape
    if h % n_rep:
        raise ValueError(f"grad has {h} heads (dim -3), not a multiple of n_rep={n_rep}")
    return grad.reshape(*lead, h // n_rep, n_rep, L, d).sum(dim=-3)  # (B, h_kv, n_rep, L, d) -> (B, h_kv, L, d)


def _sum_to(grad, shape):
    """Sum ``grad`` over the dims that broadcasting added or stretched, back to ``shape``."""
    extra = grad.dim() - len(shape)
    grad = grad.sum(dim=tuple(range(extra))) if extra else grad
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return grad.sum(dim=stretched, keepdim=True) if stretched else grad


def _inputs(q, k, v, mask, grad_out, enable_gqa):
    """Validate once; return (k, v, n_rep): k and v with their KV heads repeated for GQA
    (n_rep = h // h_kv), unchanged with n_rep = 1 otherwise."""
    n_rep = 1
    if enable_gqa:
        for name, t in (("q", q), ("k", k), ("v", v)):
            validation.tensor(name, t, dims=4, floating=True)
        h, h_kv = q.shape[1], k.shape[1]
        if v.shape[1] != h_kv:
            raise ValueError(f"k and v must have the same number of heads (dim 1), got {h_kv} and {v.shape[1]}")
        if h % h_kv:
            raise ValueError(f"q's num_heads={h} is not a multiple of k's and v's num_kv_heads={h_kv}")
        n_rep = h // h_kv
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, h, Lk, d): query head i reads KV head i // n_rep
    scores_shape = validation.attention_inputs(q, k, v, mask)  # (*batch, Lq, Lk)
    if grad_out is not None:
        validation.tensor("grad_out", grad_out, floating=True)
        want = (*scores_shape[:-1], v.shape[-1])  # (..., Lq, d_v): the output's shape
        if tuple(grad_out.shape) != want:
            raise ValueError(f"grad_out must have the output's shape {want}, got {tuple(grad_out.shape)}")
        if grad_out.dtype != q.dtype:
            raise TypeError(f"grad_out must have q's dtype {q.dtype}, got {grad_out.dtype}")
    return k, v, n_rep


def _reduce(dq, dk, dv, shapes, n_rep):
    """The gradients in the shapes of the caller's q, k, v: summed over each GQA group
    (dk, dv (B, h, Lk, d) -> (B, h_kv, Lk, d)) and over the dims that broadcasting stretched."""
    if n_rep > 1:
        dk, dv = repeat_kv_backward(dk, n_rep), repeat_kv_backward(dv, n_rep)
    return tuple(_sum_to(g, shape) for g, shape in zip((dq, dk, dv), shapes, strict=True))


def attention_backward(q, k, v, grad_out, mask=None, *, scale=None, block_size: int = 64, enable_gqa: bool = False):
    """(dq, dk, dv): the gradients of a loss through out = softmax(q kᵀ · scale) v, given
    grad_out = ∂loss/∂out — computed as FlashAttention-2 does: a tiled forward that keeps only the
    log-sum-exp of each query's scores, then :func:`tiled_attention_backward`, which recomputes the
    weights tile by tile. No (Lq, Lk) matrix is ever held.

    Shapes as :func:`mha_course.scaled_dot_product_attention`: q (..., Lq, d_k), k (..., Lk, d_k),
    v (..., Lk, d_v), leading dims broadcast; grad_out (..., Lq, d_v); mask bool broadcastable to
    (..., Lq, Lk), True = may attend; scale defaults to 1/√d_k. ``enable_gqa=True`` (as in
    ``F.scaled_dot_product_attention``): q (B, h, Lq, d_k), k and v (B, h_kv, Lk, ·) with h a
    multiple of h_kv; query head i reads KV head i // (h // h_kv), so dk and dv are summed over the
    query heads of each group. Returns dq, dk, dv in the shapes of q, k, v (summed over broadcast
    dims). A blocked key gets no gradient from that query; a query with no allowed key gets dq = 0.
    Equal to autograd through ``F.scaled_dot_product_attention`` (tests: < 1e-10 in float64).
    """
    shapes = (q.shape, k.shape, v.shape)
    k, v, n_rep = _inputs(q, k, v, mask, grad_out, enable_gqa)
    validation.positive_int("block_size", block_size)
    batch = grad_out.shape[:-2]
    q, k, v = (t.expand(*batch, *t.shape[-2:]) for t in (q, k, v))  # views: the same batch dims for all
    out, lse = tiled_attention(q, k, v, mask, scale=scale, block_size=block_size, return_lse=True)
    grads = tiled_attention_backward(q, k, v, out, lse, grad_out, mask, scale=scale, block_size=block_size)
    return _reduce(*grads, shapes, n_rep)


class FlashAttentionFunction(torch.autograd.Function):
    """softmax(q kᵀ · scale) v whose backward is FlashAttention-2's: the forward saves q, k, v,
    the output and the log-sum-exp (..., Lq, 1) — never the (Lq, Lk) scores or weights — and the
    backward recomputes them tile by tile (:func:`tiled_attention_backward`). It also saves the
    caller's mask as given: a dense bool mask is Lq·Lk bytes (a quarter of one float32 score
    matrix), where fused kernels take ``is_causal`` and compute the mask from indices.

    ``FlashAttentionFunction.apply(q, k, v, mask, scale, block_size)``; inputs validated by the
    caller (:func:`flash_attention`). Not twice differentiable.
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, scale, block_size):
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        qe, ke, ve = (t.expand(*batch, *t.shape[-2:]) for t in (q, k, v))  # views
        out, lse = tiled_attention(qe, ke, ve, mask, scale=scale, block_size=block_size, return_lse=True)
        ctx.save_for_backward(q, k, v, out, lse, mask)  # O(L·d) numbers, plus the caller's mask as given
        ctx.scale, ctx.block_size = scale, block_size
        return out  # (..., Lq, d_v)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse, mask = ctx.saved_tensors
        batch = out.shape[:-2]
        qe, ke, ve = (t.expand(*batch, *t.shape[-2:]) for t in (q, k, v))
        grads = tiled_attention_backward(
            qe, ke, ve, out, lse, grad_out.contiguous(), mask, scale=ctx.scale, block_size=ctx.block_size
        )
        dq, dk, dv = _reduce(*grads, (q.shape, k.shape, v.shape), 1)
        return dq, dk, dv, None, None, None


def flash_attention(q, k, v, mask=None, *, scale=None, block_size: int = 64, enable_gqa: bool = False):
    """out = softmax(q kᵀ · scale) v, differentiable through :class:`FlashAttentionFunction`:
    ``loss.backward()`` then runs FlashAttention-2's recomputing backward, in the course's code.

    Shapes, mask and ``enable_gqa`` as :func:`attention_backward`; returns out (..., Lq, d_v)
    (0 for a query with no allowed key). With GQA, k and v are repeated to the query heads
    (:func:`mha_course.repeat_kv`) and autograd sums their gradients back over each group.
    """
    k, v, _ = _inputs(q, k, v, mask, None, enable_gqa)
    validation.positive_int("block_size", block_size)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return FlashAttentionFunction.apply(q, k, v, mask, scale, block_size)


# ---------------------------------------------------------------------------------------------
# the backward with the key blocks in parallel


def _tiles(Lq, Lk, block_size, mask):
    """The (query rows, key cols, mask tile) of every tile that is not wholly masked, key blocks outer."""
    for j in range(0, Lk, block_size):
        cols = slice(j, j + block_size)
        for i in range(0, Lq, block_size):
            rows = slice(i, i + block_size)
            tile = None if mask is None else mask[..., rows, cols]
            if tile is None or tile.any():
                yield rows, cols, tile


def key_block_backward(q, k, v, out, lse, grad_out, mask=None, *, scale=None, block_size=64, order=None, race=False):
    """FlashAttention-2's backward with each key block j as an independent worker, as a GPU runs them:
    worker j computes dK_j and dV_j by itself, and its shares of every dQ_i go into one shared dQ.

    Arguments as :func:`tiled_attention_backward`. ``order``: the order in which the workers' shares
    of dQ arrive (a permutation of the key blocks; default ascending), standing for a GPU's
    scheduling. The shared dQ is a float32 buffer and every share is added into it at once
    (``race=False``: atomic adds, as FlashAttention-2 does; the sum is right in any order, though
    its float32 rounding depends on the order). With ``race=True`` the workers do an unsynchronised
    read-modify-write: all read dQ_i, add their share, then write back, so each dQ_i keeps only the
    last writer's share and the others' updates are lost. Returns ``(dq, dk, dv)``; dq in float32.
    """
    *batch, Lq, Lk = (*q.shape[:-1], k.shape[-2])
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if mask is not None:
        mask = torch.broadcast_to(mask, (*batch, Lq, Lk))
    delta = (grad_out * out).sum(dim=-1, keepdim=True)  # (..., Lq, 1)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    shares = {}  # key block j -> [(rows, dq share)]: what worker j adds into dQ
    for rows, cols, tile in _tiles(Lq, Lk, block_size, mask):
        dq_i, dk_j, dv_j = backward_tile(
            q[..., rows, :], k[..., cols, :], v[..., cols, :], grad_out[..., rows, :],
            lse[..., rows, :], delta[..., rows, :], scale=scale, mask=tile,
        )  # fmt: skip
        dk[..., cols, :] += dk_j  # worker j's own rows: no other worker writes them
        dv[..., cols, :] += dv_j
        shares.setdefault(cols.start, []).append((rows, dq_i))
    blocks = sorted(shares) if order is None else [range(0, Lk, block_size)[n] for n in order]
    dq = torch.zeros(q.shape, dtype=torch.float32)  # the shared buffer
    if race:  # every worker reads dQ before any writes back: the last write wins
        read = dq.clone()
        for j in blocks:
            for rows, dq_i in shares.get(j, []):
                dq[..., rows, :] = read[..., rows, :] + dq_i.float()
    else:
        for j in blocks:
            for rows, dq_i in shares.get(j, []):
                dq[..., rows, :] += dq_i.float()  # an atomic add: read, add and write as one step
    return dq, dk, dv


def two_pass_backward(q, k, v, out, lse, grad_out, mask=None, *, scale=None, block_size=64):
    """The deterministic backward: no two workers ever write the same gradient. Pass 1, one worker
    per key block j, computes dK_j and dV_j (S, P, dV, dP, dS, dK: four products per tile); pass 2,
    one worker per query block i, recomputes P and dS for its tiles and sums dQ_i itself (S, dP, dQ:
    three products per tile). Seven products per tile instead of five, in exchange for no atomic
    adds: the same result on every run. Arguments and return as :func:`tiled_attention_backward`.
    """
    *batch, Lq, Lk = (*q.shape[:-1], k.shape[-2])
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if mask is not None:
        mask = torch.broadcast_to(mask, (*batch, Lq, Lk))
    delta = (grad_out * out).sum(dim=-1, keepdim=True)  # (..., Lq, 1)
    safe_lse = lse.masked_fill(lse == NEG_INF, math.inf)  # a query with no allowed key: P = 0, not NaN
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    def p_and_ds(rows, cols, tile):  # the tile's weights and dS, recomputed from lse
        s = q[..., rows, :] @ k[..., cols, :].transpose(-2, -1) * scale  # (..., bq, bk)
        if tile is not None:
            s = s.masked_fill(~tile, NEG_INF)
        p = torch.exp(s - safe_lse[..., rows, :])  # (..., bq, bk)
        dp = grad_out[..., rows, :] @ v[..., cols, :].transpose(-2, -1)  # (..., bq, bk)
        return p, p * (dp - delta[..., rows, :])

    for rows, cols, tile in _tiles(Lq, Lk, block_size, mask):  # pass 1: key blocks own dK_j, dV_j
        p, ds = p_and_ds(rows, cols, tile)
        dv[..., cols, :] += p.transpose(-2, -1) @ grad_out[..., rows, :]  # (..., bk, d_v)
        dk[..., cols, :] += ds.transpose(-2, -1) @ q[..., rows, :] * scale  # (..., bk, d_k)
    for rows, cols, tile in sorted(_tiles(Lq, Lk, block_size, mask), key=lambda t: t[0].start):  # pass 2
        _, ds = p_and_ds(rows, cols, tile)
        dq[..., rows, :] += ds @ k[..., cols, :] * scale  # (..., bq, d_k): query block i's own rows
    return dq, dk, dv
