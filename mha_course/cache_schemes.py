"""Three ways to store a KV cache other than one growing tensor per sequence.

- :class:`SinkWindowCache` — a rolling buffer of the last ``window`` positions plus the first
  ``num_sinks`` ("attention sinks", StreamingLLM): fixed memory however long the sequence.
  Equivalent to full attention with :func:`sink_window_mask`. Keys cached *after* RoPE keep the
  positions they had in the text (notebook 11's rule, right while positions never shift).
- :class:`RerotatingSinkCache` — StreamingLLM's position rule: keys cached *before* RoPE and
  rotated at every step by their position **within the cache** (sinks 0..S−1, then the window in
  order), so the distances the model sees never exceed the cache size.
- :class:`PagedKVCache` — fixed-size blocks in one shared pool, addressed per sequence by a
  block table (vLLM's PagedAttention); :func:`gather_blocks` rebuilds a sequence's contiguous K/V.
- :class:`Int8KVCache` — keys and values stored as int8 with one float scale per (token, head)
  (:func:`quantize_int8`): a quarter of float32's bytes, at a measurable error.

Shapes are batch-first; K/V per sequence are (h_kv, L, d_head); masks are True = may attend.
"""

from __future__ import annotations

import torch

from . import validation
from .accounting import tensor_bytes
from .attention import scaled_dot_product_attention
from .masks import causal_mask, sliding_window_mask
from .positions import apply_rope

__all__ = [
    "sink_window_mask",
    "SinkWindowCache",
    "decode_with_sink_window",
    "cache_positions",
    "RerotatingSinkCache",
    "decode_streaming",
    "gather_blocks",
    "PagedKVCache",
    "quantize_int8",
    "dequantize_int8",
    "Int8KVCache",
]


# ---------------------------------------------------------------------------------------------
# sliding window + attention sinks


def sink_window_mask(q_len: int, window: int, num_sinks: int = 0, k_len: int | None = None, *, device=None):
    """bool (q_len, k_len): the causal sliding window of ``window`` keys (:func:`mc.sliding_window_mask`)
    plus the first ``num_sinks`` positions, which every query that has reached them may see."""
    validation.positive_int("num_sinks", num_sinks, allow_zero=True)
    window_part = sliding_window_mask(q_len, window, k_len, device=device)  # (q_len, k_len)
    sinks = causal_mask(q_len, k_len, device=device)  # (q_len, k_len)
    sinks[:, num_sinks:] = False
    return window_part | sinks


class SinkWindowCache:
    """A fixed-size cache of ``num_sinks + window`` slots: the first ``num_sinks`` positions stay
    forever, the others rotate through ``window`` slots (each new token overwrites the oldest).

    ``update(k, v)`` takes ONE new position, k and v (B, h_kv, 1, d_head), and returns the whole
    buffer ``keys``, ``values`` (B, h_kv, num_sinks + window, d_head) and ``valid`` (slots, ) bool.
    ``positions`` (slots, ) holds the position each slot stores (−1 = still empty); the order of
    slots does not matter to attention, which sums over keys.
    """

    def __init__(self, window: int, num_sinks: int = 0):
        self.window = validation.positive_int("window", window)
        self.num_sinks = validation.positive_int("num_sinks", num_sinks, allow_zero=True)
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.positions = torch.full((num_sinks + window,), -1, dtype=torch.long)
        self.seen = 0  # tokens written so far

    def slot(self, t: int) -> int:
        """Where position t goes: its own sink slot, or the window slot of the token W positions back."""
        if t < self.num_sinks:
            return t
        return self.num_sinks + (t - self.num_sinks) % self.window

    def update(self, k, v):
        validation.tensor("k", k, dims=4)
        validation.tensor("v", v, dims=4)
        if k.shape[2] != 1 or v.shape[2] != 1:
            raise ValueError(
                f"update takes one new position (B, h_kv, 1, d), got k {tuple(k.shape)}, v {tuple(v.shape)}"
            )
        if self.keys is None:
            B, h, _, d = k.shape
            slots = self.num_sinks + self.window
            self.keys = k.new_zeros(B, h, slots, d)  # (B, h_kv, S + W, d_head)
            self.values = v.new_zeros(B, h, slots, v.shape[-1])
            self.positions = self.positions.to(k.device)  # the valid mask goes where the keys are
        i = self.slot(self.seen)
        self.keys[:, :, i] = k[:, :, 0]
        self.values[:, :, i] = v[:, :, 0]
        self.positions[i] = self.seen
        self.seen += 1
        return self.keys, self.values, self.valid

    @property
    def valid(self) -> torch.Tensor:
        """(slots,) bool: which slots hold a token."""
        return self.positions >= 0

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.keys, self.values)

    def __repr__(self) -> str:
        kept = sorted(p for p in self.positions.tolist() if p >= 0)
        return f"SinkWindowCache(window={self.window}, num_sinks={self.num_sinks}, seen={self.seen}, kept={kept})"


