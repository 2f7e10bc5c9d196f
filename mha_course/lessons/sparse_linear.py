"""Notebook 16 (attention that skips keys): decode-step costs of full, windowed and top-k
attention, the needle-retrieval task, the associative-recall task, transformers' reference
functions side by side with the course's, and the hybrid cache table."""

from __future__ import annotations

import math
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch

from .. import validation
from ..attention import scaled_dot_product_attention
from ..configs import LATENT_MODEL_CONFIGS, MODEL_CONFIGS
from ..hybrid import HYBRID_MODEL_CONFIGS
from ..linear import gated_delta_rule
from ..masks import causal_mask
from ..sparse import indexer_scores, topk_mask, topk_sparse_attention

GIB = 2**30


# ---------------------------------------------------------------------------------------------
# what one decode step reads and computes


@dataclass(frozen=True)
class SparseLayer:
    """One DeepSeek-V3.2 attention layer at decode time (transformers' DeepseekV32Config defaults):
    MLA in its absorbed form caches kv_lora_rank + qk_rope_head_dim numbers per token; every head
    scores a key over those 576 numbers and reads the 512 latent ones as its value. The indexer has
    index_n_heads heads of index_head_dim and one index_head_dim key per token."""

    num_heads: int = 128
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    index_n_heads: int = 64
    index_head_dim: int = 128
    top_k: int = 2048
    cache_bytes_per_element: int = 2  # the latent in bf16
    index_bytes_per_element: int = 1  # the reference indexer stores its keys in FP8


def decode_step_cost(kind: str, seq_len: int, layer: SparseLayer = SparseLayer()) -> tuple[int, int]:
    """(FLOPs, bytes read) of one new token's attention in one layer over ``seq_len`` cached tokens.

    kind "full": every cached latent; "window": the last ``top_k`` only (a window of the same
    budget); "top-k": the indexer over every cached index key, then attention over ``top_k`` of
    the latents. A multiply-add is 2 FLOPs; the projections (the same for all three) are left out.
    """
    validation.positive_int("seq_len", seq_len)
    per_key_flops = 2 * layer.num_heads * (layer.kv_lora_rank + layer.qk_rope_head_dim + layer.kv_lora_rank)
    per_key_bytes = (layer.kv_lora_rank + layer.qk_rope_head_dim) * layer.cache_bytes_per_element
    if kind == "full":
        keys = seq_len
        return keys * per_key_flops, keys * per_key_bytes
    keys = min(seq_len, layer.top_k)
    if kind == "window":
        return keys * per_key_flops, keys * per_key_bytes
    if kind == "top-k":
        index_flops = 2 * layer.index_n_heads * layer.index_head_dim * seq_len
        index_bytes = layer.index_head_dim * layer.index_bytes_per_element * seq_len
        return keys * per_key_flops + index_flops, keys * per_key_bytes + index_bytes
    raise ValueError(f"kind must be 'full', 'window' or 'top-k', got {kind!r}")


