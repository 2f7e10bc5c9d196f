"""The bad-input table: every wrong call raises ValueError/TypeError (never a bare error from
deep inside torch, never a silent wrong answer) with a message that names the argument, what was
expected and what came."""

import re

import pytest
import torch

import mha_course as mc


def raises(exc, *fragments):
    """pytest.raises(exc) whose message must contain every fragment (literally)."""
    return pytest.raises(exc, match="(?s)" + "".join(f"(?=.*{re.escape(f)})" for f in fragments))


x16 = torch.randn(2, 3, 16)


# --- indivisible head counts -------------------------------------------------------------------
def test_mha_d_model_not_divisible_by_num_heads():
    with raises(ValueError, "d_model=512 is not divisible by num_heads=7"):
        mc.MultiHeadAttention(512, 7)


def test_looped_mha_d_model_not_divisible_by_num_heads():
    with raises(ValueError, "d_model=10 is not divisible by num_heads=4"):
        mc.LoopedMultiHeadAttention(10, 4)


def test_gqa_default_head_dim_needs_divisible_d_model():
    with raises(ValueError, "d_model=10 is not divisible by num_heads=4"):
        mc.GroupedQueryAttention(10, 4, 2)


def test_split_heads_width_not_divisible():
    with raises(ValueError, "=10 is not divisible by num_heads=3"):
        mc.split_heads(torch.randn(2, 3, 10), 3)


def test_count_params_not_divisible():
    with raises(ValueError, "d_model=512 is not divisible by num_heads=7"):
        mc.count_attention_params(512, 7)


def test_gqa_num_heads_not_multiple_of_num_kv_heads():
    with raises(ValueError, "num_heads=8 is not a multiple of num_kv_heads=3"):
        mc.GroupedQueryAttention(64, 8, 3)


def test_count_params_num_heads_not_multiple_of_num_kv_heads():
    with raises(ValueError, "num_heads=8 is not a multiple of num_kv_heads=3"):
        mc.count_attention_params(64, 8, 3)


def test_attention_flops_num_heads_not_multiple_of_num_kv_heads():
    with raises(ValueError, "num_heads=8 is not a multiple of num_kv_heads=3"):
        mc.attention_flops(1, 4, 64, 8, 3)


# --- masks of the wrong shape or dtype ---------------------------------------------------------
def test_sdpa_mask_shape_does_not_broadcast():
    q, k = torch.randn(2, 8, 4, 6), torch.randn(2, 8, 5, 6)
    with raises(ValueError, "mask shape (3, 5) does not broadcast to scores (2, 8, 4, 5)"):
        mc.scaled_dot_product_attention(q, k, k, torch.ones(3, 5, dtype=torch.bool))


def test_sdpa_mask_with_more_dims_than_scores():
    q = torch.randn(4, 6)
    with raises(ValueError, "mask shape (2, 4, 4) does not broadcast to scores (4, 4)"):
        mc.scaled_dot_product_attention(q, q, q, torch.ones(2, 4, 4, dtype=torch.bool))


def test_sdpa_float_mask():
    q = torch.randn(2, 4, 6)
    with raises(TypeError, "mask must be bool, got torch.float32", "True where attention is allowed"):
        mc.scaled_dot_product_attention(q, q, q, torch.ones(4, 4))


def test_sdpa_mask_not_a_tensor():
    q = torch.randn(2, 4, 6)
    with raises(TypeError, "mask must be a bool torch.Tensor", "got list"):
        mc.scaled_dot_product_attention(q, q, q, [[True] * 4] * 4)


def test_mha_float_mask():
    with raises(TypeError, "mask must be bool, got torch.float32"):
        mc.MultiHeadAttention(16, 2)(x16, mask=torch.zeros(3, 3))


def test_mha_mask_wrong_shape():
    with raises(ValueError, "mask shape (2, 2, 3, 4) does not broadcast to scores (2, 2, 3, 3)"):
        mc.MultiHeadAttention(16, 2)(x16, mask=torch.ones(2, 2, 3, 4, dtype=torch.bool))


def test_mha_3d_mask():
    with raises(ValueError, "mask must be 2-D (Lq, Lk) or 4-D", "got shape (2, 3, 3)", "mask[:, None]"):
        mc.MultiHeadAttention(16, 2)(x16, mask=torch.ones(2, 3, 3, dtype=torch.bool))


def test_looped_mha_3d_mask():
    with raises(ValueError, "mask must be 2-D (Lq, Lk) or 4-D", "got shape (2, 3, 3)"):
        mc.LoopedMultiHeadAttention(16, 2)(x16, mask=torch.ones(2, 3, 3, dtype=torch.bool))


def test_gqa_float_mask():
    with raises(TypeError, "mask must be bool, got torch.float32"):
        mc.GroupedQueryAttention(16, 4, 2)(x16, mask=torch.zeros(3, 3))


