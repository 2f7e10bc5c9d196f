"""Checkers for notebook 12's caches: the rolling window with sinks, the paged cache's block-table
gather, and the bytes an MLA cache holds."""

from __future__ import annotations

import torch

from .. import cache_schemes as _cs
from .. import latent as _latent
from .framework import Case, CheckResult, Mistake, run_check, tensor_generator

__all__ = ["sink_window_update", "gather_blocks", "mla_cache_bytes"]


# ---------------------------------------------------------------------------------------------
# rolling window + sinks


def _update_at(slot_of):
    """An update that writes position t into ``slot_of(t, positions, window, num_sinks)``."""

    def update(keys, positions, k_new, t, window, num_sinks):
        i = slot_of(t, positions, window, num_sinks)
        keys[:, i] = k_new
        positions[i] = t
        return keys, positions

    return update


def _reference_slot(t, positions, window, num_sinks):
    return t if t < num_sinks else num_sinks + (t - num_sinks) % window


_reference_update = _update_at(_reference_slot)


def _canonical(out):
    """(keys (h, slots, d), positions (slots,)) -> (kept positions sorted, their keys (h, kept, d)):
    the cache's content, whatever slot each token sits in."""
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
        return out
    keys, positions = out
    if positions.dim() != 1 or keys.dim() != 3 or keys.shape[1] != positions.shape[0]:
        return out
    positions = positions.to(torch.long)
    kept = torch.nonzero(positions >= 0).flatten()
    order = kept[positions[kept].argsort()]
    return positions[order], keys[:, order]


def _state(t, window, num_sinks, h=2, d=3, seed=0):
    """The cache after positions 0 .. t-1 (written by the reference), and the key of position t."""
    g = tensor_generator(seed)
    keys = torch.zeros(h, num_sinks + window, d)
    positions = torch.full((num_sinks + window,), -1, dtype=torch.long)
    for s in range(t):
        keys, positions = _reference_update(keys, positions, torch.randn(h, d, generator=g), s, window, num_sinks)
    return keys, positions, torch.randn(h, d, generator=g)


def _canon(update):
    return lambda *args: _canonical(update(*args))


def _newest_slot(t, positions, window, num_sinks):
    if t < num_sinks + window:
        return _reference_slot(t, positions, window, num_sinks)
    return num_sinks + int(positions[num_sinks:].argmax())  # the most recent token, not the oldest


def _positions_not_recorded(keys, positions, k_new, t, window, num_sinks):
    keys[:, _reference_slot(t, positions, window, num_sinks)] = k_new
    return keys, positions


SINK_WINDOW_UPDATE_MISTAKES = [
    Mistake(
        "ring over all slots",
        _canon(_update_at(lambda t, p, w, s: t % (s + w))),
        "a ring over all num_sinks + window slots evicts the sinks once the buffer is full: the first "
        "num_sinks positions must stay; only the window slots rotate",
    ),
    Mistake(
        "window slots from 0",
        _canon(_update_at(lambda t, p, w, s: t if t < s else (t - s) % w)),
        "the window's slots start at 0 and overwrite the sinks: they are the slots after the num_sinks sink slots",
    ),
    Mistake(
        "evicts the newest",
        _canon(_update_at(_newest_slot)),
        "the new token replaced the most recent one: it must replace the OLDEST token of the window",
    ),
    Mistake(
        "positions not recorded",
        _canon(_positions_not_recorded),
        "the key was written but positions was not updated: record t in the slot's entry of positions",
    ),
]


