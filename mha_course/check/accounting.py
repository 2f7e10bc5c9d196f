"""Checkers for counting what attention costs: parameters and KV-cache bytes.

The cases are real model shapes (see ``mha_course.MODEL_CONFIGS``), and a failure shows the
inputs, the expected number and yours.
"""

from __future__ import annotations

from fractions import Fraction as _F

from .. import accounting as _accounting
from ..i18n import tr
from .framework import Case, CheckResult, mistakes, run_check

__all__ = ["count_attention_params", "kv_cache_bytes"]


def _params(d_model, num_heads, num_kv_heads=None, bias=True):
    return _accounting.count_attention_params(d_model, num_heads, num_kv_heads, bias=bias)


def _params_variant(d, h, h_kv=None, bias=True, *, how):
    h_kv = h if h_kv is None else h_kv
    hd = d // h
    q, kv = h * hd, h_kv * hd  # widths of Q and of K (= V)
    if how == "no bias":
        return d * q + 2 * d * kv + q * d
    if how == "no gqa":
        return _params(d, h, None, bias)
    if how == "no W_O":
        return d * q + 2 * d * kv + ((q + 2 * kv) if bias else 0)
    if how == "no W_O bias":
        return d * q + 2 * d * kv + q * d + ((q + 2 * kv) if bias else 0)
    if how == "h full heads":
        return h * _params(d, h, h_kv, bias)
    if how == "full-width biases":
        return d * q + 2 * d * kv + q * d + 4 * d
    if how == "bias always":
        return _params(d, h, h_kv, True)
    raise ValueError(how)


def _pv(how):
    return lambda d, h, h_kv=None, bias=True: _params_variant(d, h, h_kv, bias, how=how)


COUNT_ATTENTION_PARAMS_MISTAKES = mistakes(
    "count_attention_params",
    {
        "no bias": _pv("no bias"),
        "no gqa": _pv("no gqa"),
        "no W_O": _pv("no W_O"),
        "no W_O bias": _pv("no W_O bias"),
        "h full heads": _pv("h full heads"),
        "full-width biases": _pv("full-width biases"),
        "bias always": _pv("bias always"),
    },
)


def count_attention_params(fn) -> CheckResult:
    """Check ``fn(d_model, num_heads, num_kv_heads=None, bias=True) -> int``: the parameters of one
    attention layer — W_Q and W_O (d_model × d_model), W_K and W_V (d_model × num_kv_heads·d_head),
    plus a bias per output feature of each of the four projections when ``bias`` is True.
    ``num_kv_heads=None`` means num_kv_heads = num_heads; d_head = d_model // num_heads.
    """
    cases = [
        Case((768, 12), description="BERT base: 12 heads, biases"),
        Case((4096, 32, 8), {"bias": False}, description="Llama 3 8B: GQA 32/8, no biases"),
        Case((1600, 25), {"bias": True}, description="GPT-2 XL: 25 heads"),
        Case((8192, 64, 8), {"bias": False}, description="Llama 2 70B: GQA 64/8"),
        Case((512, 8, 2), {"bias": True}, description="toy GQA 8/2 with biases"),
    ]
    return run_check(
        "count_attention_params",
        fn,
        cases,
        _params,
        COUNT_ATTENTION_PARAMS_MISTAKES,
        arg_names=("d_model", "num_heads", "num_kv_heads"),
        output_label=tr("your count", "label"),
    )


def _kv(num_layers, num_kv_heads, head_dim, seq_len, batch=1, bytes_per_element=2):
    return _accounting.kv_cache_bytes(
        num_layers, num_kv_heads, head_dim, seq_len, batch=batch, bytes_per_element=bytes_per_element
    )


def _kvv(scale):
    """A wrong variant: the right answer times the fraction ``scale(args...)`` (an int when whole)."""

    def variant(num_layers, num_kv_heads, head_dim, seq_len, batch=1, bytes_per_element=2):
        args = (num_layers, num_kv_heads, head_dim, seq_len, batch, bytes_per_element)
        value = _kv(*args) * scale(*args)
        return int(value) if value.denominator == 1 else float(value)

    return variant


def _kv_query_heads(case: Case):
    """The answer with the model's query-head count in place of its KV heads."""
    num_layers, num_kv_heads, *rest = case.args
    return _kv(num_layers, case.info["num_heads"], *rest, **case.kwargs)


KV_CACHE_BYTES_MISTAKES = mistakes(
    "kv_cache_bytes",
    {
        "no factor 2": _kvv(lambda *a: _F(1, 2)),
        "query heads": _kv_query_heads,
        "no layers": _kvv(lambda n, *a: _F(1, n)),
        "no batch": _kvv(lambda *a: _F(1, a[4])),
        "elements": _kvv(lambda *a: _F(1, a[5])),
        "bytes fixed at 2": _kvv(lambda *a: _F(2, a[5])),
        "GiB": _kvv(lambda *a: _F(1, 2**30)),
        "GB": _kvv(lambda *a: _F(1, 10**9)),
    },
    on_case=("query heads",),
)


def kv_cache_bytes(fn) -> CheckResult:
    """Check ``fn(num_layers, num_kv_heads, head_dim, seq_len, batch=1, bytes_per_element=2) -> int``:
    the bytes a KV cache holds — keys AND values, for every layer, KV head, position and sequence."""
    cases = [
        Case((32, 8, 128, 8192), description="Llama 3 8B, 8k tokens, bf16", info={"num_heads": 32}),
        Case((32, 32, 128, 4096), {"batch": 4}, description="Llama 2 7B, batch 4", info={"num_heads": 32}),
        Case(
            (80, 8, 128, 4096),
            {"batch": 1, "bytes_per_element": 4},
            description="Llama 2 70B, fp32",
            info={"num_heads": 64},
        ),
        Case(
            (32, 8, 128, 32768),
            {"batch": 2, "bytes_per_element": 1},
            description="Mistral 7B, 32k tokens, int8",
            info={"num_heads": 32},
        ),
        Case((42, 8, 256, 1000), description="Gemma 2 9B, 1000 tokens", info={"num_heads": 16}),
    ]
    return run_check(
        "kv_cache_bytes",
        fn,
        cases,
        _kv,
        KV_CACHE_BYTES_MISTAKES,
        arg_names=("num_layers", "num_kv_heads", "head_dim", "seq_len"),
        output_label=tr("your answer", "label"),
    )
