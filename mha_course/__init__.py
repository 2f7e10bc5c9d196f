"""mha_course — multi-head attention from one head to grouped-query attention and the KV cache.

The package the course notebooks import. Conventions: tensors are batch-first; B batch,
L / Lq / Lk lengths, d_model width, h = num_heads, h_kv = num_kv_heads, d_head = d_model // h;
boolean masks mean True = may attend.

The package has three layers, one folder each (``ls`` shows them):

* the attention library (this folder; what ``mc.*`` exports; imports only torch)
    attention   scaled_dot_product_attention(q, k, v, mask=None, *, scale=None, sinks=None, softcap=None)
                -> (out, weights)
    heads       split_heads(x, num_heads): (B, L, h*d_head) -> (B, h, L, d_head); merge_heads(x)
    multihead   LoopedMultiHeadAttention, MultiHeadAttention (.from_torch, .to_torch, .to_fused)
    fast        FastMultiHeadAttention: the same function, tuned for speed (notebook 09)
    masks       causal_mask, sliding_window_mask, padding_mask
    gqa         repeat_kv, GroupedQueryAttention (options: sinks, qk_norm, output_gate, softcap, scale,
                window, rope: the attention layers of today's open models)
    hf_interop  attention_from_hf(hf_attention, hf_config): the course's layer from a transformers
                Llama, Qwen3, Qwen3-Next, Gemma 2 or gpt-oss attention module
    kv_cache    KVCache (growing, or preallocated with max_length), write_kv
    tiled       tiled_attention, online_softmax_update (the FlashAttention idea)
    backward    attention_backward (dq, dk, dv by hand), flash_attention (FlashAttention-2's
                recomputing backward as a torch.autograd.Function)
    block       EncoderBlock, Encoder
    latent      MultiHeadLatentAttention (DeepSeek's MLA), LatentCache, mla_cache_bytes
    cache_schemes  sink_window_mask, SinkWindowCache (rolling window + attention sinks),
                PagedKVCache (blocks and a block table), Int8KVCache
    accounting  count_attention_params, attention_flops, kv_cache_bytes
    configs     MODEL_CONFIGS (name -> ModelConfig; position scheme and RoPE base per model)
    positions   apply_rope(x, positions, *, theta, layout, scaling), RotaryEmbedding, alibi_bias,
                rope_frequencies(head_dim, theta, *, scaling) (context extension), rope_attention_factor,
                sinusoidal_positions; both RoPE layouts and the W_Q/W_K permutation between them
    norm        RMSNorm (of the decoder, and of q and k per head)
    decoder     SwiGLU, LlamaDecoder(DecoderConfig) (.from_hf), generate_greedy
    distributed Ranks / launch (gloo ranks on this machine), heads_of_rank, TensorParallelAttention,
                ring_attention, ulysses_attention, communication_bytes (attention across devices)
    sparse      topk_sparse_attention, topk_mask, indexer_scores (DeepSeek-V3.2's top-k attention)
    linear      gated_delta_rule (recurrent and chunked), delta_rule_step, linear_attention
    hybrid      HYBRID_MODEL_CONFIGS (Qwen3-Next, Kimi Linear): layer schedules and their cache bytes
    validation  the argument checks every public function runs first
* ``kit/`` — what every notebook uses: setup, plotting, widgets, quiz, verify, hint (the exercises'
  hint ladders), predict ("predict, then run"); plotting, widgets, quiz and verify load on first
  use, so ``import mha_course`` does not import matplotlib or ipywidgets
* ``lessons/`` — the helpers of one notebook each (see ``mha_course.lessons``)
* ``check/`` — the exercise checkers: ``mc.check.<exercise>(fn) -> CheckResult``
"""

import importlib

from .accounting import attention_flops, count_attention_params, kv_cache_bytes
from .attention import scaled_dot_product_attention
from .backward import attention_backward, flash_attention
from .cache_schemes import Int8KVCache, PagedKVCache, SinkWindowCache, sink_window_mask
from .configs import MODEL_CONFIGS, ModelConfig
from .decoder import DecoderConfig, LlamaDecoder, RMSNorm, SwiGLU, generate_greedy
from .distributed import (
    Ranks,
    TensorParallelAttention,
    communication_bytes,
    heads_of_rank,
    launch,
    ring_attention,
    ulysses_attention,
)
from .gqa import GroupedQueryAttention, repeat_kv
from .heads import merge_heads, split_heads
from .hf_interop import attention_from_hf
from .hybrid import HYBRID_MODEL_CONFIGS, HybridModelConfig
from .i18n import language, set_language
from .kit.hint_ladder import hint
from .kit.predict import predict
from .kit.setup import device, environment_report, setup
from .kv_cache import KVCache
from .latent import LatentCache, MultiHeadLatentAttention, mla_cache_bytes
from .linear import delta_rule_step, gated_delta_rule, linear_attention
from .masks import causal_mask, padding_mask, sliding_window_mask
from .multihead import LoopedMultiHeadAttention, MultiHeadAttention
from .positions import (
    RotaryEmbedding,
    alibi_bias,
    apply_rope,
    rope_attention_factor,
    rope_frequencies,
    sinusoidal_positions,
)
from .sparse import indexer_scores, topk_mask, topk_sparse_attention
from .tiled import merge_partials

__version__ = "0.1.0"

#: submodules loaded on first attribute access (``mc.quiz.show("01")``): they import matplotlib,
#: ipywidgets or the checkers, which a script that only computes attention does not need
_LAZY = {
    "check": "mha_course.check",
    "plotting": "mha_course.kit.plotting",
    "quiz": "mha_course.kit.quiz",
    "verify": "mha_course.kit.verify",
    "widgets": "mha_course.kit.widgets",
}


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        globals()[name] = module
        return module
    raise AttributeError(f"module 'mha_course' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))


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
    "attention_from_hf",
    "KVCache",
    "MultiHeadLatentAttention",
    "LatentCache",
    "mla_cache_bytes",
    "sink_window_mask",
    "SinkWindowCache",
    "PagedKVCache",
    "Int8KVCache",
    "count_attention_params",
    "attention_flops",
    "kv_cache_bytes",
    "apply_rope",
    "rope_frequencies",
    "rope_attention_factor",
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
    "setup",
    "set_language",
    "language",
    "environment_report",
    "hint",
    "predict",
    "device",
    "attention_backward",
    "flash_attention",
    "Ranks",
    "launch",
    "heads_of_rank",
    "TensorParallelAttention",
    "ring_attention",
    "ulysses_attention",
    "communication_bytes",
    "merge_partials",
    "topk_sparse_attention",
    "topk_mask",
    "indexer_scores",
    "gated_delta_rule",
    "delta_rule_step",
    "linear_attention",
    "HYBRID_MODEL_CONFIGS",
    "HybridModelConfig",
]