def sink_window_update(fn) -> CheckResult:
    """Check ``fn(keys, positions, k_new, t, window, num_sinks) -> (keys, positions)``: write the key
    k_new (h, d) of position t into a cache of num_sinks + window slots — keys (h, slots, d),
    positions (slots,) with −1 for an empty slot — so that it then holds the first num_sinks
    positions and the last ``window`` positions up to t. Which slot a token sits in is free."""
    specs = [  # (t, window, num_sinks, description)
        (1, 4, 2, "filling the sinks"),
        (4, 4, 2, "filling the window"),
        (6, 4, 2, "first eviction"),
        (11, 4, 2, "long after the first eviction"),
        (7, 3, 0, "no sinks"),
        (10, 2, 3, "window 2, three sinks"),
    ]
    cases = [Case((*_state(t, w, s, seed=i), t, w, s), description=text) for i, (t, w, s, text) in enumerate(specs)]
    return run_check(
        "sink_window_update",
        _canon(fn) if callable(fn) else fn,
        cases,
        _canon(_reference_update),
        SINK_WINDOW_UPDATE_MISTAKES,
        arg_names=("keys", "positions", "k_new", "t", "window", "num_sinks"),
        output_names=("kept positions", "their keys"),
    )


# ---------------------------------------------------------------------------------------------
# paged cache


def _untrimmed(pool, table, length):
    return _cs.gather_blocks(pool, table, len(table) * pool.shape[2])


def _no_transpose(pool, table, length):
    n, h, b, d = len(table), *pool.shape[1:3], pool.shape[3]
    return pool[table].reshape(h, n * b, d)[:, :length]


GATHER_BLOCKS_MISTAKES = [
    Mistake(
        "no transpose",
        _no_transpose,
        "reshaped (n, h_kv, block_size, d) straight to (h_kv, n·block_size, d): that mixes heads and blocks — "
        "move the head dim first (transpose) before merging blocks and offsets",
    ),
    Mistake(
        "pool order",
        lambda pool, table, length: _cs.gather_blocks(pool, torch.arange(len(table)), length),
        "took the first blocks of the pool: a sequence's blocks are wherever its block table says",
    ),
    Mistake(
        "sorted table",
        lambda pool, table, length: _cs.gather_blocks(pool, table.sort().values, length),
        "read the blocks in pool order (sorted ids): the block table's ORDER is the order of the positions",
    ),
    Mistake(
        "not trimmed",
        _untrimmed,
        "returned every slot of the blocks: the last block is only partly filled — keep the first `length` positions",
    ),
    Mistake(
        "positions first",
        lambda pool, table, length: _cs.gather_blocks(pool, table, length).transpose(0, 1),
        "returned (length, h_kv, d): the cache's layout is (h_kv, length, d), heads first",
    ),
]


def gather_blocks(fn) -> CheckResult:
    """Check ``fn(pool, block_table, length) -> (h_kv, length, d)``: the contiguous K (or V) of one
    sequence from a pool (num_blocks, h_kv, block_size, d) and its block table (n,) of pool block
    ids in sequence order; position p sits at pool[block_table[p // block_size], :, p % block_size]."""
    g = tensor_generator()
    specs = [  # (num_blocks, h_kv, block_size, d, table, length, description)
        (6, 2, 3, 4, [4, 0, 5], 8, "3 blocks of 3, the last one partly filled"),
        (5, 1, 2, 3, [2, 3], 4, "one head, full blocks"),
        (8, 3, 4, 2, [7, 1, 6, 2], 13, "4 blocks of 4, 3 heads"),
        (4, 2, 5, 3, [3], 2, "a single block"),
        (6, 2, 1, 3, [5, 3, 1], 3, "blocks of one token"),
    ]
    cases = [
        Case((torch.randn(n, h, b, d, generator=g), torch.tensor(table), length), description=text)
        for n, h, b, d, table, length, text in specs
    ]

    return run_check(
        "gather_blocks",
        fn,
        cases,
        _cs.gather_blocks,
        GATHER_BLOCKS_MISTAKES,
        arg_names=("pool", "block_table", "length"),
        output_label="your result",
    )


# ---------------------------------------------------------------------------------------------
# MLA cache bytes


