"""The KV cache: the keys and values of every position a decoder has seen, for one attention layer.

Two modes, one API (``update(k, v) -> (k_all, v_all)``, ``length``, ``keys``, ``values``,
``nbytes``, ``crop(length)``, ``reset()``):

* ``KVCache()`` — growing: every update concatenates the new positions onto the cached ones
  (``torch.cat``), which copies the whole cache at every step.
* ``KVCache(max_length=N)`` — preallocated, as production decoders do: on the first update it
  allocates (B, h_kv, N, d_head) buffers for K and V; every update writes the new positions at
  the current length (:func:`write_kv`) and returns views of the filled part, so a step moves
  only the new positions' bytes.
"""

from __future__ import annotations

import torch

from . import validation

__all__ = ["KVCache", "write_kv"]


def write_kv(k_cache, v_cache, k, v, length: int):
    """Write new keys/values into preallocated buffers and return the filled part.

    k_cache, v_cache: (B, h_kv, max_length, d_head) buffers whose positions [0, length) hold
    the cached keys/values. k, v: (B, h_kv, L_new, d_head), the new positions. The new K/V are
    written, in place, at positions [length, length + L_new); returns (k_all, v_all), each
    (B, h_kv, length + L_new, d_head) — views of the buffers, not copies.
    """
    end = length + k.shape[2]
    k_cache[:, :, length:end] = k  # in place: the buffer now holds positions [0, end)
    v_cache[:, :, length:end] = v
    return k_cache[:, :, :end], v_cache[:, :, :end]  # views: (B, h_kv, end, d_head)


class KVCache:
    """The keys and values of every position seen so far, for one attention layer.

    ``update(k, v)`` adds the new positions' (B, h_kv, L_new, d_head) keys/values after the
    cached ones and returns all of them, (B, h_kv, L, d_head) each.

    ``max_length=None`` (default): the cache grows by concatenation (a copy of the whole cache
    per update). ``max_length=N``: buffers for N positions are allocated on the first update
    (their B, h_kv, d_head, dtype and device come from it) and each update writes in place and
    returns views; an update past N positions raises ValueError.

    Inspect ``length`` (cached positions), ``keys`` / ``values`` (the filled part, or None when
    empty), ``nbytes`` (bytes of the cached K and V together) and ``reserved_nbytes`` (bytes
    allocated: the whole buffers when preallocated, else ``nbytes``).
    """

    def __init__(self, max_length: int | None = None):
        if max_length is not None:
            validation.positive_int("max_length", max_length)
        self.max_length = max_length
        self._k: torch.Tensor | None = None  # growing: the cache; preallocated: the whole buffer
        self._v: torch.Tensor | None = None
        self._length = 0

    @property
    def preallocated(self) -> bool:
        return self.max_length is not None

    def update(self, k, v):
        """Add k, v (B, h_kv, L_new, d_head) after the cached positions; return (k_all, v_all),
        each (B, h_kv, length, d_head) with the new length."""
        validation.tensor("k", k, dims=4)
        validation.tensor("v", v, dims=4)
        if k.shape[:3] != v.shape[:3]:
            raise ValueError(f"k and v must share (B, h_kv, L_new), got {tuple(k.shape)} and {tuple(v.shape)}")
        if self._k is not None:
            self._check_matches(k, v)
        if self.preallocated:
            return self._write(k, v)
        self._k = k if self._k is None else torch.cat([self._k, k], dim=2)  # (B, h_kv, L, d_head)
        self._v = v if self._v is None else torch.cat([self._v, v], dim=2)
        self._length = self._k.shape[2]
        return self._k, self._v

    def _write(self, k, v):
        end = self._length + k.shape[2]
        if end > self.max_length:
            raise ValueError(
                f"the cache holds at most max_length={self.max_length} positions; it has {self._length} "
                f"and the update adds {k.shape[2]}"
            )
        if self._k is None:
            B, h_kv, _, _ = k.shape
            self._k = k.new_empty(B, h_kv, self.max_length, k.shape[3])  # (B, h_kv, max_length, d_head)
            self._v = v.new_empty(B, h_kv, self.max_length, v.shape[3])
        k_all, v_all = write_kv(self._k, self._v, k, v, self._length)  # (B, h_kv, end, d_head) views
        self._length = end
        return k_all, v_all

    def _check_matches(self, k, v) -> None:
        for name, new, cached in (("k", k, self._k), ("v", v, self._v)):
            if new.shape[:2] != cached.shape[:2] or new.shape[3] != cached.shape[3]:
                held = (*cached.shape[:2], self._length, cached.shape[3])
                raise ValueError(f"new {name} {tuple(new.shape)} does not match the cached (B, h_kv, L, d_head) {held}")
            if new.dtype != cached.dtype or new.device != cached.device:
                raise TypeError(
                    f"new {name} is {new.dtype} on {new.device}, but the cache holds {cached.dtype} on {cached.device}"
                )

    @property
    def length(self) -> int:
        """Number of cached positions."""
        return self._length

    @property
    def keys(self) -> torch.Tensor | None:
        """The cached keys (B, h_kv, length, d_head), or None when the cache is empty."""
        return None if self._length == 0 else self._k[:, :, : self._length]

    @property
    def values(self) -> torch.Tensor | None:
        """The cached values (B, h_kv, length, d_head), or None when the cache is empty."""
        return None if self._length == 0 else self._v[:, :, : self._length]

    @property
    def nbytes(self) -> int:
        """Bytes of the cached keys and values together (the filled positions only)."""
        if self._length == 0:
            return 0
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values))

    @property
    def reserved_nbytes(self) -> int:
        """Bytes allocated for keys and values: the whole buffers when preallocated."""
        if self._k is None:
            return 0
        return self._k.numel() * self._k.element_size() + self._v.numel() * self._v.element_size()

    def crop(self, length: int) -> None:
        """Keep only the first ``length`` cached positions (a preallocated cache keeps its buffers,
        so the next update writes at ``length``)."""
        validation.positive_int("length", length, allow_zero=True)
        if length > self._length:
            raise ValueError(f"length={length} is more than the {self._length} cached positions")
        if length == 0:
            self.reset()
            return
        if not self.preallocated:
            self._k, self._v = self._k[:, :, :length], self._v[:, :, :length]
        self._length = length

    def reset(self) -> None:
        """Forget every cached position (and the buffers: the next update may bring a new batch)."""
        self._length = 0
        self._k = self._v = None

    def __repr__(self) -> str:
        shape = None if self._length == 0 else tuple(self.keys.shape)
        mode = "" if self.max_length is None else f"max_length={self.max_length}, "
        return f"KVCache({mode}length={self._length}, keys/values shape={shape}, nbytes={self.nbytes})"