def draw_decode_costs(lengths, layer: SparseLayer = SparseLayer()):
    """Two panels over the context length: FLOPs and bytes of one decode step per kind."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, which, label in ((axes[0], 0, "FLOPs per decode step"), (axes[1], 1, "bytes read per decode step")):
        for kind, style in (("full", "-"), ("top-k", "--"), ("window", ":")):
            ax.loglog(lengths, [decode_step_cost(kind, n, layer)[which] for n in lengths], style, label=kind)
        ax.set_xlabel("tokens in the cache (L)")
        ax.set_ylabel(label)
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_title(f"compute: top-{layer.top_k:,} vs full vs window")
    axes[1].set_title("memory traffic (latents bf16, index keys FP8)")
    axes[1].legend()
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# a needle far back: what a window misses and top-k finds


def needle_trial(distance: int, *, seq_len=512, d=64, d_index=16, budget=64, gain=12.0, generator=None):
    """One query that looks for one key ``distance`` tokens back among ``seq_len`` random keys.

    The needle's key is √d·u for a random unit u; the query is gain·u; the other keys are random
    N(0, 1). The indexer sees q and k through a random (d, d_index) projection. Returns the
    attention weight the query's row gives the needle under full attention, a sliding window of
    ``budget`` keys (the query's own position included) and top-``budget`` attention.
    """
    g = generator
    k = torch.randn(1, 1, seq_len, d, generator=g, dtype=torch.float64)  # (B, h, L, d)
    v = torch.randn(1, 1, seq_len, d, generator=g, dtype=torch.float64)
    u = torch.nn.functional.normalize(torch.randn(d, generator=g, dtype=torch.float64), dim=0)
    at = seq_len - 1 - distance
    k[0, 0, at] = math.sqrt(d) * u
    q = (gain * u).view(1, 1, 1, d)  # (B, h, 1, d): the newest position asks
    proj = torch.randn(d, d_index, generator=g, dtype=torch.float64) / math.sqrt(d_index)
    q_index = (q[0, 0] @ proj).view(1, 1, 1, d_index)  # (B, Lq, H_I=1, d_I)
    k_index = k[0] @ proj  # (B, Lk, d_I)
    scores = indexer_scores(q_index, k_index, torch.ones(1, 1, 1, dtype=torch.float64))  # (1, 1, L)
    causal = causal_mask(1, seq_len)[None]  # (1, 1, L): the query is the last position
    window = torch.zeros(1, 1, seq_len, dtype=torch.bool)
    window[..., seq_len - budget :] = True
    _, w_full = scaled_dot_product_attention(q, k, v, causal)
    _, w_window = scaled_dot_product_attention(q, k, v, window)
    _, w_topk = topk_sparse_attention(q, k, v, scores, budget, causal)
    return {name: float(w[0, 0, 0, at]) for name, w in (("full", w_full), ("window", w_window), ("top-k", w_topk))}


def needle_table(distances, *, trials=20, seed=0, **kwargs) -> dict[int, dict[str, int]]:
    """distance -> {kind: trials (of ``trials``) in which the needle gets at least half the weight}."""
    g = torch.Generator().manual_seed(seed)
    table = {}
    for distance in distances:
        found = {"full": 0, "window": 0, "top-k": 0}
        for _ in range(trials):
            for name, weight in needle_trial(distance, generator=g, **kwargs).items():
                found[name] += weight >= 0.5
        table[distance] = found
    return table


# ---------------------------------------------------------------------------------------------
# associative recall: n key–value pairs written once, every key asked once


def recall_accuracy(method: str, n_pairs: int, *, d_k=16, seed=0, scale=8.0) -> float:
    """Share of the ``n_pairs`` stored pairs recalled: a random unit key per pair, a random value;
    asking with the key, the answer counts when it is closer (cosine) to that pair's value than to
    any other stored value. ``method``: "softmax" (attention over the stored pairs, scores · scale),
    "linear" (S = Σ k vᵀ, read Sᵀ q) or "delta" (the delta rule with β = 1, no decay)."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.nn.functional.normalize(torch.randn(n_pairs, d_k, generator=g, dtype=torch.float64), dim=-1)
    values = torch.randn(n_pairs, d_k, generator=g, dtype=torch.float64)
    if method == "softmax":
        answers, _ = scaled_dot_product_attention(keys, keys, values, scale=scale)  # (n, d_k)
    elif method == "linear":
        answers = keys @ (keys.T @ values)  # (n, d_k): Sᵀ q with S = Kᵀ V
    elif method == "delta":
        zeros = torch.zeros(1, 1, n_pairs, dtype=torch.float64)
        _, state = gated_delta_rule(
            keys.view(1, 1, n_pairs, d_k), keys.view(1, 1, n_pairs, d_k), values.view(1, 1, n_pairs, d_k),
            zeros, zeros + 1.0,
        )  # fmt: skip
        answers = keys @ state[0, 0] / math.sqrt(d_k)  # (n, d_k): Sᵀ q, undoing the 1/√d_k query scale
    else:
        raise ValueError(f"method must be 'softmax', 'linear' or 'delta', got {method!r}")
    similarity = torch.nn.functional.normalize(answers, dim=-1) @ torch.nn.functional.normalize(values, dim=-1).T
    return (similarity.argmax(-1) == torch.arange(n_pairs)).double().mean().item()


def recall_table(pair_counts, *, seeds=range(5), d_k=16) -> dict[str, dict[int, tuple[float, float, float]]]:
    """method -> n_pairs -> (mean, min, max) recall over ``seeds``."""
    table = {}
    for method in ("softmax", "linear", "delta"):
        table[method] = {}
        for n in pair_counts:
            runs = [recall_accuracy(method, n, d_k=d_k, seed=s) for s in seeds]
            table[method][n] = (sum(runs) / len(runs), min(runs), max(runs))
    return table


def draw_recall(table, d_k: int):
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for method, rows in table.items():
        ns = list(rows)
        mean = [rows[n][0] for n in ns]
        ax.plot(ns, mean, marker="o", label=method)
        ax.fill_between(ns, [rows[n][1] for n in ns], [rows[n][2] for n in ns], alpha=0.2)
    ax.axvline(d_k, color="grey", linestyle=":", label=f"d_k = {d_k}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("key–value pairs stored")
    ax.set_ylabel("share recalled (mean; band = min–max over seeds)")
    ax.set_title("Associative recall: a growing cache vs a d_k × d_v state")
    ax.legend()
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# transformers' reference functions, called in the course's layout


def transformers_delta_rule(q, k, v, g, beta, *, chunk_size=None, initial_state=None):
    """transformers' torch_recurrent_gated_delta_rule (chunk_size None) or torch_chunk_gated_delta_rule
    on the course's (B, h, L, ·) tensors: transposed to its (B, L, h, ·), and back. With fewer
    query/key heads than value heads, each query/key head is repeated for its group of consecutive
    value heads first, as transformers 5.20's Qwen3-Next layer does before calling them (5.25
    repeats inside them instead, where heads already repeated pass through unchanged)."""
    from transformers.models.qwen3_next import modeling_qwen3_next as qn
    from transformers.utils import logging as hf_logging

    group = v.shape[1] // q.shape[1]
    q, k = q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)
    hq, hk, hv = (x.transpose(1, 2) for x in (q, k, v))
    hg, hb = g.transpose(1, 2), beta.transpose(1, 2)
    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # no note that the optional fast kernels are not installed
    try:
        if chunk_size is None:
            out, state = qn.torch_recurrent_gated_delta_rule(hq, hk, hv, hg, hb, initial_state, output_final_state=True)
        else:
            out, state = qn.torch_chunk_gated_delta_rule(
                hq, hk, hv, hg, hb, chunk_size=chunk_size, initial_state=initial_state, output_final_state=True
            )
    finally:
        hf_logging.set_verbosity(before)
    return out.transpose(1, 2), state


def random_delta_inputs(B, h_k, h_v, L, d_k, d_v, *, seed=0):
    """float32 inputs as Qwen3-Next feeds the rule: unit-length q and k, g = −softplus(·) ≤ 0,
    β = sigmoid(·) in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    unit = torch.nn.functional.normalize
    q = unit(torch.randn(B, h_k, L, d_k, generator=gen), dim=-1)
    k = unit(torch.randn(B, h_k, L, d_k, generator=gen), dim=-1)
    v = torch.randn(B, h_v, L, d_v, generator=gen)
    g = -torch.nn.functional.softplus(torch.randn(B, h_v, L, generator=gen))
    beta = torch.sigmoid(torch.randn(B, h_v, L, generator=gen))
    return q, k, v, g, beta


def indexer_agreement(seed: int, *, seq_len=24, top_k=6, batch=2) -> tuple[int, int]:
    """Build a tiny transformers DeepseekV32Indexer, let it pick each query's top-k keys (causal),
    compute the course's indexer_scores from the same weights (its RoPE applied with
    mc.apply_rope) and pick with topk_mask. Returns (query rows picked alike, rows)."""
    from transformers import DeepseekV32Config
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Indexer

    from ..positions import apply_rope

    torch.manual_seed(seed)
    cfg = DeepseekV32Config(
        hidden_size=32, q_lora_rank=16, index_n_heads=4, index_head_dim=16, index_topk=top_k, qk_rope_head_dim=8
    )
    indexer = DeepseekV32Indexer(cfg, layer_idx=0).eval()
    x, q_resid = torch.randn(batch, seq_len, 32), torch.randn(batch, seq_len, 16)
    pos = torch.arange(seq_len)
    inv = 1.0 / (10000.0 ** (torch.arange(0, 8, 2) / 8))
    angles = torch.cat([pos[:, None] * inv, pos[:, None] * inv], -1)  # (L, 8): rotate-half layout
    causal = causal_mask(seq_len)[None]  # (1, L, L)
    with torch.no_grad():
        picked = indexer(x, q_resid, (angles.cos()[None], angles.sin()[None]), causal, pos[None])  # (B, L, top_k)
        q = indexer.wq_b(q_resid).view(batch, seq_len, 4, 16)  # (B, L, H_I, d_I)
        k = indexer.k_norm(indexer.wk(x))  # (B, L, d_I)
        q = torch.cat([apply_rope(q[..., :8].transpose(1, 2), pos).transpose(1, 2), q[..., 8:]], -1)
        k = torch.cat([apply_rope(k[..., :8], pos), k[..., 8:]], -1)
        scores = indexer_scores(q, k, indexer.weights_proj(x) * 4**-0.5)  # (B, L, L)
    ours = topk_mask(scores, top_k, causal)
    theirs = torch.zeros_like(ours).scatter_(-1, picked.long(), True) & causal
    return int((ours == theirs).all(-1).sum()), batch * seq_len


# ---------------------------------------------------------------------------------------------
# the cache table


def cache_rows(lengths) -> list[tuple[str, str, list[float]]]:
    """(model, layer schedule, GiB at each length) for one sequence: the hybrids (full layers
    bf16, linear states float32), a dense GQA model, an MLA model, and Qwen3-Next if every one
    of its layers were full attention."""
    rows = []
    for name in ("Qwen3-Next-80B-A3B", "Kimi Linear 48B-A3B"):
        c = HYBRID_MODEL_CONFIGS[name]
        rows.append((name, c.layer_schedule, [c.cache_bytes(n) / GIB for n in lengths]))
    qn = HYBRID_MODEL_CONFIGS["Qwen3-Next-80B-A3B"]
    all_full = [qn.num_layers * qn.full_elements_per_token * n * 2 / GIB for n in lengths]
    rows.append(("Qwen3-Next, all full", f"{qn.num_layers} full", all_full))
    dense = MODEL_CONFIGS["Qwen2.5-7B"]
    rows.append((dense.name, f"{dense.num_layers} full (GQA)", [dense.kv_cache_bytes(n) / GIB for n in lengths]))
    mla = LATENT_MODEL_CONFIGS["DeepSeek-V3"]
    rows.append((mla.name, f"{mla.num_layers} full (MLA)", [mla.kv_cache_bytes(n) / GIB for n in lengths]))
    return rows


def draw_topk_weights(full_weights, sparse_weights, top_k: int):
    """Two heatmaps of one head's weights (Lq, Lk): full causal attention and its top-k version."""
    from ..kit.plotting import heatmap

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    heatmap(full_weights, title="full causal attention", ax=axes[0], annotate=False, vmin=0, vmax=1)
    heatmap(sparse_weights, title=f"top-{top_k} sparse attention", ax=axes[1], annotate=False, vmin=0, vmax=1)
    fig.tight_layout()
    return fig
