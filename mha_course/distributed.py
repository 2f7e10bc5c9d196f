"""Attention across devices: real processes, PyTorch's gloo engine, three ways to split the work.

* **Tensor parallelism** (Megatron-LM): each rank holds whole heads — its rows of W_Q, W_K, W_V
  (column-parallel) and the matching columns of W_O (row-parallel); every rank attends with its
  heads only and one all-reduce sums the ranks' W_O outputs. :func:`heads_of_rank`,
  :class:`TensorParallelAttention`.
* **Ring attention** (sequence/context parallelism): each rank holds a block of positions; K/V
  blocks travel around a ring of point-to-point sends and each rank folds the block that arrives
  into its queries' running softmax with :func:`mha_course.tiled.online_softmax_update`.
  :func:`ring_attention`, :func:`shard_sequence`.
* **DeepSpeed-Ulysses**: an all-to-all turns sequence-sharded Q, K, V into head-sharded ones over
  the whole sequence, each rank attends with its heads, and a second all-to-all turns the output
  back. :func:`ulysses_attention`.

:class:`Ranks` starts ``world_size`` processes on this machine (gloo backend, 127.0.0.1 only),
keeps their process group for several jobs and returns each rank's result; :func:`launch` is one
job. Under ``torchrun`` both run the function in the current process on its own rank. A rank's
function is a plain, importable function (a started process imports it by name); it finds its
place with ``torch.distributed.get_rank()`` / ``get_world_size()``.

Every collective here goes through :class:`Traffic`, which counts the bytes a rank sends to
other ranks, so the counts can be set against the formulas in :func:`communication_bytes`.

References: Shoeybi et al., "Megatron-LM" (2019, arXiv:1909.08053) §3; Liu, Zaharia & Abbeel,
"Ring Attention with Blockwise Transformers" (2023, arXiv:2310.01889); Jacobs et al.,
"DeepSpeed Ulysses" (2023, arXiv:2309.14509); Brandon et al., "Striped Attention" (2023,
arXiv:2311.09431) and Llama 3's context parallelism (Dubey et al. 2024, arXiv:2407.21783 §3.3.2)
for load-balancing the causal ring.
"""

from __future__ import annotations

import atexit
import datetime
import math
import multiprocessing
import os
import pickle
import queue
import time
import traceback
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from . import validation
from .attention import scaled_dot_product_attention
from .gqa import GroupedQueryAttention, repeat_kv
from .heads import merge_heads
from .multihead import MultiHeadAttention
from .tiled import NEG_INF, online_softmax_update

__all__ = [
    "MAX_WORLD_SIZE",
    "Ranks",
    "launch",
    "Traffic",
    "heads_of_rank",
    "TensorParallelAttention",
    "tensor_parallel_rank",
    "dtensor_rank",
    "shard_sequence",
    "unshard_sequence",
    "sequence_positions",
    "ring_attention",
    "ring_rank",
    "ulysses_attention",
    "ulysses_rank",
    "communication_bytes",
]

#: the most ranks :class:`Ranks` starts on one machine (each is a full Python process with torch)
MAX_WORLD_SIZE = 8
_LAYOUTS = ("contiguous", "balanced")
#: what the forkserver imports once, before it forks the ranks (torch's shape checks import sympy
#: lazily; DTensor's tensor parallelism is the reference :func:`dtensor_rank` uses)
_PRELOAD = [
    "torch",
    "torch.fx.experimental.symbolic_shapes",
    "torch.distributed.tensor.parallel",
    "mha_course.distributed",
]


# ---------------------------------------------------------------------------------------------
# starting ranks


def _leave_torchrun_group() -> None:
    """At exit, the ranks torchrun started leave the group they joined together: each waits for the
    others, then closes its connections. A rank that exits while a peer still holds a connection to
    it can make that peer abort."""
    if dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def _loopback_interface() -> str | None:
    """The name of the loopback interface ('lo' on Linux, 'lo0' on macOS), for gloo's sockets."""
    import socket

    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    return next((n for n in names if n in ("lo", "lo0")), next((n for n in names if n.startswith("lo")), None))