def test_gqa_mask_wrong_batch():
    with raises(ValueError, "mask shape (3, 4, 3, 3) does not broadcast to scores (2, 4, 3, 3)"):
        mc.GroupedQueryAttention(16, 4, 2)(x16, mask=torch.ones(3, 4, 3, 3, dtype=torch.bool))


def test_gqa_3d_mask():
    with raises(ValueError, "mask must be 2-D (L, L_total) or 4-D", "got shape (2, 3, 3)"):
        mc.GroupedQueryAttention(16, 4, 2)(x16, mask=torch.ones(2, 3, 3, dtype=torch.bool))


def test_gqa_mask_not_a_tensor():
    with raises(TypeError, "mask must be a torch.Tensor, got list"):
        mc.GroupedQueryAttention(16, 4, 2)(x16, mask=[[True] * 3] * 3)


def test_gqa_mask_must_cover_the_cached_keys():
    m, cache = mc.GroupedQueryAttention(16, 4, 2), mc.KVCache()
    m(x16, cache=cache)  # 3 cached positions; the next token sees 4 keys
    with raises(ValueError, "mask shape (1, 3) does not broadcast to scores (2, 4, 1, 4)"):
        m(x16[:, :1], cache=cache, mask=torch.ones(1, 3, dtype=torch.bool))


# --- non-3-D inputs ----------------------------------------------------------------------------
def test_mha_query_not_3d():
    with raises(ValueError, "query must be 3-D, got 2-D with shape (3, 16)"):
        mc.MultiHeadAttention(16, 2)(torch.randn(3, 16))


def test_mha_key_not_3d():
    with raises(ValueError, "key must be 3-D, got 4-D with shape (1, 2, 5, 16)"):
        mc.MultiHeadAttention(16, 2)(x16, torch.randn(1, 2, 5, 16))


def test_gqa_input_not_3d():
    with raises(ValueError, "x must be 3-D, got 2-D with shape (3, 16)"):
        mc.GroupedQueryAttention(16, 2, 1)(torch.randn(3, 16))


def test_split_heads_input_not_3d():
    with raises(ValueError, "x must be 3-D, got 4-D with shape (2, 2, 3, 8)"):
        mc.split_heads(torch.randn(2, 2, 3, 8), 2)


def test_merge_heads_input_not_4d():
    with raises(ValueError, "x must be 4-D, got 3-D with shape (2, 3, 16)"):
        mc.merge_heads(x16)


def test_repeat_kv_input_not_4d():
    with raises(ValueError, "x must be 4-D, got 3-D with shape (2, 3, 16)"):
        mc.repeat_kv(x16, 2)


def test_sdpa_input_1d():
    with raises(ValueError, "q must be at least 2-D (..., L, d), got shape (6,)"):
        mc.scaled_dot_product_attention(torch.randn(6), torch.randn(4, 6), torch.randn(4, 6))


# --- mismatched widths and lengths -------------------------------------------------------------
def test_mha_query_width_not_d_model():
    with raises(ValueError, "query must have last dim 16", "got shape (2, 3, 15)"):
        mc.MultiHeadAttention(16, 2)(torch.randn(2, 3, 15))


def test_mha_key_width_not_kdim():
    with raises(ValueError, "key must have last dim 7", "got shape (2, 5, 16)"):
        mc.MultiHeadAttention(16, 2, kdim=7)(x16, torch.randn(2, 5, 16), torch.randn(2, 5, 16))


def test_mha_key_value_length_mismatch():
    with raises(ValueError, "key and value must share (B, Lk)", "(2, 5, 16) and (2, 6, 16)"):
        mc.MultiHeadAttention(16, 2)(x16, torch.randn(2, 5, 16), torch.randn(2, 6, 16))


def test_mha_batch_mismatch():
    with raises(ValueError, "query and key must share the batch size B, got 2 and 3"):
        mc.MultiHeadAttention(16, 2)(x16, torch.randn(3, 5, 16))


def test_gqa_input_width_not_d_model():
    with raises(ValueError, "x must have last dim d_model=16", "got shape (2, 3, 12)"):
        mc.GroupedQueryAttention(16, 2, 1)(torch.randn(2, 3, 12))


def test_sdpa_q_k_width_mismatch():
    with raises(ValueError, "q and k must have the same last dim d_k", "q (2, 3, 4)", "k (2, 5, 5)"):
        mc.scaled_dot_product_attention(torch.randn(2, 3, 4), torch.randn(2, 5, 5), torch.randn(2, 5, 4))


def test_sdpa_k_v_length_mismatch():
    with raises(ValueError, "k and v must have the same length Lk", "k (2, 5, 4)", "v (2, 6, 4)"):
        mc.scaled_dot_product_attention(torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 6, 4))


