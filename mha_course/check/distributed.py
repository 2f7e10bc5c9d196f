"""Checkers for notebook 14's exercises: which heads a rank holds under tensor parallelism, and
the merge of two partial attention results that ring attention does when a block arrives."""

from __future__ import annotations

import torch

from ..distributed import heads_of_rank as _heads_reference
from ..tiled import merge_partials as _merge_reference
from .framework import Case, CheckResult, mistakes, run_check, tensor_generator

__all__ = ["heads_of_rank", "merge_partials"]

_INF = float("-inf")

# ---------------------------------------------------------------------------------------------
# heads_of_rank(rank, world_size, num_heads, num_kv_heads) -> (q_heads, kv_heads)


def _heads_variant(rank, world_size, num_heads, num_kv_heads, *, q="blocks", kv="groups"):
    """The split with one deliberate change (the reference with the defaults)."""
    per, n_rep = num_heads // world_size, num_heads // num_kv_heads
    if q == "strided":
        q_heads = torch.arange(rank, num_heads, world_size)  # rank, rank + P, ...
    else:
        q_heads = torch.arange(rank * per, (rank + 1) * per)
    if kv == "like queries":  # KV heads dealt out in blocks of h_kv // P, ignoring which group a query reads
        kv_per = num_kv_heads // world_size
        kv_heads = torch.arange(rank * kv_per, (rank + 1) * kv_per)
    elif kv == "modulo":
        kv_heads = torch.unique(q_heads % num_kv_heads)
    elif kv == "all":
        kv_heads = torch.arange(num_kv_heads)
    else:
        kv_heads = torch.unique(q_heads // n_rep)
    return q_heads, kv_heads


def _heads_cases():
    shapes = [  # (rank, world_size, num_heads, num_kv_heads), the first kept free of GQA
        ((1, 2, 4, 4), "MHA: 4 heads on 2 ranks, rank 1"),
        ((2, 4, 8, 4), "GQA: 8 query, 4 KV heads on 4 ranks, rank 2"),
        ((3, 4, 8, 2), "more ranks than KV heads: 8 query, 2 KV heads on 4 ranks, rank 3"),
        ((1, 4, 32, 8), "Llama-3-8B-like: 32 query, 8 KV heads on 4 ranks, rank 1"),
        ((1, 4, 16, 2), "16 query, 2 KV heads on 4 ranks, rank 1"),
        ((0, 2, 8, 1), "MQA: one KV head, 2 ranks, rank 0"),
        ((5, 8, 8, 2), "one query head per rank: 8 ranks, rank 5"),
    ]
    return [Case(args, description=words) for args, words in shapes]


HEADS_OF_RANK_MISTAKES = mistakes(
    "heads_of_rank",
    {
        "strided": lambda *a: _heads_variant(*a, q="strided"),
        "kv like queries": lambda *a: _heads_variant(*a, kv="like queries"),
        "kv modulo": lambda *a: _heads_variant(*a, kv="modulo"),
        "all kv heads": lambda *a: _heads_variant(*a, kv="all"),
    },
)


def heads_of_rank(fn) -> CheckResult:
    """Check ``fn(rank, world_size, num_heads, num_kv_heads) -> (q_heads, kv_heads)``: two int64
    tensors, ascending, of the query heads rank ``rank`` holds (contiguous blocks of h/P, rank 0 the
    first) and of the KV heads those query heads read (query head i reads KV head i // (h / h_kv))."""
    return run_check(
        "heads_of_rank",
        fn,
        _heads_cases(),
        reference=_heads_reference,
        mistakes=HEADS_OF_RANK_MISTAKES,
        arg_names=("rank", "world_size", "num_heads", "num_kv_heads"),
        output_names=("q_heads", "kv_heads"),
    )


# ---------------------------------------------------------------------------------------------
# merge_partials(out_a, lse_a, out_b, lse_b) -> (out, lse)


def _merge_variant(out_a, lse_a, out_b, lse_b, *, how):
    """A wrong merge: ``how`` names the mistake."""
    if how == "average":
        return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)
    if how == "lse max":
        return _merge_reference(out_a, lse_a, out_b, lse_b)[0], torch.maximum(lse_a, lse_b)
    if how == "lse sum":
        return _merge_reference(out_a, lse_a, out_b, lse_b)[0], lse_a + lse_b
    if how == "unnormalised":
        lse = torch.logaddexp(lse_a, lse_b)
        return torch.exp(lse_a)[..., None] * out_a + torch.exp(lse_b)[..., None] * out_b, lse
    if how == "swapped":
        lse = torch.logaddexp(lse_a, lse_b)
        wa, wb = torch.exp(lse_a - lse).nan_to_num(0.0), torch.exp(lse_b - lse).nan_to_num(0.0)
        return wb[..., None] * out_a + wa[..., None] * out_b, lse
    if how == "overflow":  # exp(lse) without subtracting the max: inf / inf for large scores
        ea, eb = torch.exp(lse_a)[..., None], torch.exp(lse_b)[..., None]
        return (ea * out_a + eb * out_b) / (ea + eb), torch.log(torch.exp(lse_a) + torch.exp(lse_b))
    if how == "no guard":  # NaN where neither part saw a key
        lse = torch.logaddexp(lse_a, lse_b)
        return torch.exp(lse_a - lse)[..., None] * out_a + torch.exp(lse_b - lse)[..., None] * out_b, lse
    raise ValueError(how)


