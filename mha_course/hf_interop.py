"""The course's attention layer from a ``transformers`` attention module: same weights, same RoPE.

:func:`attention_from_hf` reads one attention module of a transformers model (and that model's
config) and returns a :class:`~mha_course.GroupedQueryAttention` that computes the same function:
``layer(x, is_causal=True)`` at positions 0 … L−1 equals the transformers module run with its
model's rotary embedding and its causal (or sliding-window) mask. It reads classes by name, so
this module does not import transformers.
"""

from __future__ import annotations

import torch

from .gqa import GroupedQueryAttention
from .positions import RotaryEmbedding

#: class name -> what the family adds to Llama's attention (the options of GroupedQueryAttention)
SUPPORTED = {
    "LlamaAttention": "RoPE (with rope scaling), GQA",
    "Qwen3Attention": "QK-norm (RMSNorm per head on q and k, before RoPE)",
    "Qwen3NextAttention": "QK-norm (weight stored as 1 + w), a sigmoid output gate per head, partial RoPE",
    "Gemma2Attention": "score soft-capping, query_pre_attn_scalar ** -0.5 scale, sliding window on some layers",
    "GptOssAttention": "learned sinks, biases, YaRN RoPE, sliding window on some layers",
}


def _rope(hf_config, layer_type, head_dim: int) -> RotaryEmbedding:
    """The RoPE of a transformers config (v5's ``rope_parameters``; v4's ``rope_theta`` and
    ``rope_scaling``), with partial rotary dims and context scaling."""
    params = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    if "rope_type" not in params and "type" not in params and layer_type in params:  # one dict per layer type
        params = dict(params[layer_type])
    theta = float(params.pop("rope_theta", getattr(hf_config, "rope_theta", None) or 10000.0))
    partial = float(params.pop("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", None) or 1.0))
    kind = params.get("rope_type", params.get("type", "default"))
    scaling = None if kind == "default" else params
    return RotaryEmbedding(head_dim, theta, scaling=scaling, rotary_dim=int(head_dim * partial))


@torch.no_grad()
def attention_from_hf(hf_attention, hf_config) -> GroupedQueryAttention:
    """The course's :class:`~mha_course.GroupedQueryAttention` with the weights of a transformers
    attention module and the RoPE of its model's config (``rope_parameters``: theta, rope scaling,
    ``partial_rotary_factor``), in the module's dtype and in eval mode.

    hf_attention: one layer's attention of a Llama, Qwen3, Qwen3-Next (a full-attention layer),
        Gemma 2 (global or sliding) or gpt-oss model (``model.model.layers[i].self_attn``).
    hf_config: that model's config.
    Then ``layer(x, is_causal=True)`` for x (B, L, d_model) at positions 0 … L−1 equals
    ``hf_attention(x, position_embeddings=model.model.rotary_emb(x, positions), attention_mask=…)``
    with the model's causal (or sliding-window) mask. Anything else raises a ``TypeError`` naming
    the supported classes.
    """
    kind = type(hf_attention).__name__
    if kind not in SUPPORTED:
        raise TypeError(
            f"hf_attention must be one of {', '.join(SUPPORTED)} (a transformers attention module), got {kind}"
        )
    for name in ("hidden_size", "num_attention_heads", "num_key_value_heads"):
        if not isinstance(getattr(hf_config, name, None), int):
            raise TypeError(f"hf_config must be the model's transformers config with an int {name}, got {hf_config!r}")
    h, h_kv, hd = hf_config.num_attention_heads, hf_config.num_key_value_heads, hf_attention.head_dim
    if hf_attention.k_proj.weight.shape[0] != h_kv * hd or hf_attention.o_proj.weight.shape[1] != h * hd:
        raise ValueError(
            f"hf_config does not describe hf_attention: config says {h} heads, {h_kv} KV heads of {hd}, "
            f"the module has k_proj {tuple(hf_attention.k_proj.weight.shape)}, "
            f"o_proj {tuple(hf_attention.o_proj.weight.shape)}"
        )
    biases = {p: getattr(hf_attention, p).bias is not None for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
    if len(set(biases.values())) != 1:
        raise ValueError(f"the course's layer has biases on all four projections or on none, the module has {biases}")
    layer = GroupedQueryAttention(
        hf_config.hidden_size,
        h,
        h_kv,
        head_dim=hd,
        bias=biases["q_proj"],
        sinks=kind == "GptOssAttention",
        qk_norm=kind in ("Qwen3Attention", "Qwen3NextAttention"),
        output_gate=kind == "Qwen3NextAttention",  # q_proj's rows per head: [query | gate], as ours
        softcap=getattr(hf_attention, "attn_logit_softcapping", None),
        scale=hf_attention.scaling,  # head_dim ** -0.5, or Gemma 2's query_pre_attn_scalar ** -0.5
        window=getattr(hf_attention, "sliding_window", None),  # None on full-attention layers
        rope=_rope(hf_config, getattr(hf_attention, "layer_type", None), hd),
        norm_eps=getattr(hf_config, "rms_norm_eps", 1e-6),
    ).to(hf_attention.q_proj.weight)
    state = {k: v for k, v in hf_attention.state_dict().items()}
    if kind == "Qwen3NextAttention":  # Qwen3-Next's RMSNorm multiplies by (1 + weight)
        state["q_norm.weight"] = 1.0 + state["q_norm.weight"]
        state["k_norm.weight"] = 1.0 + state["k_norm.weight"]
    layer.load_state_dict(state)
    return layer.eval()
