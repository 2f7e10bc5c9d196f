"""The backward of every split: tensor parallelism with Megatron's f and g, Megatron's sequence
parallelism, Ulysses, and a 2 × 2 mesh of tensor × context parallelism.

Design. Nothing here writes a gradient by hand except the ring (:mod:`.ring_backward`): each split
is the forward of the one-process layer with its collectives replaced by the autograd-aware ones of
:mod:`.collectives`, so ``loss.backward()`` runs the adjoint collectives in reverse order.

* :class:`MegatronAttention` — :class:`TensorParallelAttention`'s shards, with f before the
  column-parallel projections (identity forward, all-reduce of dx backward: every rank's heads read
  x) and g after the row-parallel one (all-reduce forward, identity backward). One all-reduce each
  way (Shoeybi et al. 2019, arXiv:1909.08053, §3). Each weight shard's gradient is the slice of the
  full weight's gradient, with no further communication.
* :class:`MegatronBlock` — norm + attention with a residual, ``x + attention(norm(x))``. Tensor
  parallel alone, every rank normalises the whole (B, L, d_model); with ``sequence_parallel``
  (Korthikanti et al. 2022, arXiv:2205.05198, §4.2.2) x arrives sharded along the sequence, the norm
  runs on L/P positions, an all-gather (reduce-scatter in the backward) replaces f and a
  reduce-scatter (all-gather in the backward) replaces g. Reduce-scatter + all-gather send what one
  all-reduce sends, so the wire bytes are TP's, while the norm's activations shrink P-fold. The
  norm's weights and W_O's bias are replicated and each rank applies them to its positions only,
  so their gradients are summed over the ranks once (a small all-reduce, counted apart).
* Ulysses: :func:`~mha_course.distributed.ulysses_attention` run with a
  :class:`~.collectives.DifferentiableTraffic`: an all-to-all's adjoint is the all-to-all with its
  two dims swapped, so the backward sends the forward's bytes.
* :func:`mesh_rank` — 4 ranks as a 2 × 2 mesh, rank = c·T + t: heads split over the tensor axis t
  (groups {0, 1}, {2, 3}), the sequence ring over the context axis c (groups {0, 2}, {1, 3}), both
  made with ``torch.distributed.new_group``. f and g run on the tensor group, the ring on the
  context group; the weight shards' gradients are then summed over the context group (each context
  rank saw only its positions), as data parallelism sums them over replicas.

The ``*_rank`` functions are the ranks' jobs for :class:`Ranks`; each returns its results and the
bytes it sent per collective, forward and backward apart, to set against :func:`communication_bytes`.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from .. import validation
from ..attention import scaled_dot_product_attention
from ..gqa import repeat_kv
from ..heads import merge_heads
from .collectives import (
    DifferentiableTraffic,
    GroupTraffic,
    copy_to_ranks,
    gather_sequence,
    scatter_sequence,
    sum_over_ranks,
)
from .layouts import sequence_positions, shard_sequence
from .ring_backward import ring_attention_autograd
from .tensor_parallel import TensorParallelAttention, _rows, heads_of_rank
from .ulysses import ulysses_attention


class MegatronAttention(TensorParallelAttention):
    """:class:`TensorParallelAttention` that autograd can run backwards: Megatron's f and g.

    ``MegatronAttention(module, rank, world_size, group=None)``: this rank's heads of ``module``
    (a :class:`MultiHeadAttention` or :class:`GroupedQueryAttention`) on the process group ``group``
    (None = every rank; ``rank`` and ``world_size`` are within the group). ``forward(x, *,
    mask=None, is_causal=False)`` as the parent's; ``self.traffic`` counts the forward's all-reduce
    and ``self.backward_traffic`` the backward's (of dx, the same size). After
    ``out.backward(...)``, every parameter's ``.grad`` is the matching slice of the full module's —
    once :meth:`sum_shared_kv_grads` has run when a KV head sits on several ranks (GQA with
    P > h_kv: each copy's gradient holds its rank's query heads' share only).
    """

    def __init__(self, module, rank: int, world_size: int, *, group=None):
        super().__init__(module, rank, world_size)
        self.traffic, self.backward_traffic = GroupTraffic(group=group), GroupTraffic(group=group)
        self.grad_traffic = GroupTraffic(group=group)  # the shared KV heads' gradients, if any

    @property
    def shares_kv_heads(self) -> bool:
        """True when each KV head sits on several ranks (P a multiple of h_kv, P > h_kv)."""
        return self.world_size > self.num_kv_heads

    def sum_shared_kv_grads(self) -> None:
        """When a KV head is replicated on P/h_kv ranks, each copy's gradient holds only the share
        of that rank's query heads: sum the copies. One all-reduce of an (h_kv, ...) buffer in which
        each rank fills its KV head's slot (ranks sharing a head add up, the others add 0);
        counted in ``self.grad_traffic``. Does nothing when the KV heads are split."""
        if not self.shares_kv_heads:
            return
        slot = int(self.kv_heads[0])
        for p in (*self.k.parameters(), *self.v.parameters()):
            if p.grad is None:
                continue
            buffer = p.grad.new_zeros((self.num_kv_heads, *p.grad.shape))
            buffer[slot] = p.grad
            self.grad_traffic.all_reduce(buffer)
            p.grad.copy_(buffer[slot])  # the sum over the ranks holding this KV head

    def project(self, x):
        """q (B, h/P, L, d_head) and k, v (B, this rank's KV heads, L, d_head) of this rank's heads."""
        B, L, _ = x.shape
        q = self.q(x).view(B, L, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(B, L, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(B, L, -1, self.head_dim).transpose(1, 2)
        return q, k, v

    def partial_output(self, out):
        """out (B, h/P, L, d_head) -> this rank's term of the output projection (B, L, d_model)."""
        return merge_heads(out) @ self.o_weight.T

    def add_bias(self, y):
        return y if self.o_bias is None else y + self.o_bias

    def forward(self, x, *, mask=None, is_causal: bool = False):
        validation.tensor("x", x, dims=3, floating=True)
        x = copy_to_ranks(x, self.backward_traffic)  # f: identity; backward: all-reduce of dx
        q, k, v = self.project(x)
        out = _attend(q, k, v, mask, is_causal)
        return self.add_bias(sum_over_ranks(self.partial_output(out), self.traffic))  # g: all-reduce


def _attend(q, k, v, mask, is_causal):
    L, n_rep = q.shape[2], q.shape[1] // k.shape[1]
    if is_causal:
        causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        mask = causal if mask is None else mask & causal
    return scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask)[0]


class MegatronBlock(nn.Module):
    """``x + attention(norm(x))`` split by heads over the ranks, optionally sequence-parallel.

    ``MegatronBlock(norm, module, rank, world_size, sequence_parallel=False, group=None)``: a copy
    of ``norm`` (e.g. ``nn.LayerNorm(d_model)`` or :class:`mha_course.RMSNorm`, replicated on every
    rank) and this rank's :class:`MegatronAttention` of ``module``.
    ``forward(x, *, is_causal=False)``: without sequence parallelism x is (B, L, d_model), the
    whole input on every rank, and so is the output; with it, x is this rank's contiguous block of
    positions (B, L/P, d_model) (:func:`shard_sequence` along dim 1) and so is the output.
    ``self.norm_elements`` records the elements of the norm's input and output on this rank in the
    last forward. With ``sequence_parallel``, call :meth:`sum_replicated_grads` after the backward.
    """

    def __init__(
        self, norm: nn.Module, module, rank: int, world_size: int, *, sequence_parallel: bool = False, group=None
    ):
        super().__init__()
        if not isinstance(norm, nn.Module):
            raise TypeError(f"norm must be an nn.Module (a LayerNorm or RMSNorm), got {type(norm).__name__}")
        self.norm = copy.deepcopy(norm)
        self.attention = MegatronAttention(module, rank, world_size, group=group)
        self.sequence_parallel, self.norm_elements = bool(sequence_parallel), 0
        self.grad_traffic = GroupTraffic(group=group)  # the replicated parameters' gradients (sequence-parallel)

    @property
    def traffic(self) -> GroupTraffic:
        return self.attention.traffic

    @property
    def backward_traffic(self) -> GroupTraffic:
        return self.attention.backward_traffic

    def forward(self, x, *, is_causal: bool = False):
        validation.tensor("x", x, dims=3, floating=True)
        if not self.sequence_parallel:
            normed = self.norm(x)  # (B, L, d_model) on every rank
            self.norm_elements = x.numel() + normed.numel()
            return x + self.attention(normed, is_causal=is_causal)
        attn = self.attention
        normed = self.norm(x)  # (B, L/P, d_model): this rank's positions only
        self.norm_elements = x.numel() + normed.numel()
        full = gather_sequence(normed, 1, self.traffic, self.backward_traffic)  # (B, L, d_model)
        q, k, v = attn.project(full)
        partial = attn.partial_output(_attend(q, k, v, None, is_causal))  # (B, L, d_model), this rank's heads
        y = scatter_sequence(partial, 1, self.traffic, self.backward_traffic)  # (B, L/P, d_model), summed
        return x + attn.add_bias(y)

    def sum_replicated_grads(self) -> None:
        """Sequence-parallel only: sum over the ranks the gradients of the parameters every rank
        holds whole but applies to its own positions only — the norm's weights and W_O's bias
        (Megatron-LM all-reduces the same ones). Counted in ``self.grad_traffic``. Without sequence
        parallelism every rank already has their whole gradients, and nothing is sent."""
        if not self.sequence_parallel:
            return
        params = [*self.norm.parameters(), *([] if self.attention.o_bias is None else [self.attention.o_bias])]
        for p in params:
            if p.grad is not None:
                self.grad_traffic.all_reduce(p.grad)


def _grads(module: nn.Module) -> dict:
    return {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}


@torch.enable_grad()  # a job runs the backward even where the caller turned gradients off
def tensor_parallel_backward_rank(module, x, grad_out, mask=None, is_causal: bool = False):
    """A rank's job: :class:`MegatronAttention` of the full ``module`` on the full x (B, L,
    d_model), forward then ``out.backward(grad_out)`` (and :meth:`MegatronAttention.sum_shared_kv_grads`).
    Returns ``(out, dx, weight grads by name, forward bytes, backward bytes)``; the grads are of
    q.weight, q.bias, k.*, v.*, o_weight, o_bias."""
    layer = MegatronAttention(module, dist.get_rank(), dist.get_world_size())
    x = x.clone().requires_grad_()
    out = layer(x, mask=mask, is_causal=is_causal)
    out.backward(grad_out)
    layer.sum_shared_kv_grads()
    return out.detach(), x.grad, _grads(layer), dict(layer.traffic.sent), dict(layer.backward_traffic.sent)


@torch.enable_grad()  # a job runs the backward even where the caller turned gradients off
def megatron_block_rank(norm, module, x, grad_out, sequence_parallel: bool, is_causal: bool = False):
    """A rank's job: :class:`MegatronBlock` on the full x (B, L, d_model) (its block of positions
    with ``sequence_parallel``), forward then backward with ``grad_out`` (likewise). Returns a dict:
    out and dx (full, or this rank's positions), grads (the norm's and W_O's bias, summed over the
    ranks when sequence-parallel; the attention's shards), norm_elements, and forward / backward /
    replicated-gradient bytes per collective."""
    rank, P = dist.get_rank(), dist.get_world_size()
    block = MegatronBlock(norm, module, rank, P, sequence_parallel=sequence_parallel)
    if sequence_parallel:
        x, grad_out = shard_sequence(x, rank, P, dim=1), shard_sequence(grad_out, rank, P, dim=1)
    x = x.clone().requires_grad_()
    out = block(x, is_causal=is_causal)
    out.backward(grad_out)
    block.attention.sum_shared_kv_grads()
    if sequence_parallel:
        block.sum_replicated_grads()
    return {
        "out": out.detach(),
        "dx": x.grad,
        "grads": {name.removeprefix("attention."): g for name, g in _grads(block).items()},
        "norm_elements": block.norm_elements,
        "forward": dict(block.traffic.sent),
        "backward": dict(block.backward_traffic.sent),
        "replicated_grads": dict(block.grad_traffic.sent),
    }


@torch.enable_grad()  # a job runs the backward even where the caller turned gradients off
def ulysses_backward_rank(q, k, v, grad_out, causal: bool = False):
    """A rank's job: this rank's block of the full q, k, v (B, h(_kv), L, d) and grad_out;
    :func:`ulysses_attention` with a :class:`DifferentiableTraffic`, then the backward. Returns
    ``(out, dq, dk, dv, forward bytes, backward bytes)``."""
    rank, P = dist.get_rank(), dist.get_world_size()
    traffic = DifferentiableTraffic()
    q, k, v = (shard_sequence(t, rank, P).requires_grad_() for t in (q, k, v))
    out = ulysses_attention(q, k, v, causal=causal, traffic=traffic)
    out.backward(shard_sequence(grad_out, rank, P))
    return out.detach(), q.grad, k.grad, v.grad, dict(traffic.sent), dict(traffic.backward.sent)


def mesh_groups(tensor_size: int):
    """This rank's (tensor group, context group, t, c) on a (context × tensor) mesh of all ranks,
    rank = c·T + t. Every rank makes every group, in the same order, as ``new_group`` requires."""
    world = dist.get_world_size()
    validation.positive_int("tensor_size", tensor_size)
    if world % tensor_size:
        raise ValueError(f"tensor_size={tensor_size} must divide the number of ranks, {world}")
    T, C, me = tensor_size, world // tensor_size, dist.get_rank()
    tensor_groups = [dist.new_group([c * T + t for t in range(T)]) for c in range(C)]
    context_groups = [dist.new_group([c * T + t for c in range(C)]) for t in range(T)]
    t, c = me % T, me // T
    return tensor_groups[c], context_groups[t], t, c


@torch.enable_grad()  # a job runs the backward even where the caller turned gradients off
def mesh_rank(module, x, grad_out, tensor_size: int = 2, causal: bool = False, layout: str = "contiguous"):
    """A rank's job on a (context × tensor) mesh: heads over the tensor axis (:class:`MegatronAttention`
    on the tensor group), positions over the context axis (:func:`ring_attention_autograd` on the
    context group). x and grad_out (B, L, d_model) are full; the rank takes its positions (``layout``).
    After the backward, the weight shards' gradients are summed over the context group. Returns a
    dict: t, c, positions, out and dx (this rank's positions), grads, and bytes per collective:
    tensor (f/g) forward and backward, ring forward and backward, and the gradient sum."""
    tgroup, cgroup, t, c = mesh_groups(tensor_size)
    C = dist.get_world_size() // tensor_size
    layer = MegatronAttention(module, t, tensor_size, group=tgroup)
    ring, ring_back, grad_sum = GroupTraffic(group=cgroup), GroupTraffic(group=cgroup), GroupTraffic(group=cgroup)
    xs = shard_sequence(x, c, C, layout, dim=1).clone().requires_grad_()  # (B, L/C, d_model)
    q, k, v = layer.project(copy_to_ranks(xs, layer.backward_traffic))  # f on the tensor group
    out = ring_attention_autograd(q, k, v, causal=causal, layout=layout, traffic=ring, backward_traffic=ring_back)
    y = layer.add_bias(sum_over_ranks(layer.partial_output(out), layer.traffic))  # g on the tensor group
    y.backward(shard_sequence(grad_out, c, C, layout, dim=1))
    layer.sum_shared_kv_grads()
    for p in layer.parameters():
        grad_sum.all_reduce(p.grad)  # each context rank saw its positions only
    result = {
        "t": t,
        "c": c,
        "positions": sequence_positions(x.shape[1], c, C, layout),
        "out": y.detach(),
        "dx": xs.grad,
        "grads": _grads(layer),
        "tensor_forward": dict(layer.traffic.sent),
        "tensor_backward": dict(layer.backward_traffic.sent),
        "ring_forward": dict(ring.sent),
        "ring_backward": dict(ring_back.sent),
        "grad_sum": dict(grad_sum.sent),
    }
    dist.barrier()
    for group in (tgroup, cgroup):
        dist.destroy_process_group(group)
    return result


# --- references through one process, to set the ranks' results against --------------------------------


def one_process_grads(module, x, grad_out, *, norm=None, is_causal: bool = False):
    """Autograd through one process: ``module(x)`` (or ``x + module(norm(x))`` with a ``norm``),
    then the backward from ``grad_out``, on copies (``module``, ``norm`` and ``x`` are untouched;
    runs with gradients enabled even where they are off). Returns ``(out, dx, grads)``: grads of
    the copies' parameters by name (``norm.*`` for the norm's)."""
    module, norm = copy.deepcopy(module), copy.deepcopy(norm)
    with torch.enable_grad():
        x = x.detach().clone().requires_grad_()
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).tril() if is_causal else None
        out = module(x if norm is None else norm(x), mask=mask)[0]
        out = out if norm is None else x + out
        out.backward(grad_out)
    grads = {name: p.grad for name, p in module.named_parameters()}
    if norm is not None:
        grads |= {f"norm.{name}": p.grad for name, p in norm.named_parameters()}
    return out.detach(), x.grad, grads