def _partial(q, k, v, allowed=None):
    """Attention of q over the keys k (with an optional mask): (out, lse), out 0 / lse -inf where no key."""
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5  # (..., Lq, Lk)
    if allowed is not None:
        s = s.masked_fill(~allowed, _INF)
    lse = torch.logsumexp(s, dim=-1)  # (..., Lq)
    w = torch.exp(s - lse.masked_fill(lse == _INF, 0.0)[..., None])  # 0 in a row with no key
    return w @ v, lse


def _merge_cases():
    g = tensor_generator()

    def randn(*shape, spread=1.0):
        return torch.randn(*shape, generator=g) * spread

    def two_blocks(batch, lq, ka, kb, d, spread=1.0, mask_a=None):
        q = randn(*batch, lq, d, spread=spread)
        a = _partial(q, randn(*batch, ka, d, spread=spread), randn(*batch, ka, d), mask_a)
        b = _partial(q, randn(*batch, kb, d, spread=spread), randn(*batch, kb, d))
        return (*a, *b)

    no_keys_yet = torch.ones(5, 3, dtype=torch.bool)
    no_keys_yet[1:3] = False  # queries 1 and 2 see no key in block a (above the causal diagonal)
    nothing = (torch.zeros(2, 4, 3), torch.full((2, 4), _INF), torch.zeros(2, 4, 3), torch.full((2, 4), _INF))
    return [
        Case(two_blocks((), 4, 3, 5, 4), description="4 queries, blocks of 3 and 5 keys"),
        Case(two_blocks((2, 3), 6, 4, 4, 8), description="batch (2, 3), blocks of 4 keys"),
        Case(two_blocks((), 5, 3, 3, 4, mask_a=no_keys_yet), description="two queries with no key in block a"),
        Case(two_blocks((2,), 3, 4, 2, 4, spread=12.0), description="large scores (lse in the hundreds)"),
        Case(nothing, description="no key in either block"),
    ]


MERGE_PARTIALS_MISTAKES = mistakes(
    "merge_partials",
    {
        how: (lambda *a, how=how: _merge_variant(*a, how=how))
        for how in ("average", "unnormalised", "swapped", "lse max", "lse sum", "overflow", "no guard")
    },
)


def merge_partials(fn) -> CheckResult:
    """Check ``fn(out_a, lse_a, out_b, lse_b) -> (out, lse)``: two partial attention results for the
    same queries over disjoint key sets — out (..., Lq, d_v) = softmax over that set @ its values,
    lse (..., Lq) = log Σ exp(scores) over it (-inf, with out 0, for a query with no key there) —
    merged into the result over both sets."""
    return run_check(
        "merge_partials",
        fn,
        _merge_cases(),
        reference=_merge_reference,
        mistakes=MERGE_PARTIALS_MISTAKES,
        arg_names=("out_a", "lse_a", "out_b", "lse_b"),
        output_names=("out", "lse"),
    )