def test_sdpa_batch_dims_do_not_broadcast():
    with raises(ValueError, "batch dims of q (2, 3, 4), k (3, 5, 4), v (3, 5, 4) do not broadcast"):
        mc.scaled_dot_product_attention(torch.randn(2, 3, 4), torch.randn(3, 5, 4), torch.randn(3, 5, 4))


def test_sdpa_dtype_mismatch():
    q = torch.randn(3, 4)
    with raises(TypeError, "q, k, v must share a dtype", "torch.float64"):
        mc.scaled_dot_product_attention(q, q.double(), q)


def test_sdpa_integer_inputs():
    with raises(TypeError, "q must be a floating-point tensor, got torch.int64"):
        mc.scaled_dot_product_attention(torch.ones(3, 4, dtype=torch.long), torch.ones(3, 4), torch.ones(3, 4))


# --- impossible mask lengths -------------------------------------------------------------------
def test_causal_mask_k_len_shorter_than_q_len():
    with raises(ValueError, "k_len=3 < q_len=5", "k_len must be >= q_len"):
        mc.causal_mask(5, 3)


def test_padding_mask_length_above_max_len():
    with raises(ValueError, "lengths must lie in [0, max_len=5], got [2, 9]"):
        mc.padding_mask([2, 9], 5)


def test_padding_mask_negative_length_in_list():
    with raises(ValueError, "lengths[1] must be a non-negative int, got lengths[1]=-1"):
        mc.padding_mask([2, -1], 5)


def test_padding_mask_negative_length_in_tensor():
    with raises(ValueError, "lengths must lie in [0, max_len=5], got [2, -1]"):
        mc.padding_mask(torch.tensor([2, -1]), 5)


def test_padding_mask_float_lengths():
    with raises(TypeError, "lengths must hold integers, got torch.float32"):
        mc.padding_mask(torch.tensor([1.0, 2.0]), 4)


def test_padding_mask_lengths_not_1d():
    with raises(ValueError, "lengths must be 1-D, got 2-D with shape (1, 2)"):
        mc.padding_mask(torch.tensor([[1, 2]]), 4)


# --- negative and zero sizes -------------------------------------------------------------------
def test_d_model_zero():
    with raises(ValueError, "d_model must be a positive int, got d_model=0"):
        mc.MultiHeadAttention(0, 1)


def test_num_heads_negative():
    with raises(ValueError, "num_heads must be a positive int, got num_heads=-1"):
        mc.MultiHeadAttention(16, -1)


def test_num_kv_heads_zero():
    with raises(ValueError, "num_kv_heads must be a positive int, got num_kv_heads=0"):
        mc.GroupedQueryAttention(16, 4, 0)


def test_kv_cache_bytes_negative_seq_len():
    with raises(ValueError, "seq_len must be a non-negative int, got seq_len=-3"):
        mc.kv_cache_bytes(32, 8, 128, -3)


def test_attention_flops_negative_seq_len():
    with raises(ValueError, "seq_len must be a positive int, got seq_len=-3"):
        mc.attention_flops(1, -3, 64, 8)


def test_count_params_negative_head_dim():
    with raises(ValueError, "head_dim must be a positive int, got head_dim=-64"):
        mc.count_attention_params(512, 8, head_dim=-64)


def test_causal_mask_zero_length():
    with raises(ValueError, "q_len must be a positive int, got q_len=0"):
        mc.causal_mask(0)


def test_sliding_window_zero():
    with raises(ValueError, "window must be a positive int, got window=0"):
        mc.sliding_window_mask(4, 0)


def test_repeat_kv_zero_repeats():
    with raises(ValueError, "n_rep must be a positive int, got n_rep=0"):
        mc.repeat_kv(torch.randn(1, 2, 3, 4), 0)


def test_dropout_out_of_range():
    with raises(ValueError, "dropout must be in [0, 1), got dropout=1.5"):
        mc.MultiHeadAttention(16, 2, dropout=1.5)


# --- wrong types -------------------------------------------------------------------------------
def test_float_d_model():
    with raises(TypeError, "d_model must be an int, got float (512.0)"):
        mc.MultiHeadAttention(512.0, 8)


def test_float_num_heads_in_split_heads():
    with raises(TypeError, "num_heads must be an int, got float (2.0)"):
        mc.split_heads(x16, 2.0)


def test_bool_is_not_an_int():
    with raises(TypeError, "batch must be an int, got bool (True)"):
        mc.attention_flops(True, 3, 16, 2)


def test_float_lengths_in_list():
    with raises(TypeError, "lengths[0] must be an int, got float (1.5)"):
        mc.padding_mask([1.5], 4)


def test_list_instead_of_tensor_split_heads():
    with raises(TypeError, "x must be a torch.Tensor, got list"):
        mc.split_heads([[1.0] * 4], 2)