def _mla(num_layers, kv_lora_rank, qk_rope_head_dim, seq_len, batch=1, bytes_per_element=2):
    return _latent.mla_cache_bytes(
        num_layers, kv_lora_rank, qk_rope_head_dim, seq_len, batch=batch, bytes_per_element=bytes_per_element
    )


def _mla_variant(per_token):
    """A wrong count: ``per_token(case) `` numbers per token and layer instead of r + d_R."""

    def variant(case: Case):
        layers, r, rope, seq_len = case.args
        batch, nbytes = case.kwargs.get("batch", 1), case.kwargs.get("bytes_per_element", 2)
        return layers * per_token(r, rope, case.info) * seq_len * batch * nbytes

    return variant


MLA_CACHE_BYTES_MISTAKES = [
    Mistake(
        "latent twice",
        _mla_variant(lambda r, rope, info: 2 * r + rope),
        "the latent counted twice (for K and for V): one latent per token serves both",
        on_case=True,
    ),
    Mistake(
        "rope per head",
        _mla_variant(lambda r, rope, info: r + info["heads"] * rope),
        "the RoPE key counted once per head: the decoupled key is shared by all heads, cached once",
        on_case=True,
    ),
    Mistake(
        "no rope",
        _mla_variant(lambda r, rope, info: r),
        "the decoupled RoPE key is missing: each token caches its latent AND its RoPE key",
        on_case=True,
    ),
    Mistake(
        "expanded K and V",
        _mla_variant(lambda r, rope, info: 2 * info["heads"] * info["head_dim"]),
        "counted the per-head keys and values the latent expands into: the cache holds only the latent "
        "and the RoPE key",
        on_case=True,
    ),
    Mistake(
        "both twice",
        _mla_variant(lambda r, rope, info: 2 * (r + rope)),
        "counted K and V separately (×2): MLA caches one latent and one RoPE key per token, no factor 2",
        on_case=True,
    ),
    Mistake(
        "no layers",
        lambda n, r, rope, s, batch=1, bytes_per_element=2: (r + rope) * s * batch * bytes_per_element,
        "layers ignored: every layer caches its own latent",
    ),
    Mistake(
        "elements",
        lambda n, r, rope, s, batch=1, bytes_per_element=2: n * (r + rope) * s * batch,
        "counted numbers, not bytes: multiply by bytes_per_element",
    ),
    Mistake(
        "no batch",
        lambda n, r, rope, s, batch=1, bytes_per_element=2: n * (r + rope) * s * bytes_per_element,
        "batch ignored: every sequence has its own cache",
    ),
]


def mla_cache_bytes(fn) -> CheckResult:
    """Check ``fn(num_layers, kv_lora_rank, qk_rope_head_dim, seq_len, batch=1, bytes_per_element=2) -> int``:
    the bytes of a multi-head latent attention cache for all layers, tokens and sequences."""
    cases = [
        Case((27, 512, 64, 4096), description="DeepSeek-V2-Lite, 4k tokens, bf16", info={"heads": 16, "head_dim": 128}),
        Case(
            (60, 512, 64, 32768),
            {"batch": 2},
            description="DeepSeek-V2, 32k tokens, batch 2",
            info={"heads": 128, "head_dim": 128},
        ),
        Case(
            (61, 512, 64, 1000),
            {"batch": 1, "bytes_per_element": 1},
            description="DeepSeek-V3, fp8",
            info={"heads": 128, "head_dim": 128},
        ),
        Case(
            (4, 32, 8, 10),
            {"batch": 3, "bytes_per_element": 4},
            description="toy, fp32",
            info={"heads": 4, "head_dim": 16},
        ),
    ]
    return run_check(
        "mla_cache_bytes",
        fn,
        cases,
        _mla,
        MLA_CACHE_BYTES_MISTAKES,
        arg_names=("num_layers", "kv_lora_rank", "qk_rope_head_dim", "seq_len"),
        output_label="your answer",
    )