def decode_with_sink_window(q, k, v, window: int, num_sinks: int = 0):
    """Causal attention computed one position at a time through a :class:`SinkWindowCache`.

    q (B, h, L, d_k), k (B, h, L, d_k), v (B, h, L, d_v) -> out (B, h, L, d_v) and the cache.
    Equal to attention with ``sink_window_mask(L, window, num_sinks)``.
    """
    cache = SinkWindowCache(window, num_sinks)
    outs = []
    for t in range(q.shape[2]):
        keys, values, valid = cache.update(k[:, :, t : t + 1], v[:, :, t : t + 1])  # (B, h, S+W, d)
        out, _ = scaled_dot_product_attention(q[:, :, t : t + 1], keys, values, valid)  # (B, h, 1, d_v)
        outs.append(out)
    return torch.cat(outs, dim=2), cache  # (B, h, L, d_v)


def cache_positions(positions):
    """(slots,) the position each slot holds in the text (−1 = empty) -> (slots,) its position
    within the cache: the rank of its text position among the kept ones (0 for the oldest), −1 for
    an empty slot. StreamingLLM rotates keys and the query by these, not by the text positions."""
    validation.tensor("positions", positions, dims=1)
    kept = positions >= 0  # (slots,)
    ranks = (positions[None, :] < positions[:, None]) & kept[None, :]  # (slots, slots): j older than i
    return torch.where(kept, ranks.sum(dim=1), -1)  # (slots,)


class RerotatingSinkCache(SinkWindowCache):
    """A :class:`SinkWindowCache` that stores keys **before** RoPE and hands them back rotated by
    their position within the cache (:func:`cache_positions`), as StreamingLLM does (Xiao et al.
    2023, §3.2: with tokens [0, 1, 2, 3, 6, 7, 8] cached, decoding the next one uses positions
    0..7, not 0..9). ``update(k, v)`` takes ONE new position, k (pre-RoPE) and v (B, h_kv, 1, d), and
    returns rotated keys, values (B, h_kv, slots, d) and ``valid`` (slots,); rotate the new query at
    ``query_position`` (the newest token's position within the cache)."""

    def __init__(self, window: int, num_sinks: int = 0, *, theta: float = 10000.0, layout: str = "half"):
        super().__init__(window, num_sinks)
        self.theta, self.layout = theta, layout

    def update(self, k, v):
        raw_keys, values, valid = super().update(k, v)  # (B, h_kv, slots, d): keys before RoPE
        where = cache_positions(self.positions).clamp(min=0)  # (slots,); empty slots are masked out
        keys = apply_rope(raw_keys, where, theta=self.theta, layout=self.layout)  # (B, h_kv, slots, d)
        return keys, values, valid

    @property
    def query_position(self) -> int:
        return int(self.valid.sum()) - 1


def decode_streaming(q, k, v, window: int, num_sinks: int = 0, *, positions: str = "cache", theta: float = 10000.0):
    """Causal decoding, one position at a time, through a window-plus-sinks cache with RoPE.

    q, k (B, h, L, d) **before** RoPE, v (B, h, L, d_v) -> out (B, h, L, d_v) and the cache.
    ``positions="cache"``: StreamingLLM's rule (:class:`RerotatingSinkCache`), queries and keys
    rotated by their positions within the cache. ``positions="text"``: each key rotated once at its
    text position before caching, as notebook 11's cache does — equal to full attention with
    RoPE at the text positions and :func:`sink_window_mask`.
    """
    if positions not in ("cache", "text"):
        raise ValueError(f"positions must be 'cache' or 'text', got {positions!r}")
    if positions == "text":
        L = q.shape[2]
        q, k = apply_rope(q, torch.arange(L), theta=theta), apply_rope(k, torch.arange(L), theta=theta)
        return decode_with_sink_window(q, k, v, window, num_sinks)
    cache = RerotatingSinkCache(window, num_sinks, theta=theta)
    outs = []
    for t in range(q.shape[2]):
        keys, values, valid = cache.update(k[:, :, t : t + 1], v[:, :, t : t + 1])  # (B, h, S+W, d)
        q_t = apply_rope(q[:, :, t : t + 1], [cache.query_position], theta=theta)  # (B, h, 1, d)
        outs.append(scaled_dot_product_attention(q_t, keys, values, valid)[0])  # (B, h, 1, d_v)
    return torch.cat(outs, dim=2), cache  # (B, h, L, d_v)


# ---------------------------------------------------------------------------------------------
# paged cache


def gather_blocks(pool, block_table, length: int):
    """A sequence's contiguous K (or V) from a block pool.

    pool (num_blocks, h_kv, block_size, d); block_table (n,) int — the pool blocks holding the
    sequence's positions [0, B), [B, 2B), ... in order; length ≤ n · block_size.
    Returns (h_kv, length, d): position p is ``pool[block_table[p // B], :, p % B]``.
    """
    blocks = pool[block_table]  # (n, h_kv, B, d), in the sequence's order
    n, h, B, d = blocks.shape
    return blocks.transpose(0, 1).reshape(h, n * B, d)[:, :length]  # (h_kv, length, d)


