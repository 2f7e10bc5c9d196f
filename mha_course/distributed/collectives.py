"""Collectives that autograd can run backwards, on the whole group or on a sub-group.

Design. Every collective of a split has an adjoint, and the adjoint is again a collective:

=======================  ============================  ===================================
operator                 forward                       backward (the adjoint)
=======================  ============================  ===================================
:func:`copy_to_ranks`    identity (x on every rank)    all-reduce of the gradient
:func:`sum_over_ranks`   all-reduce                    identity
:func:`gather_sequence`  all-gather along a dim        reduce-scatter along that dim
:func:`scatter_sequence` reduce-scatter along a dim    all-gather along that dim
:func:`all_to_all`       all-to-all (dim_out→dim_in)   all-to-all (dim_in→dim_out)
=======================  ============================  ===================================

The first two are Megatron-LM's f and g operators (Shoeybi et al. 2019, arXiv:1909.08053, §3,
Figure 3: "f is an identity operator in the forward pass and all reduce in the backward pass while
g is an all reduce in the forward pass and identity in the backward pass"); the next two are
Megatron's sequence parallelism (Korthikanti et al. 2022, arXiv:2205.05198, §4.2.2: g becomes an
all-gather forward / reduce-scatter backward and ḡ its mirror). Each is a
``torch.autograd.Function`` that sends through one :class:`GroupTraffic` in the forward and another
in the backward, so the bytes of the two directions are counted apart.

:class:`GroupTraffic` is :class:`~mha_course.distributed.Traffic` on a process group made with
``torch.distributed.new_group`` (``group=None``: every rank), with the same counting rules, plus a
``reduce_scatter`` written as the first half of the ring all-reduce (P-1 sends of one chunk, so
reduce-scatter + all-gather send exactly what one all-reduce sends). :class:`DifferentiableTraffic`
makes every ``all_to_all`` it does differentiable, so code that takes a ``traffic=`` argument
(:func:`~mha_course.distributed.ulysses_attention`) gets a backward without being rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .. import validation
from .traffic import Traffic


@dataclass
class GroupTraffic(Traffic):
    """:class:`Traffic` on the process group ``group`` (None = every rank): sizes and ranks are the
    group's own (``send_recv``'s ``to`` and ``frm`` are ranks within the group)."""

    group: object = None

    @property
    def size(self) -> int:
        return dist.get_world_size(self.group)

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    def _global(self, rank: int) -> int:
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        P, nbytes = self.size, x.numel() * x.element_size()
        self._count("all_reduce", 2 * (P - 1) * nbytes // P, payload=nbytes)
        dist.all_reduce(x, group=self.group)
        return x

    def send_recv(self, x: torch.Tensor, to: int, frm: int, *, tag: int = 0) -> tuple[torch.Tensor, list]:
        """As :meth:`Traffic.send_recv`; ``tag`` keeps two streams between the same ranks apart."""
        self._count("send", x.numel() * x.element_size())
        buffer = torch.empty_like(x)
        to, frm = self._global(to), self._global(frm)
        return buffer, [dist.isend(x.contiguous(), to, tag=tag), dist.irecv(buffer, frm, tag=tag)]

    def all_gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        P, nbytes = self.size, x.numel() * x.element_size()
        self._count("all_gather", (P - 1) * nbytes, payload=nbytes)
        gathered = [torch.empty_like(x) for _ in range(P)]
        dist.all_gather(gathered, x.contiguous(), group=self.group)
        return gathered

    def all_to_all(self, x: torch.Tensor, dim_out: int, dim_in: int) -> torch.Tensor:
        P, me = self.size, self.rank
        chunks = [c.contiguous() for c in x.chunk(P, dim=dim_out)]  # chunk j goes to rank j
        self._count("all_to_all", sum(c.numel() * c.element_size() for j, c in enumerate(chunks) if j != me))
        flat_in = torch.cat([c.flatten() for c in chunks])  # one flat exchange (gloo has no list all_to_all)
        flat_out = torch.empty_like(flat_in)
        dist.all_to_all_single(flat_out, flat_in, group=self.group)
        received = [f.view_as(c) for f, c in zip(flat_out.chunk(P), chunks, strict=True)]
        return torch.cat(received, dim=dim_in)

    def _exchange(self, x: torch.Tensor, to: int, frm: int) -> torch.Tensor:
        """Send ``x`` to ``to`` and receive a tensor like it from ``frm`` (not counted: the caller counts)."""
        buffer = torch.empty_like(x)
        for request in (dist.isend(x.contiguous(), self._global(to)), dist.irecv(buffer, self._global(frm))):
            request.wait()
        return buffer

    def reduce_scatter(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Cut ``x`` into P equal chunks along ``dim``; return chunk r (this rank's) summed over the
        ranks. The ring's reduce-scatter out of sends: in P-1 steps each rank passes one chunk's
        running sum to rank r+1 and adds its own share to the chunk arriving from r-1. It sends P-1
        chunks, (P-1)/P of the payload, counted under "reduce_scatter"."""
        P, me = self.size, self.rank
        if x.shape[dim] % P:
            raise ValueError(
                f"reduce_scatter cuts dim {dim} of size {x.shape[dim]} into {P} equal chunks: not a multiple of {P}"
            )
        chunks = [c.contiguous() for c in x.chunk(P, dim=dim)]
        self._count(
            "reduce_scatter", (P - 1) * chunks[0].numel() * x.element_size(), payload=x.numel() * x.element_size()
        )
        running = chunks[(me - 1) % P]  # step 0 passes on this rank's share of chunk r-1
        for step in range(P - 1):
            arrived = self._exchange(running, to=(me + 1) % P, frm=(me - 1) % P)
            running = arrived + chunks[(me - step - 2) % P]  # the running sum that arrived, plus my share
        return running  # chunk r, summed over the P ranks (after P-1 steps it has every share)


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, backward_traffic):
        ctx.backward_traffic = backward_traffic
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.backward_traffic.all_reduce(grad.clone(memory_format=torch.contiguous_format)), None


