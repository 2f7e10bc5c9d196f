"""Exercise checkers: ``mc.check.<exercise>(fn) -> CheckResult``, displayed as one line.

Each checker runs your function on a few fixed random inputs of several shapes, compares with
the course's reference and, when something is off, names the likely mistake. It never raises
because of your code and never shows the reference code.

One module per topic; each checker is imported here by name (add a line for a new one). How
to write one: ``mha_course/check/framework.py``. ``available()`` lists them.
"""

from __future__ import annotations

from .accounting import count_attention_params, kv_cache_bytes
from .address_book import address_book_query
from .attention import multi_head_attention, scaled_dot_product_attention
from .backward import backward_tile, repeat_kv_backward, softmax_backward
from .bert_layer import attention_from_bert
from .block import pre_norm_block
from .cache_schemes import gather_blocks, mla_cache_bytes, sink_window_update
from .cached_gqa import cached_gqa_attention
from .cross_attention import cross_attention
from .demo import normalize_rows
from .diagnostics import attention_entropy
from .distributed import heads_of_rank, merge_partials, ring_steps
from .framework import CheckResult
from .gqa import repeat_kv
from .head_budget import attention_flops_split
from .head_importance import gradient_importance
from .heads import merge_heads, split_heads
from .kv_cache import write_kv
from .layer import multi_head_attention_layer
from .layer_bugs import find_bug
from .leakage import leaks_future
from .masks import causal_mask, padding_mask
from .modern import gated_output, softcap_scores
from .per_head import multi_head_attention_per_head
from .positions import apply_rope, llama3_frequencies, rope_step
from .pretrained import previous_token_score
from .sparse_linear import delta_rule_update, topk_mask
from .specialize import ablate_heads
from .split_merge import attend_in_heads
from .streaming import cache_positions, sink_softmax
from .tiled import online_softmax_update, tiled_attention
from .torch_masks import to_torch_masks

#: every checker: ``mc.check.<name>(fn) -> CheckResult``
CHECKERS = {
    fn.__name__: fn
    for fn in (
        scaled_dot_product_attention,
        address_book_query,
        multi_head_attention_per_head,
        multi_head_attention,
        count_attention_params,
        attention_flops_split,
        split_heads,
        merge_heads,
        attend_in_heads,
        causal_mask,
        padding_mask,
        to_torch_masks,
        leaks_future,
        multi_head_attention_layer,
        cross_attention,
        repeat_kv,
        kv_cache_bytes,
        write_kv,
        cached_gqa_attention,
        ablate_heads,
        gradient_importance,
        previous_token_score,
        attention_from_bert,
        online_softmax_update,
        tiled_attention,
        attention_entropy,
        find_bug,
        apply_rope,
        rope_step,
        llama3_frequencies,
        mla_cache_bytes,
        sink_window_update,
        sink_softmax,
        cache_positions,
        gather_blocks,
        softcap_scores,
        gated_output,
        normalize_rows,
        softmax_backward,
        backward_tile,
        repeat_kv_backward,
        heads_of_rank,
        merge_partials,
        ring_steps,
        topk_mask,
        delta_rule_update,
        pre_norm_block,
    )
}

__all__ = ["CheckResult", "CHECKERS", "available", *CHECKERS]


def available() -> list[str]:
    """Names of all checkers, sorted (``mc.check.<name>(fn)``)."""
    return sorted(CHECKERS)
