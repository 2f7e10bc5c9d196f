"""Tensor parallelism (Megatron-LM): heads are the unit. Each rank holds whole heads, its rows of
W_Q, W_K, W_V (column-parallel) and the matching columns of W_O (row-parallel); one all-reduce sums
the ranks' W_O outputs."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .. import validation
from ..attention import scaled_dot_product_attention
from ..gqa import GroupedQueryAttention
from ..heads import merge_heads
from ..multihead import MultiHeadAttention
from .traffic import Traffic


def heads_of_rank(rank: int, world_size: int, num_heads: int, num_kv_heads: int | None = None):
    """Which heads rank ``rank`` of ``world_size`` holds under tensor parallelism.

    Query heads are dealt out in contiguous blocks of ``num_heads // world_size`` (rank r holds
    heads r·h/P ... (r+1)·h/P - 1, i.e. rows r·h/P·d_head onward of W_Q). A rank holds the K/V
    heads its query heads read (query head i reads KV head i // (h / h_kv)): split, h_kv/P per rank,
    when h_kv is a multiple of P; replicated when P is a multiple of h_kv (each KV head on P/h_kv
    ranks). Any other h_kv is a ValueError, since a KV head would straddle two ranks (P = 2, h = 12,
    h_kv = 3 would give ranks KV heads [0, 1] and [1, 2]); vLLM's attention layers assert the same
    (``vllm/model_executor/models/llama.py``, ``LlamaAttention``).
    Returns ``(q_heads, kv_heads)``, two int64 tensors of head indices, ascending.
    """
    validation.positive_int("world_size", world_size)
    validation.positive_int("num_heads", num_heads)
    num_kv_heads = validation.kv_heads(num_heads, num_kv_heads)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, world_size={world_size}), got rank={rank!r}")
    if num_heads % world_size:
        raise ValueError(
            f"num_heads={num_heads} is not divisible by world_size={world_size}: tensor parallelism gives "
            f"every rank whole heads; choose a world size that divides {num_heads}"
        )
    if num_kv_heads % world_size and world_size % num_kv_heads:
        raise ValueError(
            f"num_kv_heads={num_kv_heads} is neither a multiple nor a divisor of world_size={world_size}: "
            f"a KV head would be shared by ranks that also hold other KV heads; choose a world size that "
            f"divides {num_kv_heads} or is a multiple of it"
        )
    per_rank = num_heads // world_size
    q_heads = torch.arange(rank * per_rank, (rank + 1) * per_rank)  # (h/P,)
    kv_heads = torch.unique(q_heads // (num_heads // num_kv_heads))  # the groups those heads read
    return q_heads, kv_heads


def _rows(heads: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Indices of the rows (features) of the given heads: head i owns [i·head_dim, (i+1)·head_dim)."""
    return (heads[:, None] * head_dim + torch.arange(head_dim)).flatten()  # (len(heads)·head_dim,)


class TensorParallelAttention(nn.Module):
    """One rank's share of a self-attention layer split by heads (Megatron-LM's attention).

    ``TensorParallelAttention(module, rank, world_size)`` keeps, of a :class:`MultiHeadAttention`
    or :class:`GroupedQueryAttention` ``module``, the rows of W_Q, W_K, W_V (and their biases) for
    this rank's heads (:func:`heads_of_rank`) and the matching columns of W_O; W_O's bias is kept
    once, added after the sum.

    ``forward(x, *, mask=None, is_causal=False)``: x (B, L, d_model), the full input, on every rank;
    mask bool (L, L) or (B, 1, L, L), True = may attend. Each rank attends with its heads only and
    projects with its columns of W_O to a partial (B, L, d_model); one all-reduce sums the partials.
    Returns (B, L, d_model), the same on every rank and equal to ``module(x)``. ``self.traffic``
    counts the bytes (one all-reduce of B·L·d_model elements per call).
    """

    def __init__(self, module, rank: int, world_size: int):
        super().__init__()
        if isinstance(module, MultiHeadAttention):
            if module.kdim != module.d_model or module.vdim != module.d_model:
                raise ValueError("TensorParallelAttention splits self-attention: the module has kdim/vdim != d_model")
            h, h_kv, self.head_dim, o = module.num_heads, module.num_heads, module.d_head, module.out_proj
        elif isinstance(module, GroupedQueryAttention):
            h, h_kv, self.head_dim, o = module.num_heads, module.num_kv_heads, module.head_dim, module.o_proj
        else:
            raise TypeError(
                f"module must be a MultiHeadAttention or GroupedQueryAttention, got {type(module).__name__}"
            )
        q_heads, kv_heads = heads_of_rank(rank, world_size, h, h_kv)
        self.rank, self.world_size, self.num_heads, self.num_kv_heads = rank, world_size, h, h_kv
        self.q_heads, self.kv_heads = q_heads, kv_heads
        #: for each local query head, the index of its KV head among this rank's KV heads
        self.kv_index = q_heads // (h // h_kv) - kv_heads[0]  # (h/P,)
        q_rows, kv_rows = _rows(q_heads, self.head_dim), _rows(kv_heads, self.head_dim)
        with torch.no_grad():
            self.q = _slice_linear(module.q_proj, q_rows)  # column-parallel: d_model -> (h/P)·d_head
            self.k = _slice_linear(module.k_proj, kv_rows)  # d_model -> (local kv heads)·d_head
            self.v = _slice_linear(module.v_proj, kv_rows)
            self.o_weight = nn.Parameter(o.weight[:, q_rows].clone())  # row-parallel: (d_model, (h/P)·d_head)
            self.o_bias = None if o.bias is None else nn.Parameter(o.bias.clone())  # added once, after the sum
        self.traffic = Traffic()

    def forward(self, x, *, mask=None, is_causal: bool = False):
        validation.tensor("x", x, dims=3, floating=True)
        B, L, _ = x.shape
        q = self.q(x).view(B, L, -1, self.head_dim).transpose(1, 2)  # (B, h/P, L, d_head)
        k = self.k(x).view(B, L, -1, self.head_dim).transpose(1, 2)  # (B, local h_kv, L, d_head)
        v = self.v(x).view(B, L, -1, self.head_dim).transpose(1, 2)
        k, v = k[:, self.kv_index], v[:, self.kv_index]  # (B, h/P, L, d_head): each query head's KV head
        if is_causal:
            causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
            mask = causal if mask is None else mask & causal
        out, _ = scaled_dot_product_attention(q, k, v, mask)  # (B, h/P, L, d_head): this rank's heads
        partial = merge_heads(out) @ self.o_weight.T  # (B, L, (h/P)·d_head) @ (.., d_model) -> (B, L, d_model)
        self.traffic.all_reduce(partial)  # Σ over ranks = concat(all heads) @ W_Oᵀ
        return partial if self.o_bias is None else partial + self.o_bias


def _slice_linear(linear: nn.Linear, rows: torch.Tensor) -> nn.Linear:
    """A new Linear with the given output rows of ``linear`` (weight and bias)."""
    out = nn.Linear(linear.in_features, len(rows), bias=linear.bias is not None)
    out = out.to(dtype=linear.weight.dtype, device=linear.weight.device)
    out.weight.copy_(linear.weight[rows])
    if linear.bias is not None:
        out.bias.copy_(linear.bias[rows])
    return out


def tensor_parallel_rank(module, x, mask=None, is_causal: bool = False):
    """A rank's job: build this rank's :class:`TensorParallelAttention` from the full ``module``
    (every rank receives it), run it on ``x``; return ``(out, heads, traffic)`` where ``heads`` is
    ``(q_heads, kv_heads)`` as lists and ``traffic`` the bytes sent per collective."""
    layer = TensorParallelAttention(module, dist.get_rank(), dist.get_world_size())
    with torch.no_grad():
        out = layer(x, mask=mask, is_causal=is_causal)
    return out, (layer.q_heads.tolist(), layer.kv_heads.tolist()), dict(layer.traffic.sent)


def dtensor_rank(module, x):
    """The same split with PyTorch's own tensor parallelism, as a reference: ``ColwiseParallel`` on
    q/k/v_proj, ``RowwiseParallel`` on the output projection, over a CPU device mesh of all ranks
    (``torch.distributed.tensor.parallel``). The module then runs with its local head counts, as in
    PyTorch's tensor-parallel tutorial. Returns (B, L, d_model), a plain tensor."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    P = dist.get_world_size()
    module = copy.deepcopy(module)
    out_name = "out_proj" if isinstance(module, MultiHeadAttention) else "o_proj"
    plan = {"q_proj": ColwiseParallel(), "k_proj": ColwiseParallel(), "v_proj": ColwiseParallel()}
    plan[out_name] = RowwiseParallel()
    mesh = init_device_mesh("cpu", (P,))
    parallelize_module(module, mesh, plan)
    module.num_heads //= P  # each rank's projections now produce its heads only
    if isinstance(module, GroupedQueryAttention):
        if module.num_kv_heads % P:
            raise ValueError(f"num_kv_heads={module.num_kv_heads} must be divisible by {P} ranks for ColwiseParallel")
        module.num_kv_heads //= P
    with torch.no_grad():
        out, _ = module(x, need_weights=True) if isinstance(module, MultiHeadAttention) else module(x)
    # the row-parallel output is an asynchronous all-reduce: wait for it before the tensor leaves the rank
    out = out.wait() if hasattr(out, "wait") else out
    return out.clone()