def _worker(rank, world_size, port, timeout_s, inbox, outbox):
    """One rank: join the process group through the parent's store, then run jobs until told to stop."""
    try:
        torch.set_num_threads(1)  # the ranks share the machine's cores
        interface = _loopback_interface()
        if interface is not None:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)  # gloo talks over 127.0.0.1 only
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
        dist.barrier()  # every pair of ranks connected before the first job
    except Exception:  # noqa: BLE001 - reported to the parent, which raises
        outbox.put((rank, "error", traceback.format_exc()))
        return
    outbox.put((rank, "ready", None))
    while True:
        job = inbox.get()
        if job is None:
            break
        try:
            fn, args, kwargs = pickle.loads(job)  # this rank's own copy of every argument
            outbox.put((rank, "ok", pickle.dumps(fn(*args, **kwargs))))
        except Exception:  # noqa: BLE001
            outbox.put((rank, "error", traceback.format_exc()))
    dist.destroy_process_group()


class Ranks:
    """``world_size`` ranks in separate processes on this machine, joined in one gloo process group.

    ``with Ranks(4) as ranks: results = ranks.run(fn, *args)`` runs ``fn(*args)`` on every rank
    and returns ``[result of rank 0, result of rank 1, ...]``; the processes and their group stay up
    for the next ``run``, so the start-up cost (a Python process importing torch per rank) is paid
    once. ``fn`` and its arguments travel by pickling: ``fn`` must be importable by name (defined in
    a module, not in a notebook cell).

    Args:
        world_size: number of ranks, 1 to :data:`MAX_WORLD_SIZE`.
        timeout: seconds any collective, and any ``run``, may take; a rank that does not answer in
            time makes ``run`` raise ``TimeoutError`` (and the ranks are stopped) instead of hanging.
        start_method: how the processes start: "forkserver" (the default where it exists, Linux and
            macOS: one clean server process imports torch and the course once, then forks each rank
            from that single-threaded state — as safe as "spawn" and far quicker), "spawn" (every rank
            imports torch afresh; the only method on Windows) or "fork".

    Under ``torchrun`` (``RANK`` and ``WORLD_SIZE`` set) no process is started: ``run`` calls ``fn``
    on this process's rank (initialising the gloo group if needed) and gathers every rank's result.
    """

    def __init__(self, world_size: int, *, timeout: float = 60.0, start_method: str | None = None):
        validation.positive_int("world_size", world_size)
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got timeout={timeout!r}")
        self.world_size, self.timeout = world_size, float(timeout)
        self._procs, self._inboxes, self._outbox, self._store = [], [], None, None
        self.torchrun = _under_torchrun()
        if self.torchrun:
            running = int(os.environ["WORLD_SIZE"])
            if world_size != running:
                raise ValueError(
                    f"world_size={world_size}, but torchrun started {running} processes: "
                    f"run with --nproc-per-node={world_size} or ask for world_size={running}"
                )
            if not dist.is_initialized():
                dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=self.timeout))
                atexit.register(_leave_torchrun_group)
            return
        if world_size > MAX_WORLD_SIZE:
            raise ValueError(
                f"world_size={world_size} is more ranks than this launcher starts on one machine "
                f"(at most {MAX_WORLD_SIZE}, each a Python process with its own copy of torch); "
                f"use torchrun for more"
            )
        methods = multiprocessing.get_all_start_methods()
        start_method = start_method or ("forkserver" if "forkserver" in methods else "spawn")
        if start_method not in methods:
            raise ValueError(
                f"start_method={start_method!r} is not available here; "
                f"choose one of {multiprocessing.get_all_start_methods()}"
            )
        if not dist.is_available() or not dist.is_gloo_available():
            raise RuntimeError("this PyTorch build has no torch.distributed gloo backend, which the ranks need")
        self._start(start_method)

    def _start(self, start_method):
        ctx = torch.multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            ctx.set_forkserver_preload(_PRELOAD)  # imported once, in the server
        timeout = datetime.timedelta(seconds=self.timeout)
        # the parent holds the rendezvous store on a free loopback port (port 0: the OS picks one)
        self._store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, timeout=timeout, wait_for_workers=False)
        self._outbox = ctx.Queue()
        for rank in range(self.world_size):
            inbox = ctx.Queue()
            proc = ctx.Process(
                target=_worker,
                args=(rank, self.world_size, self._store.port, self.timeout, inbox, self._outbox),
                daemon=True,
            )
            proc.start()
            self._procs.append(proc)
            self._inboxes.append(inbox)
        self._collect("ready", "start")

    def _collect(self, expected: str, what: str) -> list:
        """Wait for one message per rank; stop the ranks and raise on an error, a death or the timeout."""
        results, deadline = {}, time.monotonic() + self.timeout
        while len(results) < self.world_size:
            try:
                rank, status, payload = self._outbox.get(timeout=0.05)
            except queue.Empty:
                dead = [r for r, p in enumerate(self._procs) if not p.is_alive() and r not in results]
                late = time.monotonic() > deadline
                if dead or late:
                    self.close(wait=False)
                    missing = sorted(set(range(self.world_size)) - set(results))
                    if dead:
                        raise RuntimeError(f"rank(s) {dead} exited during {what} without an answer") from None
                    raise TimeoutError(
                        f"rank(s) {missing} did not answer within timeout={self.timeout:g} s during {what} "
                        f"(a rank waiting for a message no one sends hangs: check that every rank calls "
                        f"the same collectives); the ranks were stopped"
                    ) from None
                continue
            if status == "error":
                self.close(wait=False)  # the others may wait in a collective for the failed rank
                raise RuntimeError(f"rank {rank} raised during {what}:\n{payload}")
            results[rank] = payload
        return [results[r] for r in range(self.world_size)]

    def run(self, fn, *args, **kwargs) -> list:
        """Run ``fn(*args, **kwargs)`` on every rank; return the results in rank order."""
        if not callable(fn):
            raise TypeError(f"fn must be a function, got {type(fn).__name__}")
        if self.torchrun:
            result = fn(*args, **kwargs)
            gathered = [None] * self.world_size
            dist.all_gather_object(gathered, result)
            return gathered
        if not self._procs:
            raise RuntimeError("these ranks were stopped (closed, or a rank failed): start new Ranks")
        if "<" in getattr(fn, "__qualname__", "<") or getattr(fn, "__module__", "__main__") == "__main__":
            raise TypeError(
                f"fn={getattr(fn, '__qualname__', fn)!r} is not importable by name, so a started process "
                f"cannot find it: define it in a module (e.g. mha_course.distributed.ring_rank)"
            )
        # plain pickle (bytes), not torch's shared-memory tensors: each rank gets its own copy, as a
        # device would, and no rank can write into another's inputs
        job = pickle.dumps((fn, args, kwargs))
        for inbox in self._inboxes:
            inbox.put(job)
        return [pickle.loads(r) for r in self._collect("ok", f"{getattr(fn, '__name__', 'fn')}")]

    def close(self, *, wait: bool = True) -> None:
        """Stop the ranks: ask them to leave (and wait up to 5 s) if ``wait``, then by force."""
        if self.torchrun or not self._procs:
            return
        for inbox, proc in zip(self._inboxes, self._procs, strict=True):
            if wait and proc.is_alive():
                try:
                    inbox.put(None)
                except (OSError, ValueError):
                    pass
        for proc in self._procs:
            proc.join(timeout=5 if wait else 0)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        self._procs, self._inboxes = [], []
        self._store = None

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def launch(fn, world_size: int, *args, timeout: float = 60.0, start_method: str | None = None, **kwargs) -> list:
    """Start ``world_size`` ranks, run ``fn(*args, **kwargs)`` on each, stop them; return the
    results in rank order. One job of :class:`Ranks` (use ``Ranks`` to run several on one start)."""
    with Ranks(world_size, timeout=timeout, start_method=start_method) as ranks:
        return ranks.run(fn, *args, **kwargs)