class _Sum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, traffic):
        return traffic.all_reduce(x.clone(memory_format=torch.contiguous_format))

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, traffic, backward_traffic):
        ctx.dim, ctx.backward_traffic = dim, backward_traffic
        return torch.cat(traffic.all_gather(x), dim=dim)

    @staticmethod
    def backward(ctx, grad):
        return ctx.backward_traffic.reduce_scatter(grad, ctx.dim), None, None, None


class _Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, traffic, backward_traffic):
        ctx.dim, ctx.backward_traffic = dim, backward_traffic
        return traffic.reduce_scatter(x, dim)

    @staticmethod
    def backward(ctx, grad):
        return torch.cat(ctx.backward_traffic.all_gather(grad), dim=ctx.dim), None, None, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim_out, dim_in, traffic, backward_traffic):
        ctx.dims, ctx.backward_traffic = (dim_out, dim_in), backward_traffic
        return traffic.all_to_all(x, dim_out=dim_out, dim_in=dim_in)

    @staticmethod
    def backward(ctx, grad):
        dim_out, dim_in = ctx.dims  # the transpose: what went out along dim_out comes back along it
        return ctx.backward_traffic.all_to_all(grad, dim_out=dim_in, dim_in=dim_out), None, None, None, None


def _check(name, traffic):
    if not isinstance(traffic, GroupTraffic):
        raise TypeError(f"{name} must be a GroupTraffic, got {type(traffic).__name__}")


def copy_to_ranks(x: torch.Tensor, backward_traffic: GroupTraffic) -> torch.Tensor:
    """Megatron's f: ``x`` unchanged; in the backward, the gradient all-reduced over the group
    (every rank's heads used x, so x's gradient is the sum of the ranks' shares)."""
    validation.tensor("x", x)
    _check("backward_traffic", backward_traffic)
    return _Copy.apply(x, backward_traffic)


def sum_over_ranks(x: torch.Tensor, traffic: GroupTraffic) -> torch.Tensor:
    """Megatron's g: the sum of ``x`` over the group (a new tensor); in the backward, identity
    (the sum's gradient with respect to each rank's term is the output's gradient)."""
    validation.tensor("x", x)
    _check("traffic", traffic)
    return _Sum.apply(x, traffic)


