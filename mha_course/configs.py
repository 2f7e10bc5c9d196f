"""Attention configurations of real models, as published (source recorded per model)."""

from __future__ import annotations

from dataclasses import dataclass

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


_VASWANI = "Vaswani et al. 2017, 'Attention Is All You Need', Table 3 (N=6 encoder + 6 decoder layers)"
_BERT = "Devlin et al. 2019, 'BERT', §3 (L layers, H hidden, A heads)"
_GPT2 = "Radford et al. 2019, GPT-2 paper Table 2; Hugging Face config.json (n_layer, n_embd, n_head)"

_VASWANI_POS = "Vaswani et al. 2017, §3.5: sinusoidal positional encoding added to the embeddings"
_BERT_POS = "Devlin et al. 2019, §3: learned position embeddings; config.json max_position_embeddings 512"
_GPT2_POS = "Radford et al. 2019 (GPT-2, after GPT-1): learned position embeddings (wpe, n_positions 1024)"
_GPT3_POS = "Brown et al. 2020, §2.1: the GPT-2 architecture (learned position embeddings)"
_LLAMA2_POS = "Touvron et al. 2023, 'Llama 2', §2.2 (RoPE, as Llama 1); config.json rope_theta 10000.0"
_LLAMA3_POS = "'The Llama 3 Herd of Models' §3.2: RoPE base frequency increased to 500,000; config.json rope_theta"

MODEL_CONFIGS: dict[str, ModelConfig] = {
    c.name: c
    for c in [
        ModelConfig(
            "Transformer base",
            6,
            512,
            8,
            8,
            64,
            True,
            _VASWANI,
            attention_modules=18,
            position_scheme="sinusoidal",
            position_source=_VASWANI_POS,
        ),
        ModelConfig(
            "Transformer big",
            6,
            1024,
            16,
            16,
            64,
            True,
            _VASWANI,
            attention_modules=18,
            position_scheme="sinusoidal",
            position_source=_VASWANI_POS,
        ),
        ModelConfig(
            "BERT base", 12, 768, 12, 12, 64, True, _BERT, position_scheme="learned", position_source=_BERT_POS
        ),
        ModelConfig(
            "BERT large", 24, 1024, 16, 16, 64, True, _BERT, position_scheme="learned", position_source=_BERT_POS
        ),
        ModelConfig(
            "GPT-2 small", 12, 768, 12, 12, 64, True, _GPT2, position_scheme="learned", position_source=_GPT2_POS
        ),
        ModelConfig(
            "GPT-2 medium", 24, 1024, 16, 16, 64, True, _GPT2, position_scheme="learned", position_source=_GPT2_POS
        ),
        ModelConfig(
            "GPT-2 large", 36, 1280, 20, 20, 64, True, _GPT2, position_scheme="learned", position_source=_GPT2_POS
        ),
        ModelConfig(
            "GPT-2 XL", 48, 1600, 25, 25, 64, True, _GPT2, position_scheme="learned", position_source=_GPT2_POS
        ),
        ModelConfig(
            "GPT-3 175B",
            96,
            12288,
            96,
            96,
            128,
            True,
            "Brown et al. 2020, 'Language Models are Few-Shot Learners', Table 2.1",
            position_scheme="learned",
            position_source=_GPT3_POS,
        ),
        ModelConfig(
            "Llama 2 7B",
            32,
            4096,
            32,
            32,
            128,
            False,
            "Touvron et al. 2023, 'Llama 2', Table 1; meta-llama/Llama-2-7b-hf config.json",
            position_scheme="rope",
            rope_theta=10000.0,
            position_source=_LLAMA2_POS,
        ),
        ModelConfig(
            "Llama 2 70B",
            80,
            8192,
            64,
            8,
            128,
            False,
            "Touvron et al. 2023, 'Llama 2' (GQA for 34B/70B); meta-llama/Llama-2-70b-hf config.json",
            position_scheme="rope",
            rope_theta=10000.0,
            position_source=_LLAMA2_POS,
        ),
        ModelConfig(
            "Llama 3 8B",
            32,
            4096,
            32,
            8,
            128,
            False,
            "Meta 2024, Llama 3 model card / 'The Llama 3 Herd of Models' Table 3; config.json",
            position_scheme="rope",
            rope_theta=500000.0,
            position_source=_LLAMA3_POS,
        ),
        ModelConfig(
            "Llama 3 70B",
            80,
            8192,
            64,
            8,
            128,
            False,
            "Meta 2024, 'The Llama 3 Herd of Models' Table 3; meta-llama/Meta-Llama-3-70B config.json",
            position_scheme="rope",
            rope_theta=500000.0,
            position_source=_LLAMA3_POS,
        ),
        ModelConfig(
            "Mistral 7B",
            32,
            4096,
            32,
            8,
            128,
            False,
            "Jiang et al. 2023, 'Mistral 7B', Table 1; mistralai/Mistral-7B-v0.1 config.json",
            position_scheme="rope",
            rope_theta=10000.0,
            position_source="Jiang et al. 2023, 'Mistral 7B' (RoPE); Mistral-7B-v0.1 config.json rope_theta 10000.0",
        ),
        ModelConfig(
            "Qwen2.5-7B",
            28,
            3584,
            28,
            4,
            128,
            "qkv",
            "Qwen team 2024, Qwen2.5 technical report; Qwen/Qwen2.5-7B config.json (QKV bias, no O bias)",
            position_scheme="rope",
            rope_theta=1000000.0,
            position_source="Qwen/Qwen2.5-7B config.json: rope_theta 1000000.0",
        ),
        ModelConfig(
            "Gemma 2 9B",
            42,
            3584,
            16,
            8,
            256,
            False,
            "Gemma Team 2024, 'Gemma 2', Table 1; google/gemma-2-9b config.json (head_dim 256)",
            position_scheme="rope",
            rope_theta=10000.0,
            position_source="Gemma Team 2024, 'Gemma 2' (RoPE); google/gemma-2-9b config.json rope_theta 10000.0",
        ),
    ]
}