# ---------------------------------------------------------------------------------------------
# counting communication


@dataclass
class Traffic:
    """Bytes this rank sends to other ranks, per kind of collective; every collective below goes
    through one of these methods.

    * all_reduce counts the bytes a ring all-reduce sends per rank, 2(P-1)/P of the tensor's bytes
      (rounded down): a reduce-scatter and an all-gather, each passing P-1 of its P chunks on, as
      NCCL's and gloo's ring algorithms do (:func:`ring_all_reduce` is that algorithm written with
      sends, and sends exactly these bytes); ``payload`` keeps the tensor's own bytes;
    * send counts the tensor's bytes;
    * all_to_all counts the chunks addressed to other ranks (a rank's own chunk stays put).
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


# ---------------------------------------------------------------------------------------------
# tensor parallelism: heads are the unit


def heads_of_rank(rank: int, world_size: int, num_heads: int, num_kv_heads: int | None = None):
    """Which heads rank ``rank`` of ``world_size`` holds under tensor parallelism.

    Query heads are dealt out in contiguous blocks of ``num_heads // world_size`` (rank r holds
    heads r·h/P ... (r+1)·h/P - 1, i.e. rows r·h/P·d_head onward of W_Q). A rank holds the K/V
    heads its query heads read (query head i reads KV head i // (h / h_kv)): split, h_kv/P per rank,
    when h_kv is a multiple of P; replicated when P is a multiple of h_kv (each KV head on P/h_kv
    ranks). Any other h_kv is a ValueError, since a KV head would straddle two ranks (P = 2, h = 12,
    h_kv = 3 would give ranks KV heads [0, 1] and [1, 2]); vLLM's attention layers assert the same
    (``vllm/model_executor/models/llama.py``, ``LlamaAttention``).
    Returns ``(q_heads, kv_heads)``, two int64 tensors of head indices, ascending.
    """
    validation.positive_int("world_size", world_size)
    validation.positive_int("num_heads", num_heads)
    num_kv_heads = validation.kv_heads(num_heads, num_kv_heads)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, world_size={world_size}), got rank={rank!r}")
    if num_heads % world_size:
        raise ValueError(
            f"num_heads={num_heads} is not divisible by world_size={world_size}: tensor parallelism gives "
            f"every rank whole heads; choose a world size that divides {num_heads}"
        )
    if num_kv_heads % world_size and world_size % num_kv_heads:
        raise ValueError(
            f"num_kv_heads={num_kv_heads} is neither a multiple nor a divisor of world_size={world_size}: "
            f"a KV head would be shared by ranks that also hold other KV heads; choose a world size that "
            f"divides {num_kv_heads} or is a multiple of it"
        )
    per_rank = num_heads // world_size
    q_heads = torch.arange(rank * per_rank, (rank + 1) * per_rank)  # (h/P,)
    kv_heads = torch.unique(q_heads // (num_heads // num_kv_heads))  # the groups those heads read
    return q_heads, kv_heads


def _rows(heads: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Indices of the rows (features) of the given heads: head i owns [i·head_dim, (i+1)·head_dim)."""
    return (heads[:, None] * head_dim + torch.arange(head_dim)).flatten()  # (len(heads)·head_dim,)


class TensorParallelAttention(nn.Module):
    """One rank's share of a self-attention layer split by heads (Megatron-LM's attention).

    ``TensorParallelAttention(module, rank, world_size)`` keeps, of a :class:`MultiHeadAttention`
    or :class:`GroupedQueryAttention` ``module``, the rows of W_Q, W_K, W_V (and their biases) for
    this rank's heads (:func:`heads_of_rank`) and the matching columns of W_O; W_O's bias is kept
    once, added after the sum.

    ``forward(x, *, mask=None, is_causal=False)``: x (B, L, d_model), the full input, on every rank;
    mask bool (L, L) or (B, 1, L, L), True = may attend. Each rank attends with its heads only and
    projects with its columns of W_O to a partial (B, L, d_model); one all-reduce sums the partials.
    Returns (B, L, d_model), the same on every rank and equal to ``module(x)``. ``self.traffic``
    counts the bytes (one all-reduce of B·L·d_model elements per call).
    """

    def __init__(self, module, rank: int, world_size: int):
        super().__init__()
        if isinstance(module, MultiHeadAttention):
            if module.kdim != module.d_model or module.vdim != module.d_model:
                raise ValueError("TensorParallelAttention splits self-attention: the module has kdim/vdim != d_model")
            h, h_kv, self.head_dim, o = module.num_heads, module.num_heads, module.d_head, module.out_proj
        elif isinstance(module, GroupedQueryAttention):
            h, h_kv, self.head_dim, o = module.num_heads, module.num_kv_heads, module.head_dim, module.o_proj
        else:
            raise TypeError(
                f"module must be a MultiHeadAttention or GroupedQueryAttention, got {type(module).__name__}"
            )
        q_heads, kv_heads = heads_of_rank(rank, world_size, h, h_kv)
        self.rank, self.world_size, self.num_heads, self.num_kv_heads = rank, world_size, h, h_kv
        self.q_heads, self.kv_heads = q_heads, kv_heads
        #: for each local query head, the index of its KV head among this rank's KV heads
        self.kv_index = q_heads // (h // h_kv) - kv_heads[0]  # (h/P,)
        q_rows, kv_rows = _rows(q_heads, self.head_dim), _rows(kv_heads, self.head_dim)
        with torch.no_grad():
            self.q = _slice_linear(module.q_proj, q_rows)  # column-parallel: d_model -> (h/P)·d_head
            self.k = _slice_linear(module.k_proj, kv_rows)  # d_model -> (local kv heads)·d_head
            self.v = _slice_linear(module.v_proj, kv_rows)
            self.o_weight = nn.Parameter(o.weight[:, q_rows].clone())  # row-parallel: (d_model, (h/P)·d_head)
            self.o_bias = None if o.bias is None else nn.Parameter(o.bias.clone())  # added once, after the sum
        self.traffic = Traffic()

    def forward(self, x, *, mask=None, is_causal: bool = False):
        validation.tensor("x", x, dims=3, floating=True)
        B, L, _ = x.shape
        q = self.q(x).view(B, L, -1, self.head_dim).transpose(1, 2)  # (B, h/P, L, d_head)
        k = self.k(x).view(B, L, -1, self.head_dim).transpose(1, 2)  # (B, local h_kv, L, d_head)
        v = self.v(x).view(B, L, -1, self.head_dim).transpose(1, 2)
        k, v = k[:, self.kv_index], v[:, self.kv_index]  # (B, h/P, L, d_head): each query head's KV head
        if is_causal:
            causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
            mask = causal if mask is None else mask & causal
        out, _ = scaled_dot_product_attention(q, k, v, mask)  # (B, h/P, L, d_head): this rank's heads
        partial = merge_heads(out) @ self.o_weight.T  # (B, L, (h/P)·d_head) @ (.., d_model) -> (B, L, d_model)
        self.traffic.all_reduce(partial)  # Σ over ranks = concat(all heads) @ W_Oᵀ
        return partial if self.o_bias is None else partial + self.o_bias


def _slice_linear(linear: nn.Linear, rows: torch.Tensor) -> nn.Linear:
    """A new Linear with the given output rows of ``linear`` (weight and bias)."""
    out = nn.Linear(linear.in_features, len(rows), bias=linear.bias is not None)
    out = out.to(dtype=linear.weight.dtype, device=linear.weight.device)
    out.weight.copy_(linear.weight[rows])
    if linear.bias is not None:
        out.bias.copy_(linear.bias[rows])
    return out


def tensor_parallel_rank(module, x, mask=None, is_causal: bool = False):
    """A rank's job: build this rank's :class:`TensorParallelAttention` from the full ``module``
    (every rank receives it), run it on ``x``; return ``(out, heads, traffic)`` where ``heads`` is
    ``(q_heads, kv_heads)`` as lists and ``traffic`` the bytes sent per collective."""
    layer = TensorParallelAttention(module, dist.get_rank(), dist.get_world_size())
    with torch.no_grad():
        out = layer(x, mask=mask, is_causal=is_causal)
    return out, (layer.q_heads.tolist(), layer.kv_heads.tolist()), dict(layer.traffic.sent)


def dtensor_rank(module, x):
    """The same split with PyTorch's own tensor parallelism, as a reference: ``ColwiseParallel`` on
    q/k/v_proj, ``RowwiseParallel`` on the output projection, over a CPU device mesh of all ranks
    (``torch.distributed.tensor.parallel``). The module then runs with its local head counts, as in
    PyTorch's tensor-parallel tutorial. Returns (B, L, d_model), a plain tensor."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    P = dist.get_world_size()
    module = copy.deepcopy(module)
    out_name = "out_proj" if isinstance(module, MultiHeadAttention) else "o_proj"
    plan = {"q_proj": ColwiseParallel(), "k_proj": ColwiseParallel(), "v_proj": ColwiseParallel()}
    plan[out_name] = RowwiseParallel()
    mesh = init_device_mesh("cpu", (P,))
    parallelize_module(module, mesh, plan)
    module.num_heads //= P  # each rank's projections now produce its heads only
    if isinstance(module, GroupedQueryAttention):
        if module.num_kv_heads % P:
            raise ValueError(f"num_kv_heads={module.num_kv_heads} must be divisible by {P} ranks for ColwiseParallel")
        module.num_kv_heads //= P
    with torch.no_grad():
        out, _ = module(x, need_weights=True) if isinstance(module, MultiHeadAttention) else module(x)
    # the row-parallel output is an asynchronous all-reduce: wait for it before the tensor leaves the rank
    out = out.wait() if hasattr(out, "wait") else out
    return out.clone()


# ---------------------------------------------------------------------------------------------
# sequence parallelism: positions are the unit


def sequence_positions(length: int, rank: int, world_size: int, layout: str = "contiguous") -> torch.Tensor:
    """int64 positions (L/P,) that rank ``rank`` holds.

    "contiguous": rank r holds block r of P equal blocks. "balanced" (for causal attention): the
    sequence is cut into 2P chunks and rank r holds chunk r and chunk 2P-1-r, an early and a late
    one, so every rank has the same number of (query, key) pairs below the causal diagonal.
    """
    validation.positive_int("length", length)
    validation.positive_int("world_size", world_size)
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {_LAYOUTS}, got layout={layout!r}")
    parts = world_size if layout == "contiguous" else 2 * world_size
    if length % parts:
        raise ValueError(
            f"length={length} must be divisible by {parts} for layout={layout!r} with {world_size} ranks "
            f"({'P' if layout == 'contiguous' else '2P'} equal chunks)"
        )
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got rank={rank}")
    c = length // parts
    chunks = [rank] if layout == "contiguous" else [rank, 2 * world_size - 1 - rank]
    return torch.cat([torch.arange(i * c, (i + 1) * c) for i in chunks])  # (L/P,)


def shard_sequence(x, rank: int, world_size: int, layout: str = "contiguous", *, dim: int = -2):
    """The positions of ``x`` along ``dim`` that rank ``rank`` holds (:func:`sequence_positions`)."""
    validation.tensor("x", x)
    positions = sequence_positions(x.shape[dim], rank, world_size, layout)
    return x.index_select(dim, positions.to(x.device))


def unshard_sequence(shards, layout: str = "contiguous", *, dim: int = -2):
    """Inverse of :func:`shard_sequence`: put the ranks' shards (rank order) back in position order."""
    P = len(shards)
    length = sum(s.shape[dim] for s in shards)
    stacked = torch.cat(list(shards), dim=dim)
    order = torch.cat([sequence_positions(length, r, P, layout) for r in range(P)])  # where each row belongs
    return stacked.index_select(dim, torch.argsort(order).to(stacked.device))


def _chunks(positions: torch.Tensor, n: int):
    size = len(positions) // n
    return [slice(i * size, (i + 1) * size) for i in range(n)]


def ring_attention(q, k, v, *, causal: bool = False, layout: str = "contiguous", traffic: Traffic | None = None):
    """Attention over the whole sequence when each rank holds only its positions; call on every rank.

    q (B, h, L/P, d_head), k and v (B, h_kv, L/P, d_head): this rank's positions
    (:func:`shard_sequence` with the same ``layout``). In P steps, every rank attends its queries to
    the K/V block it holds, while sending that block to rank r+1 and receiving the next from r-1;
    each block is folded into the running (max, sum, acc) of :func:`online_softmax_update`. With
    ``causal``, each rank's positions are cut in two chunks and a (query chunk, key chunk) pair wholly
    above the diagonal is skipped.
    Returns ``(out, work)``: out (B, h, L/P, d_head) for this rank's queries, equal to attention over
    all L keys; work = number of query·key scores this rank computed.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        validation.tensor(name, t, dims=4, floating=True)
    rank, P = dist.get_rank(), dist.get_world_size()
    traffic = Traffic() if traffic is None else traffic
    B, h, Lc, d = q.shape
    L, n_rep = Lc * P, h // k.shape[1]
    # chunks per rank, each contiguous in position: 2 in the balanced layout; a causal ring also cuts a
    # contiguous block in 2, so that the upper half of its diagonal block is skipped, not computed
    pieces = 2 if layout == "balanced" or (causal and Lc % 2 == 0) else 1
    pos_q = sequence_positions(L, rank, P, layout)  # (L/P,)
    q = q / math.sqrt(d)
    state = [  # per query chunk: running max m, running sum ℓ, running acc (online_softmax_update)
        (
            q.new_full((B, h, Lc // pieces, 1), NEG_INF),
            q.new_zeros((B, h, Lc // pieces, 1)),
            q.new_zeros((B, h, Lc // pieces, d)),
        )
        for _ in range(pieces)
    ]
    kv, holder, work = torch.stack([k, v]), rank, 0  # (2, B, h_kv, L/P, d); holder = whose block it is
    for step in range(P):
        if step < P - 1:  # pass the block on while computing with it
            incoming, requests = traffic.send_recv(kv, to=(rank + 1) % P, frm=(rank - 1) % P)
        pos_k = sequence_positions(L, holder, P, layout)
        kb, vb = repeat_kv(kv[0], n_rep), repeat_kv(kv[1], n_rep)  # (B, h, L/P, d)
        for i, qs in enumerate(_chunks(pos_q, pieces)):
            for ks in _chunks(pos_k, pieces):
                allowed = pos_q[qs, None] >= pos_k[None, ks] if causal else None  # (cq, ck)
                if allowed is not None and not allowed.any():
                    continue  # the whole chunk pair is in the future: no scores at all
                s = q[:, :, qs] @ kb[:, :, ks].transpose(-2, -1)  # (B, h, cq, ck)
                if allowed is not None and not allowed.all():
                    s = s.masked_fill(~allowed, NEG_INF)
                state[i] = online_softmax_update(*state[i], s, vb[:, :, ks])
                work += s.shape[-2] * s.shape[-1]
        if step < P - 1:
            for request in requests:
                request.wait()
            kv, holder = incoming, (holder - 1) % P
    out = torch.cat([torch.where(total > 0, acc / total, 0.0) for _, total, acc in state], dim=-2)  # (B, h, L/P, d)
    return out, work


def ring_rank(q, k, v, causal: bool = False, layout: str = "contiguous"):
    """A rank's job: take this rank's positions of the full q (B, h, L, d), k, v (B, h_kv, L, d),
    run :func:`ring_attention`; return ``(out shard, work, bytes sent per collective)``."""
    rank, P = dist.get_rank(), dist.get_world_size()
    traffic = Traffic()
    shards = (shard_sequence(t, rank, P, layout) for t in (q, k, v))
    out, work = ring_attention(*shards, causal=causal, layout=layout, traffic=traffic)
    return out, work, dict(traffic.sent)


def ulysses_attention(q, k, v, *, causal: bool = False, traffic: Traffic | None = None):
    """DeepSpeed-Ulysses: sequence-sharded in, sequence-sharded out, head-sharded in between.

    q (B, h, L/P, d_head), k and v (B, h_kv, L/P, d_head): this rank's contiguous block of
    positions; h must be divisible by P, and h_kv too, or else P a multiple of h_kv: then each KV
    head is first repeated P/h_kv times (:func:`mha_course.repeat_kv`), so that every rank receives
    the one KV head its query heads read. An all-to-all sends head group j to rank j, so each rank
    gets all L positions of h/P heads (B, h/P, L, d_head); it attends (causal or not) and a second
    all-to-all returns each rank its positions of all heads. Returns (B, h, L/P, d_head).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        validation.tensor(name, t, dims=4, floating=True)
    P = dist.get_world_size()
    if q.shape[1] % P:
        raise ValueError(f"Ulysses gives each rank whole heads: num_heads={q.shape[1]} is not divisible by {P} ranks")
    if k.shape[1] % P:
        if P % k.shape[1]:
            raise ValueError(
                f"Ulysses gives each rank whole heads: num_kv_heads={k.shape[1]} is neither divisible by {P} ranks "
                f"nor a divisor of it (then each KV head could be repeated to one per rank)"
            )
        k, v = repeat_kv(k, P // k.shape[1]), repeat_kv(v, P // k.shape[1])  # (B, P, L/P, d): one KV head per rank
    traffic = Traffic() if traffic is None else traffic
    q, k, v = (traffic.all_to_all(t, dim_out=1, dim_in=2) for t in (q, k, v))  # (B, h/P, L, d): heads ↔ positions
    L = q.shape[2]
    mask = torch.ones(L, L, dtype=torch.bool, device=q.device).tril() if causal else None
    n_rep = q.shape[1] // k.shape[1]
    out, _ = scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask)  # (B, h/P, L, d)
    return traffic.all_to_all(out, dim_out=2, dim_in=1)  # (B, h/P, L, d) -> (B, h, L/P, d)


def ulysses_rank(q, k, v, causal: bool = False):
    """A rank's job: take this rank's block of the full q, k, v (B, h(_kv), L, d), run
    :func:`ulysses_attention`; return ``(out shard, bytes sent per collective)``."""
    rank, P = dist.get_rank(), dist.get_world_size()
    traffic = Traffic()
    out = ulysses_attention(*(shard_sequence(t, rank, P) for t in (q, k, v)), causal=causal, traffic=traffic)
    return out, dict(traffic.sent)


# ---------------------------------------------------------------------------------------------
# the formulas


def communication_bytes(
    scheme: str,
    *,
    batch: int,
    length: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    world_size: int,
    bytes_per_element: int = 4,
    d_model: int | None = None,
    direction: str = "forward",
) -> int:
    """Bytes one rank sends over the wire for one attention layer, as :class:`Traffic` counts them,
    in the ``direction`` "forward" (the default) or "backward".

    Forward:

    * "tensor": one ring all-reduce of the (B, L, d_model) output, 2(P-1)/P of B·L·d_model elements
      (d_model defaults to h·d_head);
    * "ring": P-1 sends of the rank's K and V block: (P-1)·2·B·h_kv·(L/P)·d_head;
    * "ulysses": four all-to-alls (Q, K, V in, the output back), each sending (P-1)/P of the rank's
      block: (P-1)/P · B·(L/P)·(2h + 2h_kv')·d_head, where h_kv' = h_kv, or P when the KV heads are
      repeated to one per rank (h divisible by P; h_kv divisible by P or dividing it; else ValueError).

    Backward (the same bytes per element):

    * "tensor": the same all-reduce once more, of dx at the layer's input (Megatron-LM's f operator:
      identity forward, all-reduce backward; Shoeybi et al. 2019, §3);
    * "ring": the K/V blocks go round again (P-1 sends) and the dK/dV accumulators travel with them,
      one step further so that they end on their own rank (P sends): (2P-1)·2·B·h_kv·(L/P)·d_head,
      as in the backward of ring-flash-attention (github.com/zhuzilin/ring-flash-attention);
    * "ulysses": the four all-to-alls in reverse (dO in; dQ, dK, dV back): the forward's bytes.
    """
    for name, value in (
        ("batch", batch),
        ("length", length),
        ("num_heads", num_heads),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
        ("world_size", world_size),
    ):
        validation.positive_int(name, value)
    if direction not in ("forward", "backward"):
        raise ValueError(f"direction must be 'forward' or 'backward', got direction={direction!r}")
    P, B, L, h, h_kv, d = world_size, batch, length, num_heads, num_kv_heads, head_dim
    if scheme == "tensor":
        elements = 2 * (P - 1) * B * L * (h * d if d_model is None else d_model) // P
    elif scheme == "ring":
        blocks = P - 1 if direction == "forward" else 2 * P - 1
        elements = blocks * 2 * B * h_kv * (L // P) * d
    elif scheme == "ulysses":
        if h % P or (h_kv % P and P % h_kv):
            raise ValueError(
                f"Ulysses gives each rank whole heads: num_heads={h} must be divisible by world_size={P}, and "
                f"num_kv_heads={h_kv} divisible by it or a divisor of it"
            )
        elements = (P - 1) * B * (L // P) * (2 * h + 2 * max(h_kv, P)) * d // P
    else:
        raise ValueError(f"scheme must be 'tensor', 'ring' or 'ulysses', got scheme={scheme!r}")
    return elements * bytes_per_element