def gather_sequence(x: torch.Tensor, dim: int, traffic: GroupTraffic, backward_traffic: GroupTraffic) -> torch.Tensor:
    """The ranks' blocks of ``x`` concatenated along ``dim`` in rank order (all-gather); in the
    backward, each rank gets its block of the gradient summed over the ranks (reduce-scatter)."""
    validation.tensor("x", x)
    _check("traffic", traffic)
    _check("backward_traffic", backward_traffic)
    return _Gather.apply(x, dim, traffic, backward_traffic)


def scatter_sequence(x: torch.Tensor, dim: int, traffic: GroupTraffic, backward_traffic: GroupTraffic) -> torch.Tensor:
    """This rank's block along ``dim`` of the sum of ``x`` over the ranks (reduce-scatter); in
    the backward, the gradient's blocks gathered from every rank (all-gather)."""
    validation.tensor("x", x)
    _check("traffic", traffic)
    _check("backward_traffic", backward_traffic)
    return _Scatter.apply(x, dim, traffic, backward_traffic)


def all_to_all(x: torch.Tensor, dim_out: int, dim_in: int, traffic: GroupTraffic, backward_traffic: GroupTraffic):
    """:meth:`Traffic.all_to_all` with a backward: the all-to-all with the two dims swapped."""
    validation.tensor("x", x)
    _check("traffic", traffic)
    _check("backward_traffic", backward_traffic)
    return _AllToAll.apply(x, dim_out, dim_in, traffic, backward_traffic)


@dataclass
class DifferentiableTraffic(GroupTraffic):
    """A :class:`GroupTraffic` whose ``all_to_all`` is :func:`all_to_all`: autograd runs it
    backwards, counting the backward's bytes in ``self.backward``."""

    backward: GroupTraffic = field(default_factory=GroupTraffic)

    def __post_init__(self):
        self.backward.group = self.group

    def all_to_all(self, x: torch.Tensor, dim_out: int, dim_in: int) -> torch.Tensor:
        return _AllToAll.apply(x, dim_out, dim_in, _Plain(self), self.backward)


class _Plain:
    """The forward's sends of a :class:`DifferentiableTraffic`, without recursing into autograd."""

    def __init__(self, traffic: DifferentiableTraffic):
        self.traffic = traffic

    def all_to_all(self, x, dim_out, dim_in):
        return GroupTraffic.all_to_all(self.traffic, x, dim_out, dim_in)


_OPERATORS = ("copy_to_ranks", "sum_over_ranks", "gather_sequence", "scatter_sequence", "all_to_all")


@torch.enable_grad()  # a job runs the backward even where the caller turned gradients off
def collective_rank(name: str, x, grad_out, dim: int = 1, dim_in: int = 2):
    """A rank's job: one of the operators above on ``x[rank]``, then its backward from
    ``grad_out[rank]`` (both stacked over the ranks: x (P, ...), grad_out (P, ...) in the output's
    shape). ``dim`` is the gathered/scattered dim, or all-to-all's ``dim_out`` (with ``dim_in``).
    Returns ``(output, gradient of x[rank], forward bytes, backward bytes)``."""
    if name not in _OPERATORS:
        raise ValueError(f"name must be one of {_OPERATORS}, got name={name!r}")
    rank = dist.get_rank()
    forward, backward = GroupTraffic(), GroupTraffic()
    mine = x[rank].clone().requires_grad_()
    if name == "copy_to_ranks":
        out = copy_to_ranks(mine, backward)
    elif name == "sum_over_ranks":
        out = sum_over_ranks(mine, forward)
    elif name == "gather_sequence":
        out = gather_sequence(mine, dim, forward, backward)
    elif name == "scatter_sequence":
        out = scatter_sequence(mine, dim, forward, backward)
    else:
        out = all_to_all(mine, dim, dim_in, forward, backward)
    out.backward(grad_out[rank])
    return out.detach(), mine.grad, dict(forward.sent), dict(backward.sent)
