"""mha_course — multi-head attention from one head to grouped-query attention and the KV cache.

The package the course notebooks import. Conventions: tensors are batch-first; B batch,
L / Lq / Lk lengths, d_model width, h = num_heads, h_kv = num_kv_heads, d_head = d_model // h;
boolean masks mean True = may attend.

Attention
    scaled_dot_product_attention(q, k, v, mask=None, *, scale=None) -> (out, weights)
    split_heads(x, num_heads): (B, L, h*d_head) -> (B, h, L, d_head);  merge_heads(x): inverse
    LoopedMultiHeadAttention(d_model, num_heads, *, bias=True)            .to_fused()
    MultiHeadAttention(d_model, num_heads, *, bias=True, kdim=None, vdim=None, dropout=0.0)
        .forward(query, key=None, value=None, *, mask=None, need_weights=True) -> (out, weights|None)
        .from_torch(nn.MultiheadAttention)  .to_torch()
Masks
    causal_mask(q_len, k_len=None), sliding_window_mask(q_len, window, k_len=None),
    padding_mask(lengths, max_len) -> (B, 1, 1, max_len)
Grouped-query attention and the KV cache
    repeat_kv(x, n_rep), GroupedQueryAttention(d_model, num_heads, num_kv_heads, *, head_dim=None,
    bias=False), KVCache
Positions and a Llama-architecture decoder
    apply_rope(x, positions, *, theta=10000.0, layout="half"), RotaryEmbedding(head_dim, theta),
    alibi_bias(num_heads, q_len, k_len=None), sinusoidal_positions(length, d_model);
    RMSNorm(d, eps), SwiGLU(d_model, d_ff), LlamaDecoder(DecoderConfig(...)) .from_hf(model),
    generate_greedy(model, input_ids, max_new_tokens)
Accounting
    count_attention_params, attention_flops, kv_cache_bytes, MODEL_CONFIGS (name -> ModelConfig)
Exercises
    mha_course.check.<exercise>(fn) -> CheckResult
Notebooks
    setup(seed=0), environment_report()
"""

from . import check, plotting, quiz, widgets  # noqa: E402
from .accounting import attention_flops, count_attention_params, kv_cache_bytes
from .attention import scaled_dot_product_attention
from .configs import MODEL_CONFIGS, ModelConfig
from .decoder import DecoderConfig, LlamaDecoder, RMSNorm, SwiGLU, generate_greedy
from .env import environment_report, setup
from .gqa import GroupedQueryAttention, KVCache, repeat_kv
from .heads import merge_heads, split_heads
from .masks import causal_mask, padding_mask, sliding_window_mask
from .multihead import LoopedMultiHeadAttention, MultiHeadAttention
from .positions import RotaryEmbedding, alibi_bias, apply_rope, sinusoidal_positions

__version__ = "0.1.0"

__all__ = [
    "scaled_dot_product_attention",
    "split_heads",
    "merge_heads",
    "LoopedMultiHeadAttention",
    "MultiHeadAttention",
    "causal_mask",
    "padding_mask",
    "sliding_window_mask",
    "repeat_kv",
    "GroupedQueryAttention",
    "KVCache",
    "count_attention_params",
    "attention_flops",
    "kv_cache_bytes",
    "apply_rope",
    "RotaryEmbedding",
    "alibi_bias",
    "sinusoidal_positions",
    "RMSNorm",
    "SwiGLU",
    "DecoderConfig",
    "LlamaDecoder",
    "generate_greedy",
    "MODEL_CONFIGS",
    "ModelConfig",
    "check",
    "plotting",
    "quiz",
    "widgets",
    "setup",
    "environment_report",
]
