"""Attention across devices: real processes, PyTorch's gloo engine, three ways to split the work.

* **Tensor parallelism** (Megatron-LM): each rank holds whole heads — its rows of W_Q, W_K, W_V
  (column-parallel) and the matching columns of W_O (row-parallel); every rank attends with its
  heads only and one all-reduce sums the ranks' W_O outputs. :func:`heads_of_rank`,
  :class:`TensorParallelAttention`.
* **Ring attention** (sequence/context parallelism): each rank holds a block of positions; K/V
  blocks travel around a ring of point-to-point sends and each rank folds the block that arrives
  into its queries' running softmax with :func:`mha_course.tiled.online_softmax_update`.
  :func:`ring_attention`, :func:`shard_sequence`.
* **DeepSpeed-Ulysses**: an all-to-all turns sequence-sharded Q, K, V into head-sharded ones over
  the whole sequence, each rank attends with its heads, and a second all-to-all turns the output
  back. :func:`ulysses_attention`.

:class:`Ranks` starts ``world_size`` processes on this machine (gloo backend, 127.0.0.1 only),
keeps their process group for several jobs and returns each rank's result; :func:`launch` is one
job. Under ``torchrun`` both run the function in the current process on its own rank. A rank's
function is a plain, importable function (a started process imports it by name); it finds its
place with ``torch.distributed.get_rank()`` / ``get_world_size()``.

Every collective here goes through :class:`Traffic`, which counts the bytes a rank sends to
other ranks, so the counts can be set against the formulas in :func:`communication_bytes`.

One module per part of the design (every name is also importable from here, as before):

* :mod:`.launcher` — :class:`Ranks`, :func:`launch`: starting ranks and running jobs on them;
* :mod:`.traffic` — :class:`Traffic`, the byte counter every collective goes through, and
  :func:`ring_all_reduce`, the ring algorithm out of sends;
* :mod:`.tensor_parallel` — :func:`heads_of_rank`, :class:`TensorParallelAttention`, and the
  DTensor reference :func:`dtensor_rank`;
* context parallelism: :mod:`.layouts` (:func:`sequence_positions`, :func:`shard_sequence`,
  :func:`unshard_sequence`), :mod:`.ring` (:func:`ring_attention`), :mod:`.ulysses`
  (:func:`ulysses_attention`) and :mod:`.allgather` (:func:`allgather_attention`, Llama 3's);
* :mod:`.costs` — :func:`communication_bytes`, the formulas (and :func:`sequence_parallel_bytes`,
  :func:`norm_activation_elements`);
* the backward of every split: :mod:`.collectives` (Megatron's f and g and the other collectives
  as autograd Functions, :class:`GroupTraffic` on sub-groups), :mod:`.ring_backward`
  (:func:`ring_attention_autograd`: dK/dV travel with their blocks) and :mod:`.backward`
  (:class:`MegatronAttention`, :class:`MegatronBlock` with sequence parallelism, Ulysses' backward,
  the 2 × 2 tensor × context mesh :func:`mesh_rank`, and the one-process references
  :func:`one_process_grads`, :func:`one_process_attention_grads`, :func:`shard_of_grads`).

References: Shoeybi et al., "Megatron-LM" (2019, arXiv:1909.08053) §3; Liu, Zaharia & Abbeel,
"Ring Attention with Blockwise Transformers" (2023, arXiv:2310.01889); Jacobs et al.,
"DeepSpeed Ulysses" (2023, arXiv:2309.14509); Brandon et al., "Striped Attention" (2023,
arXiv:2311.09431) and Llama 3's context parallelism (Dubey et al. 2024, arXiv:2407.21783 §3.3.2)
for load-balancing the causal ring.
"""

from __future__ import annotations

from .allgather import allgather_attention, allgather_rank
from .backward import (
    MegatronAttention,
    MegatronBlock,
    flat_grads,
    megatron_block_rank,
    mesh_groups,
    mesh_rank,
    one_process_attention_grads,
    one_process_grads,
    shard_of_grads,
    tensor_parallel_backward_rank,
    ulysses_backward_rank,
)
from .collectives import (
    DifferentiableTraffic,
    GroupTraffic,
    all_to_all,
    collective_rank,
    copy_to_ranks,
    gather_sequence,
    scatter_sequence,
    sum_over_ranks,
)
from .costs import communication_bytes, norm_activation_elements, sequence_parallel_bytes
from .launcher import MAX_WORLD_SIZE, Ranks, launch, shippable
from .layouts import sequence_positions, shard_sequence, unshard_sequence
from .ring import block_attention, ring_attention, ring_rank
from .ring_backward import RingAttentionFunction, ring_attention_autograd, ring_backward_rank
from .tensor_parallel import TensorParallelAttention, dtensor_rank, heads_of_rank, tensor_parallel_rank
from .traffic import Traffic, ring_all_reduce, ring_all_reduce_rank
from .ulysses import ulysses_attention, ulysses_rank

__all__ = [
    "MAX_WORLD_SIZE",
    "Ranks",
    "launch",
    "Traffic",
    "ring_all_reduce",
    "ring_all_reduce_rank",
    "heads_of_rank",
    "TensorParallelAttention",
    "tensor_parallel_rank",
    "dtensor_rank",
    "shard_sequence",
    "unshard_sequence",
    "sequence_positions",
    "ring_attention",
    "ring_rank",
    "block_attention",
    "shippable",
    "ulysses_attention",
    "ulysses_rank",
    "allgather_attention",
    "allgather_rank",
    "communication_bytes",
    "sequence_parallel_bytes",
    "norm_activation_elements",
    "GroupTraffic",
    "DifferentiableTraffic",
    "copy_to_ranks",
    "sum_over_ranks",
    "gather_sequence",
    "scatter_sequence",
    "all_to_all",
    "collective_rank",
    "RingAttentionFunction",
    "ring_attention_autograd",
    "ring_backward_rank",
    "MegatronAttention",
    "MegatronBlock",
    "tensor_parallel_backward_rank",
    "megatron_block_rank",
    "ulysses_backward_rank",
    "mesh_groups",
    "mesh_rank",
    "one_process_grads",
    "one_process_attention_grads",
    "shard_of_grads",
    "flat_grads",
]