_DSV2 = "DeepSeek-AI 2024, 'DeepSeek-V2', arXiv:2405.04434, §2.1 and §3.1.2"

#: Models with multi-head latent attention (MLA). num_kv_heads = num_heads and head_dim =
#: qk_nope_head_dim = v_head_dim as in their config.json; the cache holds kv_lora_rank +
#: qk_rope_head_dim numbers per token and layer. Kept apart from MODEL_CONFIGS, whose
#: parameter counts assume separate W_K and W_V.
LATENT_MODEL_CONFIGS: dict[str, ModelConfig] = {
    c.name: c
    for c in [
        ModelConfig(
            "DeepSeek-V2-Lite",
            27,
            2048,
            16,
            16,
            128,
            False,
            _DSV2 + "; deepseek-ai/DeepSeek-V2-Lite config.json (kv_lora_rank 512, qk_rope_head_dim 64, "
            "q_lora_rank null)",
            kv_lora_rank=512,
            qk_rope_head_dim=64,
        ),
        ModelConfig(
            "DeepSeek-V2",
            60,
            5120,
            128,
            128,
            128,
            False,
            _DSV2 + " (60 layers, hidden 5120, 128 heads of 128, d_c 512, d_h^R 64); deepseek-ai/DeepSeek-V2 "
            "config.json",
            kv_lora_rank=512,
            qk_rope_head_dim=64,
        ),
        ModelConfig(
            "DeepSeek-V3",
            61,
            7168,
            128,
            128,
            128,
            False,
            "DeepSeek-AI 2024, 'DeepSeek-V3 Technical Report', arXiv:2412.19437, §4.2 (61 layers, hidden 7168, "
            "128 heads of 128, d_c 512, d_h^R 64); deepseek-ai/DeepSeek-V3 config.json",
            kv_lora_rank=512,
            qk_rope_head_dim=64,
        ),
    ]
}
