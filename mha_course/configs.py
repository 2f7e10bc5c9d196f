"""Attention configurations of real models, as published: the numbers and their sources live in
``model_configs.json`` beside this file; :class:`ModelConfig` gives them names and the counts
that follow from them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from .accounting import count_attention_params, kv_cache_bytes


@dataclass(frozen=True)
class ModelConfig:
    """The attention shape of one published model.

    ``num_layers`` are transformer layers; ``attention_modules`` counts attention layers in the
    whole model (for encoder–decoder models: encoder self + decoder self + decoder cross).
    ``attention_bias``: True (all four projections), False, or "qkv" (Q/K/V only).
    ``position_scheme``: how the model knows where a token stands — "sinusoidal", "learned"
    (absolute, added to the input), "rope" (rotary, with base ``rope_theta``) or None (not recorded);
    ``position_source`` says where that comes from.
    ``context_length``: the context the model was published for; ``sliding_window``: the window
    of its local layers (None: every layer reads the whole context) and ``local_layers`` how many
    of its ``num_layers`` use it (the rest are global); ``context_source`` cites all three.
    """

    name: str
    num_layers: int
    d_model: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    attention_bias: bool | str
    source: str
    attention_modules: int | None = None
    kv_lora_rank: int | None = None  # multi-head latent attention (MLA): latent cached per token
    qk_rope_head_dim: int | None = None  # MLA: width of the decoupled RoPE key shared by all heads
    position_scheme: str | None = None
    rope_theta: float | None = None
    position_source: str = ""
    context_length: int | None = None
    sliding_window: int | None = None
    local_layers: int | None = None
    context_source: str = ""

    @property
    def layer_schedule(self) -> str:
        """The local:global layer schedule in words, e.g. "every layer windowed (4,096)"."""
        if self.sliding_window is None:
            return "every layer global"
        local, total = self.local_layers, self.num_layers
        if local == total:
            return f"every layer windowed ({self.sliding_window:,})"
        if local == total - local:
            return f"1:1 local ({self.sliding_window:,}) : global"
        return f"{local} local ({self.sliding_window:,}) : {total - local} global"

    @property
    def n_attention_modules(self) -> int:
        return self.num_layers if self.attention_modules is None else self.attention_modules

    @property
    def params_per_layer(self) -> int:
        """Parameters of one attention layer (see :func:`count_attention_params`)."""
        if self.kv_lora_rank is not None:
            raise ValueError(f"{self.name} uses latent attention: count_attention_params does not apply")
        return count_attention_params(
            self.d_model, self.num_heads, self.num_kv_heads, head_dim=self.head_dim, bias=self.attention_bias
        )

    @property
    def params_total(self) -> int:
        """Attention parameters in the whole model."""
        return self.params_per_layer * self.n_attention_modules

    def kv_cache_bytes(self, seq_len: int, *, batch: int = 1, bytes_per_element: int = 2) -> int:
        """KV-cache bytes for ``seq_len`` tokens (decoder self-attention layers); for MLA the
        latent and the RoPE key (:func:`mha_course.latent.mla_cache_bytes`)."""
        if self.kv_lora_rank is not None:
            from .latent import mla_cache_bytes

            return mla_cache_bytes(
                self.num_layers,
                self.kv_lora_rank,
                self.qk_rope_head_dim,
                seq_len,
                batch=batch,
                bytes_per_element=bytes_per_element,
            )
        return kv_cache_bytes(
            self.num_layers, self.num_kv_heads, self.head_dim, seq_len, batch=batch, bytes_per_element=bytes_per_element
        )

    def cached_tokens_per_layer(self, seq_len: int) -> list[int]:
        """Tokens each layer's cache holds at ``seq_len``: all of them in a global layer, at most
        ``sliding_window`` in a local one (a rolling cache; which layers are local does not change
        the total, so the local ones are listed first)."""
        if self.sliding_window is None:
            return [seq_len] * self.num_layers
        local = self.local_layers
        return [min(seq_len, self.sliding_window)] * local + [seq_len] * (self.num_layers - local)

    def windowed_cache_bytes(self, seq_len: int, *, batch: int = 1, bytes_per_element: int = 2) -> int:
        """Cache bytes at ``seq_len`` when the local layers keep only their window (rolling
        caches); equal to :meth:`kv_cache_bytes` for a model without windowed layers."""
        per_layer = self.kv_cache_bytes(1, batch=batch, bytes_per_element=bytes_per_element) // self.num_layers
        return per_layer * sum(self.cached_tokens_per_layer(seq_len))

    def beyond_context(self, seq_len: int) -> bool:
        """True when ``seq_len`` exceeds the context the model was published for."""
        return self.context_length is not None and seq_len > self.context_length


def _load(table: str) -> dict[str, ModelConfig]:
    """name -> ModelConfig for one table of ``model_configs.json`` (the published numbers, each with
    its source: data, not code)."""
    rows = json.loads(resources.files("mha_course").joinpath("model_configs.json").read_text(encoding="utf-8"))
    return {row["name"]: ModelConfig(**row) for row in rows[table]}


#: The models of notebook 03's table (and the KV-cache tables of 06 and 12), as published.
MODEL_CONFIGS: dict[str, ModelConfig] = _load("models")

#: Models with multi-head latent attention (MLA). num_kv_heads = num_heads and head_dim =
#: qk_nope_head_dim = v_head_dim as in their config.json; the cache holds kv_lora_rank +
#: qk_rope_head_dim numbers per token and layer. Kept apart from MODEL_CONFIGS, whose
#: parameter counts assume separate W_K and W_V.
LATENT_MODEL_CONFIGS: dict[str, ModelConfig] = _load("latent_models")

#: Models whose layers mix sliding windows and full attention, kept apart from MODEL_CONFIGS
#: (the table of notebook 03): Gemma 3 (5 local : 1 global) and gpt-oss (alternating 128-token
#: windows, with learned sinks).
WINDOWED_MODEL_CONFIGS: dict[str, ModelConfig] = _load("windowed_models")
