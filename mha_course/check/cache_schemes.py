"""Checkers for notebook 12's caches: the rolling window with sinks, the paged cache's block-table
gather, and the bytes an MLA cache holds."""

from __future__ import annotations

import torch

from .. import cache_schemes as _cs
from .. import latent as _latent
from ..i18n import tr
from .framework import Case, CheckResult, mistakes, run_check, tensor_generator

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


def _trajectory(update, window, num_sinks, steps, h=2, d=3):
    """Run ``update`` from an empty cache for ``steps`` positions and record, after each step,
    what the cache holds whatever slot each token sits in: the kept positions in increasing order
    (steps, slots), padded with −1, and their keys (steps, h, slots, d), padded with 0. A malformed
    return value is handed back as it is, for the framework to describe."""
    g = tensor_generator(1000 * window + 10 * num_sinks + steps)
    slots = num_sinks + window
    keys = torch.zeros(h, slots, d)
    positions = torch.full((slots,), -1, dtype=torch.long)
    kept_rows, key_rows = [], []
    for t in range(steps):
        out = update(keys, positions, torch.randn(h, d, generator=g), t, window, num_sinks)
        if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(x, torch.Tensor) for x in out)):
            return out
        keys, positions = out
        if positions.shape != (slots,) or keys.shape != (h, slots, d):
            return out
        held = torch.nonzero(positions.to(torch.long) >= 0).flatten()
        order = held[positions[held].to(torch.long).argsort()]  # slots of the kept tokens, oldest first
        kept = torch.full((slots,), -1, dtype=torch.long)
        kept[: len(order)] = positions[order].to(torch.long)
        row = torch.zeros(h, slots, d, dtype=keys.dtype)
        row[:, : len(order)] = keys[:, order]
        kept_rows.append(kept)
        key_rows.append(row)
        keys, positions = keys.clone(), positions.clone()  # the next call may write in place
    return torch.stack(kept_rows), torch.stack(key_rows)  # (steps, slots), (steps, h, slots, d)


def _run_from_empty(update):
    return lambda window, num_sinks, steps: _trajectory(update, window, num_sinks, steps)


def _newest_slot(t, positions, window, num_sinks):
    if t < num_sinks + window:
        return _reference_slot(t, positions, window, num_sinks)
    return num_sinks + int(positions[num_sinks:].argmax())  # the most recent token, not the oldest


def _positions_not_recorded(keys, positions, k_new, t, window, num_sinks):
    keys[:, _reference_slot(t, positions, window, num_sinks)] = k_new
    return keys, positions


def _one_too_few(t, positions, window, num_sinks):
    if t < num_sinks:
        return t
    return num_sinks + (t - num_sinks) % max(window - 1, 1)  # the window's last slot is never used


SINK_WINDOW_UPDATE_MISTAKES = mistakes(
    "sink_window_update",
    {
        "ring over all slots": _run_from_empty(_update_at(lambda t, p, w, s: t % (s + w))),
        "window slots from 0": _run_from_empty(_update_at(lambda t, p, w, s: t if t < s else (t - s) % w)),
        "evicts the newest": _run_from_empty(_update_at(_newest_slot)),
        "one too few": _run_from_empty(_update_at(_one_too_few)),
        "positions not recorded": _run_from_empty(_positions_not_recorded),
    },
)