class PagedKVCache:
    """K/V of many sequences in one pool of fixed-size blocks (vLLM's PagedAttention layout).

    ``PagedKVCache(num_blocks, block_size, num_kv_heads, head_dim, dtype=torch.float32, device=None)``
    allocates ``key_pool`` and ``value_pool`` (num_blocks, h_kv, block_size, d) on ``device``.
    ``append(seq, k, v)`` writes the new positions, k and v (h_kv, L_new, d), of sequence ``seq``,
    taking a free block whenever the last one is full; ``block_tables[seq]`` lists its blocks in
    order. ``gather(seq)`` returns its contiguous K, V (h_kv, L, d); ``free(seq)`` returns its
    blocks to the pool.
    """

    def __init__(
        self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, *, dtype=torch.float32, device=None
    ):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            validation.positive_int(name, value)
        shape = (
            num_blocks,
            validation.positive_int("num_kv_heads", num_kv_heads),
            block_size,
            validation.positive_int("head_dim", head_dim),
        )
        self.block_size = block_size
        self.key_pool = torch.zeros(shape, dtype=dtype, device=device)  # (num_blocks, h_kv, block_size, d)
        self.value_pool = torch.zeros(shape, dtype=dtype, device=device)
        self.free_blocks = list(range(num_blocks))
        self.block_tables: dict = {}
        self.lengths: dict = {}

    def append(self, seq, k, v) -> None:
        validation.tensor("k", k, dims=3)
        validation.tensor("v", v, dims=3)
        if k.shape != v.shape or k.shape[0] != self.key_pool.shape[1] or k.shape[2] != self.key_pool.shape[3]:
            raise ValueError(
                f"k and v must both be (h_kv, L_new, d) = ({self.key_pool.shape[1]}, L_new, {self.key_pool.shape[3]}), "
                f"got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        table = self.block_tables.setdefault(seq, [])
        for i in range(k.shape[1]):
            pos = self.lengths.get(seq, 0)
            if pos % self.block_size == 0:  # the last block is full (or there is none): take a new one
                if not self.free_blocks:
                    raise RuntimeError(f"the pool's {self.key_pool.shape[0]} blocks are all in use")
                table.append(self.free_blocks.pop(0))
            block, offset = table[pos // self.block_size], pos % self.block_size
            self.key_pool[block, :, offset] = k[:, i]
            self.value_pool[block, :, offset] = v[:, i]
            self.lengths[seq] = pos + 1

    def gather(self, seq):
        table = torch.tensor(self.block_tables[seq], device=self.key_pool.device)
        length = self.lengths[seq]
        return gather_blocks(self.key_pool, table, length), gather_blocks(self.value_pool, table, length)

    def free(self, seq) -> None:
        self.free_blocks += self.block_tables.pop(seq)
        del self.lengths[seq]

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block of K and V together."""
        return 2 * self.key_pool[0].numel() * self.key_pool.element_size()

    @property
    def used_nbytes(self) -> int:
        """Bytes of the blocks that sequences hold."""
        return sum(len(t) for t in self.block_tables.values()) * self.block_nbytes


# ---------------------------------------------------------------------------------------------
# int8 cache


def quantize_int8(x, dim: int = -1):
    """Symmetric int8 quantisation with one scale per slice along ``dim``.

    x float (...); returns q int8 (same shape) and scale (x's dtype, size 1 along ``dim``) with
    x ≈ q · scale, scale = max|x| / 127 over ``dim``. ``dim=-1`` on (B, h, L, d) K/V: one scale
    per (token, head) — "per token"; ``dim=-2``: one per (head, channel) over the tokens — "per channel".
    """
    validation.tensor("x", x, floating=True)
    scale = x.abs().amax(dim=dim, keepdim=True).clamp(min=torch.finfo(x.dtype).tiny) / 127
    q = torch.round(x / scale).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q, scale):
    """q int8 and its scale -> float (scale's dtype): q · scale."""
    return q.to(scale.dtype) * scale


class Int8KVCache:
    """A KV cache that stores K and V as int8 with one float scale per (token, head).

    ``update(k, v)`` with k, v (B, h_kv, L_new, d) float appends them quantised and returns the
    dequantised whole K, V (B, h_kv, L, d). ``nbytes`` counts the int8 values and the scales.
    """

    def __init__(self):
        self.parts: dict[str, list[torch.Tensor]] = {"k": [], "k_scale": [], "v": [], "v_scale": []}

    def update(self, k, v):
        for name, x in (("k", k), ("v", v)):
            validation.tensor(name, x, dims=4, floating=True)
            q, scale = quantize_int8(x, dim=-1)  # (B, h_kv, L_new, d) int8, (B, h_kv, L_new, 1)
            self.parts[name].append(q)
            self.parts[name + "_scale"].append(scale)
        return tuple(
            dequantize_int8(torch.cat(self.parts[n], dim=2), torch.cat(self.parts[n + "_scale"], dim=2)) for n in "kv"
        )  # (B, h_kv, L, d) each

    @property
    def length(self) -> int:
        return sum(q.shape[2] for q in self.parts["k"])

    @property
    def nbytes(self) -> int:
        return tensor_bytes(*(t for ts in self.parts.values() for t in ts))
