"""Boolean attention masks. Convention everywhere in the course: True = may attend."""

from __future__ import annotations

import torch

from . import validation


def causal_mask(q_len: int, k_len: int | None = None, *, device=None):
    """bool (q_len, k_len), True where query i may see key j.

    With ``k_len == q_len`` (the default) this is the lower triangle, diagonal included.
    With ``k_len > q_len`` the queries are the LAST q_len positions of the k_len keys
    (bottom-right aligned, as in KV-cache decoding): query i sees keys j <= i + k_len - q_len.
    Note: ``F.scaled_dot_product_attention(is_causal=True)`` aligns top-left instead.
    """
    validation.positive_int("q_len", q_len)
    k_len = q_len if k_len is None else validation.positive_int("k_len", k_len)
    if k_len < q_len:
        raise ValueError(
            f"k_len={k_len} < q_len={q_len}: with bottom-right alignment the first "
            f"{q_len - k_len} queries would see no key; k_len must be >= q_len"
        )
    ones = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    return ones.tril(diagonal=k_len - q_len)


def sliding_window_mask(q_len: int, window: int, k_len: int | None = None, *, device=None):
    """bool (q_len, k_len): causal (bottom-right aligned) and at most ``window`` keys per query,
    the query's own position included (query i sees keys i+off-window < j <= i+off)."""
    validation.positive_int("window", window)
    mask = causal_mask(q_len, k_len, device=device)
    k_len = mask.shape[1]
    return mask & ~torch.ones_like(mask).tril(diagonal=k_len - q_len - window)


def padding_mask(lengths, max_len: int):
    """bool (B, 1, 1, max_len), True = real token; broadcasts over heads and query positions.

    ``lengths``: a list/tuple of ints or a 1-D integer tensor, each in [0, max_len].
    """
    validation.positive_int("max_len", max_len)
    if isinstance(lengths, (list, tuple)):
        for i, n in enumerate(lengths):
            validation.positive_int(f"lengths[{i}]", n, allow_zero=True)
        lengths = torch.tensor(lengths, dtype=torch.long)
    validation.tensor("lengths", lengths, dims=1)
    if lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must hold integers, got {lengths.dtype}")
    if len(lengths) and not lengths.is_meta and (lengths.min() < 0 or lengths.max() > max_len):
        raise ValueError(f"lengths must lie in [0, max_len={max_len}], got {lengths.tolist()}")
    positions = torch.arange(max_len, device=lengths.device)
    return (positions[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, max_len)