def test_list_instead_of_tensor_sdpa():
    with raises(TypeError, "q must be a torch.Tensor, got list"):
        mc.scaled_dot_product_attention([[1.0]], torch.ones(1, 1), torch.ones(1, 1))


def test_list_instead_of_tensor_mha():
    with raises(TypeError, "query must be a torch.Tensor, got list"):
        mc.MultiHeadAttention(4, 2)([[[1.0] * 4]])


def test_count_params_bias_not_bool():
    with raises(ValueError, "bias must be True, False or 'qkv', got 1"):
        mc.count_attention_params(16, 2, bias=1)


def test_gqa_cache_wrong_type():
    with raises(TypeError, "cache must be a KVCache or None, got dict"):
        mc.GroupedQueryAttention(16, 4, 2)(x16, cache={})


def test_from_torch_wrong_type():
    with raises(TypeError, "m must be a torch.nn.MultiheadAttention, got MultiHeadAttention"):
        mc.MultiHeadAttention.from_torch(mc.MultiHeadAttention(16, 2))


def test_from_mha_wrong_type():
    with raises(TypeError, "mha must be a mha_course.MultiHeadAttention, got MultiheadAttention"):
        mc.GroupedQueryAttention.from_mha(torch.nn.MultiheadAttention(16, 2), 1)


def test_from_mha_cross_attention():
    with raises(ValueError, "mha must be self-attention", "got kdim=8, vdim=16"):
        mc.GroupedQueryAttention.from_mha(mc.MultiHeadAttention(16, 2, kdim=8), 1)


# --- KV cache updates of the wrong shape -------------------------------------------------------
def filled_cache():
    cache = mc.KVCache()
    cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
    return cache


def test_kv_cache_k_v_lengths_differ():
    with raises(ValueError, "k and v must share (B, h_kv, L_new), got (1, 2, 3, 4) and (1, 2, 2, 4)"):
        mc.KVCache().update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 2, 4))


def test_kv_cache_new_k_head_dim_differs():
    with raises(ValueError, "new k (1, 2, 1, 5) does not match the cached (B, h_kv, L, d_head) (1, 2, 3, 4)"):
        filled_cache().update(torch.randn(1, 2, 1, 5), torch.randn(1, 2, 1, 4))


def test_kv_cache_new_v_head_dim_differs():
    with raises(ValueError, "new v (1, 2, 1, 5) does not match the cached (B, h_kv, L, d_head) (1, 2, 3, 4)"):
        filled_cache().update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 5))


def test_kv_cache_batch_differs():
    with raises(ValueError, "new k (2, 2, 1, 4) does not match the cached"):
        filled_cache().update(torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4))


def test_kv_cache_dtype_differs():
    with raises(TypeError, "new k is torch.float64", "the cache holds torch.float32"):
        filled_cache().update(torch.randn(1, 2, 1, 4, dtype=torch.float64), torch.randn(1, 2, 1, 4))


def test_kv_cache_not_4d():
    with raises(ValueError, "k must be 4-D, got 3-D with shape (2, 3, 4)"):
        mc.KVCache().update(torch.randn(2, 3, 4), torch.randn(2, 3, 4))


def test_gqa_cache_from_a_different_batch():
    m, cache = mc.GroupedQueryAttention(16, 4, 2), mc.KVCache()
    m(x16, cache=cache)
    with raises(ValueError, "new k (3, 2, 1, 4) does not match the cached (B, h_kv, L, d_head) (2, 2, 3, 4)"):
        m(torch.randn(3, 1, 16), cache=cache)


# --- dtype mismatches between inputs and weights (lead's addition) --------------------------------


def test_mha_input_dtype_must_match_weights():
    m = mc.MultiHeadAttention(8, 2)
    with pytest.raises(TypeError, match=r"query is torch.float64 but the module's weights are torch.float32"):
        m(torch.randn(2, 3, 8, dtype=torch.float64))


def test_gqa_input_dtype_must_match_weights():
    m = mc.GroupedQueryAttention(8, 2, 1)
    with pytest.raises(TypeError, match=r"x is torch.float64 but the module's weights are torch.float32"):
        m(torch.randn(2, 3, 8, dtype=torch.float64))


def test_mha_dropout_must_be_a_number():
    with pytest.raises(TypeError, match=r"dropout must be a float in \[0, 1\), got str"):
        mc.MultiHeadAttention(16, 2, dropout="a")


def test_attention_on_the_meta_device_with_a_mask():
    q = torch.empty(2, 3, 4, device="meta")
    mask = torch.ones(3, 3, dtype=torch.bool, device="meta")
    out, weights = mc.scaled_dot_product_attention(q, q, q, mask)
    assert out.shape == (2, 3, 4) and weights.shape == (2, 3, 3) and out.is_meta
