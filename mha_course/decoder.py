"""A Llama-architecture decoder assembled from the course's parts.

One layer (pre-norm, as in Llama, Mistral, Qwen, SmolLM)::

    x = x + attention(RMSNorm(x))      # GroupedQueryAttention with RoPE, causal, KV cache
    x = x + SwiGLU(RMSNorm(x))         # down(silu(gate(x)) * up(x))

and the model: token embedding -> layers -> RMSNorm -> lm_head (tied to the embedding or not).
Parameter names are those of Hugging Face's Llama checkpoints without the leading ``model.``, so
:meth:`LlamaDecoder.load_hf_state_dict` maps a ``LlamaForCausalLM`` state dict onto it by name.

Numerics follow Llama's reference code: RMSNorm's mean square and RoPE's angles are computed in
float32 whatever the model's dtype (see :class:`RMSNorm` and :mod:`mha_course.positions`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import validation as _validate
from .gqa import GroupedQueryAttention, KVCache
from .norm import RMSNorm
from .positions import RotaryEmbedding


class SwiGLU(nn.Module):
    """The gated feed-forward network of Llama (Shazeer 2020): down(silu(gate(x)) · up(x)).
    x (..., d_model) -> hidden (..., d_ff) -> (..., d_model). Layers named as in Llama."""

    def __init__(self, d_model: int, d_ff: int, *, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.silu(self.gate_proj(x)) * self.up_proj(x)  # (..., d_ff)
        return self.down_proj(hidden)  # (..., d_model)


@dataclass(frozen=True)
class DecoderConfig:
    """The shape of a Llama-architecture decoder (field names: the course's; ``from_hf`` reads
    a ``transformers`` LlamaConfig). ``rope_scaling``: None for plain RoPE, or a context-extension
    dict as transformers writes it (e.g. Llama 3.1's ``{"rope_type": "llama3", "factor": 8.0, ...}``;
    see :func:`mha_course.positions.rope_frequencies`)."""

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    d_ff: int
    head_dim: int | None = None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    rope_scaling: dict | None = None

    @classmethod
    def from_hf(cls, config) -> DecoderConfig:
        """From a ``transformers`` LlamaConfig (v4: ``rope_theta``; v5: ``rope_parameters``)."""
        rope = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
        theta = float(rope.pop("rope_theta", getattr(config, "rope_theta", None) or 10000.0))
        kind = rope.get("rope_type", rope.get("type", "default"))
        scaling = None if kind == "default" else rope
        RotaryEmbedding(2, theta, scaling=scaling)  # a clear error now for an unsupported rope_type
        return cls(
            vocab_size=config.vocab_size,
            d_model=config.hidden_size,
            num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            d_ff=config.intermediate_size,
            head_dim=getattr(config, "head_dim", None),
            rope_theta=theta,
            rms_norm_eps=config.rms_norm_eps,
            tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            attention_bias=bool(getattr(config, "attention_bias", False)),
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            rope_scaling=scaling,
        )


class DecoderLayer(nn.Module):
    """One pre-norm Llama layer: x + attn(norm(x)), then + mlp(norm(x)). x (B, L, d_model)."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        c = config
        self.input_layernorm = RMSNorm(c.d_model, c.rms_norm_eps)
        self.self_attn = GroupedQueryAttention(
            c.d_model, c.num_heads, c.num_kv_heads, head_dim=c.head_dim, bias=c.attention_bias
        )
        self.post_attention_layernorm = RMSNorm(c.d_model, c.rms_norm_eps)
        self.mlp = SwiGLU(c.d_model, c.d_ff, bias=c.mlp_bias)

    def forward(
        self,
        x: torch.Tensor,
        rope: RotaryEmbedding,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        h = self.input_layernorm(x)  # (B, L, d_model)
        causal = {"is_causal": True, "need_weights": False}  # causal mask, no weights
        attn, _ = self.self_attn(h, cache=cache, rope=rope, **causal)  # (B, L, d_model)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x))  # (B, L, d_model)


class LlamaDecoder(nn.Module):
    """A decoder-only language model with Llama's architecture.

    ``forward(input_ids, caches=None)``: input_ids (B, L) integers -> logits (B, L, vocab_size).
    With ``caches`` (one :class:`~mha_course.KVCache` per layer, from :meth:`new_caches`),
    input_ids holds only the new tokens: they are placed after the cached ones (RoPE rotates them
    at the cache length) and their keys/values are appended.
    """

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = c = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.d_model, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight  # one matrix: embedding and output
        self.rope = RotaryEmbedding(self.layers[0].self_attn.head_dim, c.rope_theta, scaling=c.rope_scaling)

    def new_caches(self) -> list[KVCache]:
        """One empty KV cache per layer."""
        return [KVCache() for _ in self.layers]

    def forward(self, input_ids: torch.Tensor, caches: list[KVCache] | None = None) -> torch.Tensor:
        _validate.tensor("input_ids", input_ids, dims=2)
        if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
            raise TypeError(f"input_ids must be integer token ids, got {input_ids.dtype}")
        if caches is not None and len(caches) != len(self.layers):
            raise ValueError(f"caches must hold one KVCache per layer ({len(self.layers)}), got {len(caches)}")
        x = self.embed_tokens(input_ids)  # (B, L, d_model)
        for i, layer in enumerate(self.layers):
            x = layer(x, self.rope, None if caches is None else caches[i])  # (B, L, d_model)
        return self.lm_head(self.norm(x))  # (B, L, vocab_size)

    def load_hf_state_dict(self, state_dict: dict) -> LlamaDecoder:
        """Copy a Llama-family checkpoint's weights (``transformers``' ``LlamaForCausalLM``
        names: ``model.layers.0.self_attn.q_proj.weight``, ..., ``lm_head.weight``). With tied
        embeddings ``lm_head.weight`` may be absent. Every parameter must be found, with its shape."""
        mapped = {hf_to_course_name(k): v for k, v in state_dict.items() if not k.endswith("rotary_emb.inv_freq")}
        if self.config.tie_embeddings:
            mapped.pop("lm_head.weight", None)
        own = dict(self.named_parameters())  # tied weights appear once, as embed_tokens.weight
        missing = sorted(set(own) - set(mapped))
        unexpected = sorted(set(mapped) - set(own))
        if missing or unexpected:
            raise ValueError(f"state dict does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
        with torch.no_grad():
            for name, param in own.items():
                if mapped[name].shape != param.shape:
                    raise ValueError(f"{name}: checkpoint shape {tuple(mapped[name].shape)} != {tuple(param.shape)}")
                param.copy_(mapped[name])
        return self

    @classmethod
    def from_hf(cls, model) -> LlamaDecoder:
        """The course's decoder with the weights (and dtype) of a ``transformers`` LlamaForCausalLM."""
        dtype = next(model.parameters()).dtype
        ours = cls(DecoderConfig.from_hf(model.config)).to(dtype)
        return ours.load_hf_state_dict(model.state_dict()).eval()


def hf_to_course_name(name: str) -> str:
    """``model.layers.3.mlp.up_proj.weight`` -> ``layers.3.mlp.up_proj.weight`` (the course's
    modules carry Llama's names, under no ``model.`` prefix); ``lm_head.weight`` unchanged."""
    return name.removeprefix("model.")


@torch.no_grad()
def generate_greedy(
    model: LlamaDecoder, input_ids: torch.Tensor, max_new_tokens: int, *, use_cache: bool = True, eos_token_id=None
) -> torch.Tensor:
    """Greedy decoding: append the most likely next token ``max_new_tokens`` times.

    input_ids (B, L) -> (B, L + n). With ``use_cache`` the prompt runs once and each step feeds
    only the newest token, reading every earlier key/value from the layers' KV caches; without,
    each step recomputes the whole sequence. A sequence that produced ``eos_token_id`` keeps
    producing it (generation stops early once every sequence has)."""
    _validate.positive_int("max_new_tokens", max_new_tokens, allow_zero=True)
    caches = model.new_caches() if use_cache else None
    tokens, step_input = input_ids, input_ids
    done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    for _ in range(max_new_tokens):
        logits = model(step_input, caches)  # (B, L_step, vocab)
        next_token = logits[:, -1].argmax(dim=-1)  # (B,)
        if eos_token_id is not None:
            next_token = next_token.masked_fill(done, eos_token_id)
            done |= next_token == eos_token_id
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # (B, L + t)
        step_input = next_token[:, None] if use_cache else tokens
        if eos_token_id is not None and done.all():
            break
    return tokens
