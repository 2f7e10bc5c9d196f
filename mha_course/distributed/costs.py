"""The cost formulas: bytes one rank sends over the wire per attention layer, forward and
backward, for each scheme, as :class:`Traffic` counts them."""

from __future__ import annotations

from .. import validation


def communication_bytes(
    scheme: str,
    *,
    batch: int,
    length: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    world_size: int,
    bytes_per_element: int = 4,
    d_model: int | None = None,
    direction: str = "forward",
) -> int:
    """Bytes one rank sends over the wire for one attention layer, as :class:`Traffic` counts them,
    in the ``direction`` "forward" (the default) or "backward".

    Forward:

    * "tensor": one ring all-reduce of the (B, L, d_model) output, 2(P-1)/P of B·L·d_model elements
      (d_model defaults to h·d_head);
    * "ring": P-1 sends of the rank's K and V block: (P-1)·2·B·h_kv·(L/P)·d_head;
    * "ulysses": four all-to-alls (Q, K, V in, the output back), each sending (P-1)/P of the rank's
      block: (P-1)/P · B·(L/P)·(2h + 2h_kv')·d_head, where h_kv' = h_kv, or P when the KV heads are
      repeated to one per rank (h divisible by P; h_kv divisible by P or dividing it; else ValueError).

    Backward (the same bytes per element):

    * "tensor": the same all-reduce once more, of dx at the layer's input (Megatron-LM's f operator:
      identity forward, all-reduce backward; Shoeybi et al. 2019, §3);
    * "ring": the K/V blocks go round again (P-1 sends) and the dK/dV accumulators travel with them,
      one step further so that they end on their own rank (P sends): (2P-1)·2·B·h_kv·(L/P)·d_head,
      as in the backward of ring-flash-attention (github.com/zhuzilin/ring-flash-attention);
    * "ulysses": the four all-to-alls in reverse (dO in; dQ, dK, dV back): the forward's bytes.
    """
    for name, value in (
        ("batch", batch),
        ("length", length),
        ("num_heads", num_heads),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
        ("world_size", world_size),
    ):
        validation.positive_int(name, value)
    if direction not in ("forward", "backward"):
        raise ValueError(f"direction must be 'forward' or 'backward', got direction={direction!r}")
    P, B, L, h, h_kv, d = world_size, batch, length, num_heads, num_kv_heads, head_dim
    if scheme == "tensor":
        elements = 2 * (P - 1) * B * L * (h * d if d_model is None else d_model) // P
    elif scheme == "ring":
        blocks = P - 1 if direction == "forward" else 2 * P - 1
        elements = blocks * 2 * B * h_kv * (L // P) * d
    elif scheme == "ulysses":
        if h % P or (h_kv % P and P % h_kv):
            raise ValueError(
                f"Ulysses gives each rank whole heads: num_heads={h} must be divisible by world_size={P}, and "
                f"num_kv_heads={h_kv} divisible by it or a divisor of it"
            )
        elements = (P - 1) * B * (L // P) * (2 * h + 2 * max(h_kv, P)) * d // P
    else:
        raise ValueError(f"scheme must be 'tensor', 'ring' or 'ulysses', got scheme={scheme!r}")
    return elements * bytes_per_element


def sequence_parallel_bytes(
    *, batch: int, length: int, d_model: int, world_size: int, bytes_per_element: int = 4
) -> dict[str, int]:
    """Bytes one rank sends for one attention layer under Megatron's sequence parallelism, in each
    direction (the backward swaps the two collectives, so it sends the same): an all-gather of the
    normalised (B, L/P, d_model) blocks before the column-parallel projections and a reduce-scatter
    of the (B, L, d_model) partial outputs after the row-parallel one, each passing P-1 blocks of
    B·(L/P)·d_model elements on. Together 2(P-1)/P·B·L·d_model elements: what "tensor" parallelism's
    one all-reduce sends (:func:`communication_bytes`), since a ring all-reduce is a reduce-scatter
    followed by an all-gather (Korthikanti et al. 2022, arXiv:2205.05198, §4.2.2)."""
    for name, value in (("batch", batch), ("length", length), ("d_model", d_model), ("world_size", world_size)):
        validation.positive_int(name, value)
    if length % world_size:
        raise ValueError(
            f"length={length} must be divisible by world_size={world_size} (one block of positions per rank)"
        )
    block = (world_size - 1) * batch * (length // world_size) * d_model * bytes_per_element
    return {"all_gather": block, "reduce_scatter": block}


def norm_activation_elements(*, batch: int, length: int, d_model: int, world_size: int, sequence_parallel: bool) -> int:
    """Elements of the norm's input and output that one rank holds for one layer: 2·B·L·d_model
    when every rank normalises the whole sequence (tensor parallelism alone), 2·B·(L/P)·d_model
    with sequence parallelism (each rank normalises its own positions)."""
    for name, value in (("batch", batch), ("length", length), ("d_model", d_model), ("world_size", world_size)):
        validation.positive_int(name, value)
    if sequence_parallel and length % world_size:
        raise ValueError(
            f"length={length} must be divisible by world_size={world_size} (one block of positions per rank)"
        )
    return 2 * batch * (length // world_size if sequence_parallel else length) * d_model
