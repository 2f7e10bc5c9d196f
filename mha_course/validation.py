"""Argument checks shared by the package: each raises an error that names the argument,
what was expected and what came, so a learner never sees a bare shape error from inside torch."""

from __future__ import annotations

import torch


def positive_int(name: str, value, *, allow_zero: bool = False) -> int:
    """Return ``value`` as an int, or raise naming ``name`` if it is not a (positive) integer."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < 0 or (value == 0 and not allow_zero):
        need = "a non-negative int" if allow_zero else "a positive int"
        raise ValueError(f"{name} must be {need}, got {name}={value}")
    return value


def softcap(value):
    """``None`` or a positive finite float (a soft cap c bounds every score to (−c, c))."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"softcap must be None or a positive float, got {type(value).__name__} ({value!r})")
    if not (0 < value < float("inf")):
        raise ValueError(f"softcap must be a positive finite float (scores are capped to (−c, c)), got softcap={value}")
    return float(value)


def tensor(name: str, x, *, dims: int | tuple[int, ...] | None = None, floating: bool = False):
    """Check that ``x`` is a tensor (optionally of ``dims`` dimensions and floating dtype)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if dims is not None:
        allowed = (dims,) if isinstance(dims, int) else dims
        if x.dim() not in allowed:
            want = " or ".join(f"{d}-D" for d in allowed)
            raise ValueError(f"{name} must be {want}, got {x.dim()}-D with shape {tuple(x.shape)}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    return x


def divisible(d_model: int, num_heads: int) -> int:
    """Return ``d_model // num_heads``; raise if the heads do not split ``d_model`` evenly."""
    if d_model % num_heads:
        raise ValueError(
            f"d_model={d_model} is not divisible by num_heads={num_heads}; "
            f"choose num_heads among the divisors of d_model"
        )
    return d_model // num_heads


def bool_mask(mask, scores_shape: tuple[int, ...], *, name: str = "mask") -> torch.Tensor:
    """Check that ``mask`` is a bool tensor that broadcasts to ``scores_shape``."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a bool torch.Tensor (True = may attend), got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be bool, got {mask.dtype} — use True where attention is allowed")
    try:
        torch.broadcast_shapes(mask.shape, scores_shape)
        ok = mask.dim() <= len(scores_shape) and all(
            m in (1, s) for m, s in zip(reversed(mask.shape), reversed(scores_shape), strict=False)
        )
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{name} shape {tuple(mask.shape)} does not broadcast to scores {tuple(scores_shape)}")
    return mask


def same_dtype(name: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    """Check that input ``x`` has the dtype of the module's ``weight`` (autocast exempt)."""
    if x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(
            f"{name} is {x.dtype} but the module's weights are {weight.dtype}; "
            f"convert one of them (e.g. module.to({x.dtype}) or {name}.to({weight.dtype}))"
        )


def attention_inputs(q, k, v, mask=None) -> tuple[int, ...]:
    """Check q (..., Lq, d_k), k (..., Lk, d_k), v (..., Lk, d_v) and an optional bool mask;
    return the shape of the scores, (*batch, Lq, Lk)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        tensor(name, t, floating=True)
        if t.dim() < 2:
            raise ValueError(f"{name} must be at least 2-D (..., L, d), got shape {tuple(t.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same last dim d_k, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same length Lk (dim -2), got k {tuple(k.shape)} and v {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    try:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"batch dims of q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not broadcast"
        ) from None
    scores_shape = (*batch, q.shape[-2], k.shape[-2])
    if mask is not None:
        bool_mask(mask, scores_shape)
    return scores_shape


def kv_heads(num_heads: int, num_kv_heads: int | None) -> int:
    """num_kv_heads (default num_heads: MHA), checked to divide num_heads: each group of
    num_heads // num_kv_heads query heads shares one key/value head."""
    positive_int("num_heads", num_heads)
    h_kv = num_heads if num_kv_heads is None else positive_int("num_kv_heads", num_kv_heads)
    if num_heads % h_kv:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={h_kv}")
    return h_kv


def head_shape(d_model: int, num_heads: int, num_kv_heads: int | None, head_dim: int | None) -> tuple[int, int]:
    """(num_kv_heads, head width) of an attention layer, checked: head_dim defaults to
    d_model // num_heads (which must divide), num_kv_heads to num_heads."""
    positive_int("d_model", d_model)
    h_kv = kv_heads(num_heads, num_kv_heads)
    return h_kv, divisible(d_model, num_heads) if head_dim is None else positive_int("head_dim", head_dim)


def mha_inputs(module, query, key, value):
    """The inputs of a multi-head attention ``module`` (with d_model, kdim, vdim and out_proj):
    default key to query and value to key (self-attention), check all three; return (key, value)."""
    key = query if key is None else key
    value = key if value is None else value
    for name, t, width in (
        ("query", query, module.d_model),
        ("key", key, module.kdim),
        ("value", value, module.vdim),
    ):
        tensor(name, t, dims=3, floating=True)
        same_dtype(name, t, module.out_proj.weight)
        if t.shape[-1] != width:
            raise ValueError(f"{name} must have last dim {width}, got shape {tuple(t.shape)} (B, L, {width})")
    if key.shape[:2] != value.shape[:2]:
        raise ValueError(f"key and value must share (B, Lk), got {tuple(key.shape)} and {tuple(value.shape)}")
    if query.shape[0] != key.shape[0]:
        raise ValueError(f"query and key must share the batch size B, got {query.shape[0]} and {key.shape[0]}")
    return key, value


def mha_mask(mask, B, h, Lq, Lk):
    """A mask for multi-head attention: bool, 2-D (Lq, Lk) or 4-D broadcastable to (B, h, Lq, Lk)."""
    if mask is None:
        return None
    tensor("mask", mask)
    if mask.dim() not in (2, 4):
        raise ValueError(
            f"mask must be 2-D (Lq, Lk) or 4-D (B, h, Lq, Lk) with 1s to broadcast, got shape "
            f"{tuple(mask.shape)}; for a (B, Lq, Lk) mask use mask[:, None] to add the head dim"
        )
    return bool_mask(mask, (B, h, Lq, Lk))


def layer_input(x, weight: torch.Tensor, d_model: int, cache=None, cache_type: type | None = None) -> None:
    """The input ``x`` (B, L, d_model) of an attention layer whose weights are ``weight``, and its
    optional ``cache`` (an instance of ``cache_type``)."""
    tensor("x", x, dims=3, floating=True)
    same_dtype("x", x, weight)
    if x.shape[-1] != d_model:
        raise ValueError(f"x must have last dim d_model={d_model}, got shape {tuple(x.shape)}")
    if cache is not None and cache_type is not None and not isinstance(cache, cache_type):
        raise TypeError(f"cache must be a {cache_type.__name__} or None, got {type(cache).__name__}")