def one_process_attention_grads(q, k, v, grad_out, *, causal: bool = False):
    """Autograd through one process for attention over the whole sequence: q (B, h, L, d), k, v
    (B, h_kv, L, d), grad_out (B, h, L, d). Returns ``(out, dq, dk, dv)``."""
    with torch.enable_grad():
        q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
        n_rep, L = q.shape[1] // k.shape[1], q.shape[2]
        mask = torch.ones(L, L, dtype=torch.bool, device=q.device).tril() if causal else None
        out = scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask)[0]
        out.backward(grad_out)
    return out.detach(), q.grad, k.grad, v.grad


def shard_of_grads(grads: dict, module, rank: int, world_size: int) -> dict:
    """The slices of a full module's gradients (``grads`` by parameter name, as
    :func:`one_process_grads` returns them) that rank ``rank`` of ``world_size`` holds under tensor
    parallelism, named as :class:`MegatronAttention`'s parameters (q.weight, ..., o_weight, o_bias);
    a norm's gradients (``norm.*``, replicated on every rank) are passed through whole."""
    if hasattr(module, "out_proj"):
        h, h_kv, hd, out_name = module.num_heads, module.num_heads, module.d_head, "out_proj"
    else:
        h, h_kv, hd, out_name = module.num_heads, module.num_kv_heads, module.head_dim, "o_proj"
    q_heads, kv_heads = heads_of_rank(rank, world_size, h, h_kv)
    q_rows, kv_rows = _rows(q_heads, hd), _rows(kv_heads, hd)
    shard = {name: g for name, g in grads.items() if name.startswith("norm.")}
    for name, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows)):
        shard[f"{name}.weight"] = grads[f"{name}_proj.weight"][rows]
        if f"{name}_proj.bias" in grads:
            shard[f"{name}.bias"] = grads[f"{name}_proj.bias"][rows]
    shard["o_weight"] = grads[f"{out_name}.weight"][:, q_rows]
    if f"{out_name}.bias" in grads:
        shard["o_bias"] = grads[f"{out_name}.bias"]
    return shard


def flat_grads(grads: dict, names) -> torch.Tensor:
    """The gradients ``grads[name]`` for ``names`` (in that order), flattened into one vector."""
    return torch.cat([grads[name].flatten() for name in names])