def sink_window_update(fn) -> CheckResult:
    """Check ``fn(keys, positions, k_new, t, window, num_sinks) -> (keys, positions)``: write the key
    k_new (h, d) of position t into a cache of num_sinks + window slots — keys (h, slots, d),
    positions (slots,) with −1 for an empty slot — so that it then holds the first num_sinks
    positions and the last ``window`` positions up to t. Which slot a token sits in is free: the
    check runs ``fn`` from an empty cache, step after step, and compares what the cache *holds*
    after every step (the kept positions and their keys), never the slots."""
    specs = [  # (window, num_sinks, steps, description)
        (4, 2, 40, "window 4, 2 sinks, 40 steps from empty"),
        (3, 0, 20, "window 3, no sinks, 20 steps"),
        (2, 3, 25, "window 2, 3 sinks, 25 steps"),
        (5, 1, 30, "window 5, 1 sink, 30 steps"),
        (6, 4, 8, "window 6, 4 sinks, 8 steps: the cache never fills"),
    ]
    cases = [Case((w, s, n), description=text) for w, s, n, text in specs]
    return run_check(
        "sink_window_update",
        _run_from_empty(fn) if callable(fn) else fn,
        cases,
        _run_from_empty(_reference_update),
        SINK_WINDOW_UPDATE_MISTAKES,
        arg_names=("window", "num_sinks", "steps"),
        output_names=(tr("kept positions after each step", "label"), tr("their keys", "label")),
    )


# ---------------------------------------------------------------------------------------------
# paged cache


def _untrimmed(pool, table, length):
    return _cs.gather_blocks(pool, table, len(table) * pool.shape[2])


def _no_transpose(pool, table, length):
    n, h, b, d = len(table), *pool.shape[1:3], pool.shape[3]
    return pool[table].reshape(h, n * b, d)[:, :length]


GATHER_BLOCKS_MISTAKES = mistakes(
    "gather_blocks",
    {
        "no transpose": _no_transpose,
        "pool order": lambda pool, table, length: _cs.gather_blocks(pool, torch.arange(len(table)), length),
        "sorted table": lambda pool, table, length: _cs.gather_blocks(pool, table.sort().values, length),
        "not trimmed": _untrimmed,
        "positions first": lambda pool, table, length: _cs.gather_blocks(pool, table, length).transpose(0, 1),
    },
)


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


_MLA_ARGS = ("num_layers", "kv_lora_rank", "qk_rope_head_dim", "seq_len", "batch", "bytes_per_element")


def _mla(*args, **kwargs):
    """mla_cache_bytes, with batch and bytes_per_element also by position (as the cases give them)."""
    return _latent.mla_cache_bytes(**dict(zip(_MLA_ARGS, args, strict=False)), **kwargs)


def _mla_variant(per_token):
    """A wrong count: ``per_token(case) `` numbers per token and layer instead of r + d_R."""

    def variant(case: Case):
        layers, r, rope, seq_len = case.args
        batch, nbytes = case.kwargs.get("batch", 1), case.kwargs.get("bytes_per_element", 2)
        return layers * per_token(r, rope, case.info) * seq_len * batch * nbytes

    return variant


MLA_CACHE_BYTES_MISTAKES = mistakes(
    "mla_cache_bytes",
    {
        "latent twice": _mla_variant(lambda r, rope, info: 2 * r + rope),
        "rope per head": _mla_variant(lambda r, rope, info: r + info["heads"] * rope),
        "no rope": _mla_variant(lambda r, rope, info: r),
        "expanded K and V": _mla_variant(lambda r, rope, info: 2 * info["heads"] * info["head_dim"]),
        "both twice": _mla_variant(lambda r, rope, info: 2 * (r + rope)),
        "no layers": lambda n, r, rope, s, batch=1, bytes_per_element=2: (r + rope) * s * batch * bytes_per_element,
        "elements": lambda n, r, rope, s, batch=1, bytes_per_element=2: n * (r + rope) * s * batch,
        "no batch": lambda n, r, rope, s, batch=1, bytes_per_element=2: n * (r + rope) * s * bytes_per_element,
    },
    on_case=("latent twice", "rope per head", "no rope", "expanded K and V", "both twice"),
)


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
    mistakes_, names = MLA_CACHE_BYTES_MISTAKES, _MLA_ARGS[:4]
    return run_check(
        "mla_cache_bytes", fn, cases, _mla, mistakes_, arg_names=names, output_label=tr("your answer", "label")
    )
