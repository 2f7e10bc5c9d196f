"""Sliding windows, layer schedules and contexts of the models in notebook 12's cache table,
against transformers' own configuration classes and a direct count."""

import pytest

from mha_course.configs import LATENT_MODEL_CONFIGS, MODEL_CONFIGS, WINDOWED_MODEL_CONFIGS

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    "name, config",
    [
        ("Gemma 2 9B", lambda: transformers.Gemma2Config(num_hidden_layers=42, sliding_window=4096)),
        ("Gemma 3 4B", lambda: transformers.Gemma3TextConfig(num_hidden_layers=34, sliding_window=1024)),
        ("gpt-oss-120b", lambda: transformers.GptOssConfig()),
    ],
)
def test_local_layers_follow_transformers_layer_types(name, config):
    cfg = {**MODEL_CONFIGS, **WINDOWED_MODEL_CONFIGS}[name]
    hf = config()
    assert hf.layer_types.count("sliding_attention") == cfg.local_layers
    assert hf.sliding_window == cfg.sliding_window
    assert len(hf.layer_types) == cfg.num_layers


def test_gpt_oss_and_minicpm3_shapes_are_transformers_defaults():
    oss, hf = WINDOWED_MODEL_CONFIGS["gpt-oss-120b"], transformers.GptOssConfig()
    assert (oss.num_layers, oss.d_model, oss.num_heads, oss.num_kv_heads, oss.head_dim) == (
        hf.num_hidden_layers,
        hf.hidden_size,
        hf.num_attention_heads,
        hf.num_key_value_heads,
        hf.head_dim,
    )
    assert oss.context_length == hf.max_position_embeddings
    mini, hf = LATENT_MODEL_CONFIGS["MiniCPM3-4B"], transformers.MiniCPM3Config()
    assert (mini.num_layers, mini.d_model, mini.num_heads, mini.kv_lora_rank, mini.qk_rope_head_dim) == (
        hf.num_hidden_layers,
        hf.hidden_size,
        hf.num_attention_heads,
        hf.kv_lora_rank,
        hf.qk_rope_head_dim,
    )
    assert mini.context_length == hf.max_position_embeddings


def test_windowed_cache_bytes_by_direct_count():
    mistral = MODEL_CONFIGS["Mistral 7B"]
    per_token_layer = 2 * 8 * 128 * 2  # K and V, 8 heads of 128, bf16
    assert mistral.windowed_cache_bytes(32768) == 32 * 4096 * per_token_layer == 2**29  # 0.5 GiB
    assert mistral.windowed_cache_bytes(1000) == mistral.kv_cache_bytes(1000)  # shorter than the window
    gemma = MODEL_CONFIGS["Gemma 2 9B"]
    assert gemma.windowed_cache_bytes(32768) == (21 * 4096 + 21 * 32768) * 2 * 8 * 256 * 2
    llama = MODEL_CONFIGS["Llama 2 7B"]
    assert llama.windowed_cache_bytes(32768) == llama.kv_cache_bytes(32768)
    assert llama.beyond_context(32768) and not llama.beyond_context(4096)
    assert MODEL_CONFIGS["GPT-2 small"].beyond_context(10**6) is False  # no context recorded
    assert mistral.layer_schedule == "every layer windowed (4,096)"
    assert gemma.layer_schedule == "1:1 local (4,096) : global"
    assert WINDOWED_MODEL_CONFIGS["Gemma 3 4B"].layer_schedule == "29 local (1,024) : 5 global"
