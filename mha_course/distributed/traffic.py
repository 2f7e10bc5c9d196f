"""Counting communication: :class:`Traffic` sends every collective of this package and counts
the bytes a rank puts on the wire; :func:`ring_all_reduce` is the ring algorithm out of sends."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .. import validation


@dataclass
class Traffic:
    """Bytes this rank sends to other ranks, per kind of collective; every collective below goes
    through one of these methods.

    * all_reduce counts the bytes a ring all-reduce sends per rank, 2(P-1)/P of the tensor's bytes
      (rounded down): a reduce-scatter and an all-gather, each passing P-1 of its P chunks on, as
      NCCL's and gloo's ring algorithms do (:func:`ring_all_reduce` is that algorithm written with
      sends, and sends exactly these bytes); ``payload`` keeps the tensor's own bytes;
    * send counts the tensor's bytes;
    * all_to_all counts the chunks addressed to other ranks (a rank's own chunk stays put);
    * all_gather counts what a ring all-gather sends per rank: the P-1 blocks it passes on, each of
      the tensor's size.
    """

    sent: dict = field(default_factory=dict)
    calls: dict = field(default_factory=dict)
    payload: dict = field(default_factory=dict)

    def _count(self, kind: str, nbytes: int, payload: int | None = None) -> None:
        self.sent[kind] = self.sent.get(kind, 0) + int(nbytes)
        self.calls[kind] = self.calls.get(kind, 0) + 1
        self.payload[kind] = self.payload.get(kind, 0) + int(nbytes if payload is None else payload)

    @property
    def total(self) -> int:
        return sum(self.sent.values())

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place; returns ``x``."""
        P, nbytes = dist.get_world_size(), x.numel() * x.element_size()
        self._count("all_reduce", 2 * (P - 1) * nbytes // P, payload=nbytes)  # what a ring sends per rank
        dist.all_reduce(x)
        return x

    def send_recv(self, x: torch.Tensor, to: int, frm: int) -> tuple[torch.Tensor, list]:
        """Start sending ``x`` to rank ``to`` and receiving a tensor like it from rank ``frm``;
        returns ``(buffer, requests)`` — wait on the requests before reading the buffer."""
        self._count("send", x.numel() * x.element_size())
        buffer = torch.empty_like(x)
        return buffer, [dist.isend(x.contiguous(), to), dist.irecv(buffer, frm)]

    def all_gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``x`` (all of the same shape), in rank order."""
        P, nbytes = dist.get_world_size(), x.numel() * x.element_size()
        self._count("all_gather", (P - 1) * nbytes, payload=nbytes)
        gathered = [torch.empty_like(x) for _ in range(P)]
        dist.all_gather(gathered, x.contiguous())
        return gathered

    def all_to_all(self, x: torch.Tensor, dim_out: int, dim_in: int) -> torch.Tensor:
        """Split ``x`` into P chunks along ``dim_out``, send chunk j to rank j, and concatenate the
        chunks received (in rank order) along ``dim_in``."""
        P = dist.get_world_size()
        chunks = [c.contiguous() for c in x.chunk(P, dim=dim_out)]  # chunk j goes to rank j
        self._count(
            "all_to_all", sum(c.numel() * c.element_size() for j, c in enumerate(chunks) if j != dist.get_rank())
        )
        received = [torch.empty_like(c) for c in chunks]
        if dist.get_backend() == "gloo":  # gloo has no list all_to_all: one flat exchange does the same
            flat_in = torch.cat([c.flatten() for c in chunks])  # (P·chunk,)
            flat_out = torch.empty_like(flat_in)
            dist.all_to_all_single(flat_out, flat_in)
            received = [f.view_as(c) for f, c in zip(flat_out.chunk(P), chunks, strict=True)]
        else:
            dist.all_to_all(received, chunks)
        return torch.cat(received, dim=dim_in)


def ring_all_reduce(x: torch.Tensor, traffic: Traffic | None = None) -> torch.Tensor:
    """The sum of ``x`` over the ranks, by the ring algorithm, out of point-to-point sends; returns
    a new tensor (``x`` unchanged), equal to ``dist.all_reduce``. Call on every rank.

    The flattened tensor is cut into P chunks. Reduce-scatter: in P-1 steps each rank sends one
    chunk's running sum to rank r+1 and adds the chunk arriving from r-1, after which rank r holds
    the full sum of chunk r+1. All-gather: in P-1 more steps the finished chunks travel the same way.
    Each rank sends 2(P-1) chunks, 2(P-1)/P of the payload (x's numel must be a multiple of P):
    what :meth:`Traffic.all_reduce` counts.
    """
    validation.tensor("x", x)
    rank, P = dist.get_rank(), dist.get_world_size()
    if x.numel() % P:
        raise ValueError(f"ring_all_reduce cuts x into {P} equal chunks: x has {x.numel()} numbers, not a multiple")
    traffic = Traffic() if traffic is None else traffic
    chunks = [c.clone() for c in x.flatten().chunk(P)]  # P chunks of numel/P
    to, frm = (rank + 1) % P, (rank - 1) % P
    for step in range(2 * (P - 1)):
        out_i, in_i = (rank - step) % P, (rank - step - 1) % P  # the chunk sent on, the chunk arriving
        chunks_in, requests = traffic.send_recv(chunks[out_i], to=to, frm=frm)
        for request in requests:
            request.wait()
        if step < P - 1:
            chunks[in_i] = chunks[in_i] + chunks_in  # reduce-scatter: add the running sum that arrived
        else:
            chunks[in_i] = chunks_in  # all-gather: a finished sum replaces the stale one
    return torch.cat(chunks).view_as(x)


def ring_all_reduce_rank(x):
    """A rank's job: ``x`` times (rank + 1), summed by :func:`ring_all_reduce` and by
    ``dist.all_reduce``; returns ``(max abs difference, bytes the ring's sends carried, bytes
    Traffic.all_reduce counts for the same tensor)``."""
    mine = x * (dist.get_rank() + 1)
    ring, counter = Traffic(), Traffic()
    by_sends = ring_all_reduce(mine, ring)
    reference = counter.all_reduce(mine.clone())
    return (by_sends - reference).abs().max().item(), ring.sent["send"], counter.sent["all_reduce"]
