"""Counting what attention costs: parameters, FLOPs and KV-cache bytes.

Conventions: a multiply-add is 2 FLOPs; projections are ``nn.Linear`` layers;
head_dim defaults to d_model // num_heads; num_kv_heads defaults to num_heads (MHA).
"""

from __future__ import annotations

from . import validation


def count_attention_params(d_model, num_heads, num_kv_heads=None, *, head_dim=None, bias=True) -> int:
    """Parameters of one attention layer: W_Q (d·h·hd), W_K and W_V (d·h_kv·hd each), W_O (h·hd·d).

    ``bias``: True = biases on all four projections (original Transformer, BERT, GPT-2/3,
    ``nn.MultiheadAttention``), False = none (Llama, Mistral, Gemma), ``"qkv"`` = on Q, K, V
    only (Qwen2). For MHA with head_dim = d/h this is 4·d² (+ 4·d biases), whatever h is.
    """
    h_kv, hd = validation.head_shape(d_model, num_heads, num_kv_heads, head_dim)
    if not (isinstance(bias, bool) or (isinstance(bias, str) and bias == "qkv")):
        raise ValueError(f"bias must be True, False or 'qkv', got {bias!r}")
    q, kv, o = num_heads * hd, h_kv * hd, num_heads * hd  # output widths of W_Q, W_K (=W_V), input of W_O
    weights = d_model * q + 2 * d_model * kv + o * d_model
    biases = (q + 2 * kv if bias else 0) + (d_model if bias is True else 0)
    return weights + biases


def attention_flops(batch, seq_len, d_model, num_heads, num_kv_heads=None, *, head_dim=None) -> int:
    """Forward FLOPs of one self-attention layer (multiply-add = 2 FLOPs; softmax/bias ignored).

    Projections: 2·B·L·d·(2·h·hd + 2·h_kv·hd)  — 8·B·L·d² for MHA with hd = d/h.
    Scores Q Kᵀ and weights @ V: 2 · 2·B·h·L²·hd — 4·B·L²·d for MHA.
    """
    validation.positive_int("batch", batch)
    validation.positive_int("seq_len", seq_len)
    h_kv, hd = validation.head_shape(d_model, num_heads, num_kv_heads, head_dim)
    projections = 2 * batch * seq_len * d_model * (2 * num_heads * hd + 2 * h_kv * hd)
    scores = 2 * 2 * batch * num_heads * seq_len * seq_len * hd
    return projections + scores


def kv_cache_bytes(num_layers, num_kv_heads, head_dim, seq_len, *, batch=1, bytes_per_element=2) -> int:
    """Bytes of a KV cache: 2 (K and V) · layers · h_kv · head_dim · seq_len · batch · bytes.

    ``bytes_per_element``: 2 for fp16/bf16 (default), 4 for fp32, 1 for int8/fp8.
    """
    for name, value in (
        ("num_layers", num_layers),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
        ("seq_len", seq_len),
        ("batch", batch),
        ("bytes_per_element", bytes_per_element),
    ):
        validation.positive_int(name, value, allow_zero=name == "seq_len")
    return 2 * num_layers * num_kv_heads * head_dim * seq_len * batch * bytes_per_element


def tensor_bytes(*tensors) -> int:
    """Bytes the given tensors hold (None counts 0): what a cache really stores, measured."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)
