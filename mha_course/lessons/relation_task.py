"""A synthetic task that needs two different relations at every scored position (notebook 07).

The sequence is an address book followed by queries. Every token is a *record*: a key (a name,
``A`` … ``H``) and a value (a number, ``0`` … ``7``), written ``C5``::

    position   0    1    2    3    4    5  |  6    7    8    9    10   11
    record     C5   A2   H7   E0   B3   F6 |  E1   C4   F4   A0   H2   B7
               ----------- book ---------- | ------------ queries -------------

The book holds ``book_size`` records with distinct keys. The queries are records too: their keys
are the book's keys in a random order (so no two queries share a key), their values are random.
At each scored query position t the answer has two parts:

* **lookup** — the value the *book* pairs with the query's key (at t = 7, key C: the book says
  ``C5``, so 5). Where to look depends on the content: the one book record whose key matches.
* **offset** — the value of the record ``offset`` positions back (at t = 7 with offset 1: ``E1``,
  so 1). Where to look depends only on the position.

The target is the pair, encoded as one class ``lookup * num_values + offset_value``
(``num_values²`` classes); a prediction is right only if both parts are. The two parts are
independent and uniform, and sit at different positions (the lookup answer is in the book, the
offset answer is at t - offset, which is a query position for every scored t), so no single
position holds the answer: a model must read two places, chosen by two different rules.
The first ``offset`` queries are not scored — they only serve as "the record one back".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

KEY_NAMES = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class Batch(NamedTuple):
    """A batch of sequences and their answers (B sequences of L = book_size + num_queries records).

    keys, values: (B, L) long — the records. target: (B, S) long, S = num_queries - offset scored
    positions, class ``lookup * num_values + offset_value``. lookup_pos: (B, S) long — the book
    position that holds the lookup answer. offset_pos: (S,) long — the position offset back.
    """

    keys: torch.Tensor
    values: torch.Tensor
    target: torch.Tensor
    lookup_pos: torch.Tensor
    offset_pos: torch.Tensor


@dataclass(frozen=True)
class TwoRelationTask:
    """The address book with an offset: sizes and the generator, decoder and metric.

    ``num_keys`` key names, ``num_values`` values, a book of ``book_size`` records (distinct keys,
    ``book_size <= num_keys``), ``num_queries`` query records (distinct book keys, so
    ``num_queries <= book_size``), and the ``offset`` of the positional relation (``1 <= offset <
    num_queries``, so that the offset answer is always a query record, never a book record).
    """

    num_keys: int = 8
    num_values: int = 8
    book_size: int = 6
    num_queries: int = 6
    offset: int = 1

    def __post_init__(self):
        for name in ("num_keys", "num_values", "book_size", "num_queries", "offset"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.book_size > self.num_keys:
            raise ValueError(f"book_size={self.book_size} needs as many distinct keys, num_keys={self.num_keys}")
        if self.num_queries > self.book_size:
            raise ValueError(f"num_queries={self.num_queries} > book_size={self.book_size}: queries use distinct keys")
        if self.num_keys > len(KEY_NAMES):
            raise ValueError(f"num_keys={self.num_keys} > {len(KEY_NAMES)} (one letter per key)")
        if not self.offset < self.num_queries:
            raise ValueError(f"offset={self.offset} must be < num_queries={self.num_queries}")

    @property
    def seq_len(self) -> int:
        """L: the book, then the queries."""
        return self.book_size + self.num_queries

    @property
    def num_classes(self) -> int:
        """Number of target classes: one per (lookup value, offset value) pair."""
        return self.num_values**2

    @property
    def scored(self) -> torch.Tensor:
        """(S,) long: the positions whose answer is scored, the queries after the first ``offset``."""
        return torch.arange(self.book_size + self.offset, self.seq_len)

    def sample(self, batch_size: int, *, generator: torch.Generator) -> Batch:
        """Draw ``batch_size`` independent sequences with their answers (uses only ``generator``)."""
        B, M, Q, g = batch_size, self.book_size, self.num_queries, generator
        book_keys = torch.rand(B, self.num_keys, generator=g).argsort(dim=-1)[:, :M]  # (B, M) distinct keys
        book_values = torch.randint(self.num_values, (B, M), generator=g)
        asked = torch.rand(B, M, generator=g).argsort(dim=-1)[:, :Q]  # (B, Q): which book record each query asks
        query_values = torch.randint(self.num_values, (B, Q), generator=g)
        keys = torch.cat([book_keys, book_keys.gather(1, asked)], dim=1)  # (B, L)
        values = torch.cat([book_values, query_values], dim=1)  # (B, L)
        scored = self.scored  # (S,)
        lookup_pos = asked[:, self.offset :]  # (B, S): the book position holding each scored query's key
        offset_pos = scored - self.offset  # (S,)
        lookup = book_values.gather(1, lookup_pos)  # (B, S)
        target = lookup * self.num_values + values[:, offset_pos]
        return Batch(keys, values, target, lookup_pos, offset_pos)

    def decode(self, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Split classes into (lookup value, offset value), each of target's shape."""
        return target // self.num_values, target % self.num_values

    def accuracy(self, pred: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
        """Exact accuracy (both parts right) and the accuracy of each part, over all scored positions.

        ``pred``: predicted classes, or logits with the classes in the last dim; ``target``: classes.
        """
        if pred.shape == target.shape + (self.num_classes,) and pred.is_floating_point():
            pred = pred.argmax(dim=-1)
        if pred.shape != target.shape:
            raise ValueError(f"pred has shape {tuple(pred.shape)}, expected {tuple(target.shape)} (or logits)")
        (p_lookup, p_offset), (t_lookup, t_offset) = self.decode(pred), self.decode(target)
        return {
            "exact": (pred == target).float().mean().item(),
            "lookup": (p_lookup == t_lookup).float().mean().item(),
            "offset": (p_offset == t_offset).float().mean().item(),
        }

    def labels(self, keys: torch.Tensor, values: torch.Tensor) -> list[str]:
        """Names of the records of one sequence, e.g. ['C5', 'A2', ...] (keys, values: (L,))."""
        return [f"{KEY_NAMES[k]}{v}" for k, v in zip(keys.tolist(), values.tolist(), strict=True)]
