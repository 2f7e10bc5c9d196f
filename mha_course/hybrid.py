"""Hybrid models: most layers linear attention (a state of fixed size), one in a few full
attention (a cache that grows with the context). What each kind of layer keeps per sequence:

    full attention, GQA:   2 · h_kv · head_dim numbers per token      (grows with L)
    full attention, MLA:   kv_lora_rank + qk_rope_head_dim per token  (grows with L)
    linear (Gated DeltaNet / KDA): the state h_v · d_k · d_v, plus the short convolution's last
        ``linear_conv_kernel`` inputs of its q, k, v channels (2 · h_k · d_k + h_v · d_v)  (fixed)

The published schedules and sizes are in ``model_configs.json`` (table "hybrid_models").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from . import validation


@dataclass(frozen=True)
class HybridModelConfig:
    """The attention layers of a published hybrid model. ``full_attention_layers``: the indices
    (from 0) of its full-attention layers, the others linear; the full layers are GQA
    (``full_num_kv_heads``, ``full_head_dim``) or MLA (``kv_lora_rank``, ``qk_rope_head_dim``)."""

    name: str
    num_layers: int
    full_attention_layers: tuple[int, ...]
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel: int
    source: str
    context_length: int | None = None
    full_num_kv_heads: int | None = None
    full_head_dim: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None

    @property
    def num_full_layers(self) -> int:
        return len(self.full_attention_layers)

    @property
    def num_linear_layers(self) -> int:
        return self.num_layers - self.num_full_layers

    @property
    def layer_schedule(self) -> str:
        """e.g. "36 linear : 12 full"."""
        return f"{self.num_linear_layers} linear : {self.num_full_layers} full"

    @property
    def full_elements_per_token(self) -> int:
        """Numbers one full-attention layer caches per token."""
        if self.kv_lora_rank is not None:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.full_num_kv_heads * self.full_head_dim

    @property
    def linear_state_elements(self) -> int:
        """Numbers one linear layer keeps, whatever the length: its delta-rule state and its
        convolution's window."""
        state = self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim
        conv_channels = 2 * self.linear_num_key_heads * self.linear_key_head_dim
        conv_channels += self.linear_num_value_heads * self.linear_value_head_dim
        return state + conv_channels * self.linear_conv_kernel

    def cache_bytes(
        self, seq_len: int, *, batch: int = 1, bytes_per_element: int = 2, state_bytes_per_element: int = 4
    ):
        """Bytes kept for ``batch`` sequences of ``seq_len`` tokens: the full layers' cache at
        ``bytes_per_element`` (2 = bf16) plus the linear layers' states at
        ``state_bytes_per_element`` (4: transformers keeps them in float32)."""
        validation.positive_int("seq_len", seq_len, allow_zero=True)
        validation.positive_int("batch", batch)
        full = self.num_full_layers * self.full_elements_per_token * seq_len * bytes_per_element
        linear = self.num_linear_layers * self.linear_state_elements * state_bytes_per_element
        return batch * (full + linear)


def _load() -> dict[str, HybridModelConfig]:
    rows = json.loads(resources.files("mha_course").joinpath("model_configs.json").read_text(encoding="utf-8"))
    return {
        row["name"]: HybridModelConfig(**{**row, "full_attention_layers": tuple(row["full_attention_layers"])})
        for row in rows["hybrid_models"]
    }


#: Qwen3-Next-80B-A3B and Kimi Linear 48B-A3B, as published (each row cites its source).
HYBRID_MODEL_CONFIGS: dict[str, HybridModelConfig] = _load()
