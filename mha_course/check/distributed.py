"""Checkers for notebook 14's exercises: which heads a rank holds under tensor parallelism, the
merge of two partial attention results that ring attention does when a block arrives, and the
ring's steps themselves, run on real ranks."""

from __future__ import annotations

import atexit
import contextlib
import io
import threading
import time

import torch
import torch.distributed as dist

from ..distributed import heads_of_rank as _heads_reference
from ..distributed.launcher import Ranks, shippable
from ..distributed.ring import block_attention
from ..tiled import merge_partials as _merge_reference
from .framework import (
    NOT_ATTEMPTED,
    Case,
    CheckResult,
    Mistake,
    diagnoses,
    mistakes,
    run_check,
    tensor_generator,
    type_name,
)

__all__ = ["heads_of_rank", "merge_partials", "ring_steps"]

_INF = float("-inf")

# ---------------------------------------------------------------------------------------------
# heads_of_rank(rank, world_size, num_heads, num_kv_heads) -> (q_heads, kv_heads)


def _heads_variant(rank, world_size, num_heads, num_kv_heads, *, q="blocks", kv="groups"):
    """The split with one deliberate change (the reference with the defaults)."""
    per, n_rep = num_heads // world_size, num_heads // num_kv_heads
    if q == "strided":
        q_heads = torch.arange(rank, num_heads, world_size)  # rank, rank + P, ...
    else:
        q_heads = torch.arange(rank * per, (rank + 1) * per)
    if kv == "like queries":  # KV heads dealt out in blocks of h_kv // P, ignoring which group a query reads
        kv_per = num_kv_heads // world_size
        kv_heads = torch.arange(rank * kv_per, (rank + 1) * kv_per)
    elif kv == "modulo":
        kv_heads = torch.unique(q_heads % num_kv_heads)
    elif kv == "all":
        kv_heads = torch.arange(num_kv_heads)
    else:
        kv_heads = torch.unique(q_heads // n_rep)
    return q_heads, kv_heads


def _heads_cases():
    shapes = [  # (rank, world_size, num_heads, num_kv_heads), the first kept free of GQA
        ((1, 2, 4, 4), "MHA: 4 heads on 2 ranks, rank 1"),
        ((2, 4, 8, 4), "GQA: 8 query, 4 KV heads on 4 ranks, rank 2"),
        ((3, 4, 8, 2), "more ranks than KV heads: 8 query, 2 KV heads on 4 ranks, rank 3"),
        ((1, 4, 32, 8), "Llama-3-8B-like: 32 query, 8 KV heads on 4 ranks, rank 1"),
        ((1, 4, 16, 2), "16 query, 2 KV heads on 4 ranks, rank 1"),
        ((0, 2, 8, 1), "MQA: one KV head, 2 ranks, rank 0"),
        ((5, 8, 8, 2), "one query head per rank: 8 ranks, rank 5"),
    ]
    return [Case(args, description=words) for args, words in shapes]


HEADS_OF_RANK_MISTAKES = mistakes(
    "heads_of_rank",
    {
        "strided": lambda *a: _heads_variant(*a, q="strided"),
        "kv like queries": lambda *a: _heads_variant(*a, kv="like queries"),
        "kv modulo": lambda *a: _heads_variant(*a, kv="modulo"),
        "all kv heads": lambda *a: _heads_variant(*a, kv="all"),
    },
)


def heads_of_rank(fn) -> CheckResult:
    """Check ``fn(rank, world_size, num_heads, num_kv_heads) -> (q_heads, kv_heads)``: two int64
    tensors, ascending, of the query heads rank ``rank`` holds (contiguous blocks of h/P, rank 0 the
    first) and of the KV heads those query heads read (query head i reads KV head i // (h / h_kv))."""
    return run_check(
        "heads_of_rank",
        fn,
        _heads_cases(),
        reference=_heads_reference,
        mistakes=HEADS_OF_RANK_MISTAKES,
        arg_names=("rank", "world_size", "num_heads", "num_kv_heads"),
        output_names=("q_heads", "kv_heads"),
    )


# ---------------------------------------------------------------------------------------------
# merge_partials(out_a, lse_a, out_b, lse_b) -> (out, lse)


def _merge_variant(out_a, lse_a, out_b, lse_b, *, how):
    """A wrong merge: ``how`` names the mistake."""
    if how == "average":
        return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)
    if how == "lse max":
        return _merge_reference(out_a, lse_a, out_b, lse_b)[0], torch.maximum(lse_a, lse_b)
    if how == "lse sum":
        return _merge_reference(out_a, lse_a, out_b, lse_b)[0], lse_a + lse_b
    if how == "unnormalised":
        lse = torch.logaddexp(lse_a, lse_b)
        return torch.exp(lse_a)[..., None] * out_a + torch.exp(lse_b)[..., None] * out_b, lse
    if how == "swapped":
        lse = torch.logaddexp(lse_a, lse_b)
        wa, wb = torch.exp(lse_a - lse).nan_to_num(0.0), torch.exp(lse_b - lse).nan_to_num(0.0)
        return wb[..., None] * out_a + wa[..., None] * out_b, lse
    if how == "overflow":  # exp(lse) without subtracting the max: inf / inf for large scores
        ea, eb = torch.exp(lse_a)[..., None], torch.exp(lse_b)[..., None]
        return (ea * out_a + eb * out_b) / (ea + eb), torch.log(torch.exp(lse_a) + torch.exp(lse_b))
    if how == "no guard":  # NaN where neither part saw a key
        lse = torch.logaddexp(lse_a, lse_b)
        return torch.exp(lse_a - lse)[..., None] * out_a + torch.exp(lse_b - lse)[..., None] * out_b, lse
    raise ValueError(how)


def _partial(q, k, v, allowed=None):
    """Attention of q over the keys k (with an optional mask): (out, lse), out 0 / lse -inf where no key."""
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5  # (..., Lq, Lk)
    if allowed is not None:
        s = s.masked_fill(~allowed, _INF)
    lse = torch.logsumexp(s, dim=-1)  # (..., Lq)
    w = torch.exp(s - lse.masked_fill(lse == _INF, 0.0)[..., None])  # 0 in a row with no key
    return w @ v, lse


def _merge_cases():
    g = tensor_generator()

    def randn(*shape, spread=1.0):
        return torch.randn(*shape, generator=g) * spread

    def two_blocks(batch, lq, ka, kb, d, spread=1.0, mask_a=None):
        q = randn(*batch, lq, d, spread=spread)
        a = _partial(q, randn(*batch, ka, d, spread=spread), randn(*batch, ka, d), mask_a)
        b = _partial(q, randn(*batch, kb, d, spread=spread), randn(*batch, kb, d))
        return (*a, *b)

    no_keys_yet = torch.ones(5, 3, dtype=torch.bool)
    no_keys_yet[1:3] = False  # queries 1 and 2 see no key in block a (above the causal diagonal)
    nothing = (torch.zeros(2, 4, 3), torch.full((2, 4), _INF), torch.zeros(2, 4, 3), torch.full((2, 4), _INF))
    return [
        Case(two_blocks((), 4, 3, 5, 4), description="4 queries, blocks of 3 and 5 keys"),
        Case(two_blocks((2, 3), 6, 4, 4, 8), description="batch (2, 3), blocks of 4 keys"),
        Case(two_blocks((), 5, 3, 3, 4, mask_a=no_keys_yet), description="two queries with no key in block a"),
        Case(two_blocks((2,), 3, 4, 2, 4, spread=12.0), description="large scores (lse in the hundreds)"),
        Case(nothing, description="no key in either block"),
    ]


MERGE_PARTIALS_MISTAKES = mistakes(
    "merge_partials",
    {
        how: (lambda *a, how=how: _merge_variant(*a, how=how))
        for how in ("average", "unnormalised", "swapped", "lse max", "lse sum", "overflow", "no guard")
    },
)


def merge_partials(fn) -> CheckResult:
    """Check ``fn(out_a, lse_a, out_b, lse_b) -> (out, lse)``: two partial attention results for the
    same queries over disjoint key sets — out (..., Lq, d_v) = softmax over that set @ its values,
    lse (..., Lq) = log Σ exp(scores) over it (-inf, with out 0, for a query with no key there) —
    merged into the result over both sets."""
    return run_check(
        "merge_partials",
        fn,
        _merge_cases(),
        reference=_merge_reference,
        mistakes=MERGE_PARTIALS_MISTAKES,
        arg_names=("out_a", "lse_a", "out_b", "lse_b"),
        output_names=("out", "lse"),
    )


# ---------------------------------------------------------------------------------------------
# ring_steps(q, k, v) -> (out, lse), run on every rank of a real gloo group

_P2P = ("send", "recv", "isend", "irecv")
#: seconds the real ranks may run before the check calls it a hang: the last resort, since a wrong
#: neighbour is caught before the ranks start, by a rehearsal in this process (:func:`_rehearse`).
#: Tiny blocks take milliseconds; a test may lower it.
RING_HANG_S = 12.0
#: seconds the rehearsal may take before it gives up and leaves the verdict to the real ranks
REHEARSAL_S = 10.0


def _peer(name, args, kwargs):
    key = "dst" if name.endswith("send") else "src"
    peer = args[0] if args else kwargs.get(key, kwargs.get(f"group_{key}"))
    return None if peer is None else int(peer)


def _ring_steps_rank(fn, q, k, v):
    """One rank's part of the check: run the learner's function on this rank's block of q, k, v
    (contiguous, rank r holds positions r·L/P …), recording every point-to-point send and receive:
    dist.send / recv / isend / irecv, and the dist.P2POp list of dist.batch_isend_irecv."""
    rank, P = dist.get_rank(), dist.get_world_size()
    names = (*_P2P, "P2POp", "batch_isend_irecv")
    ops, originals = [], {name: getattr(dist, name) for name in names}

    def recorder(name):
        original = originals[name]

        def recorded(tensor, *args, **kwargs):
            ops.append((name, _peer(name, args, kwargs)))
            return original(tensor, *args, **kwargs)

        recorded.__name__ = name
        return recorded

    wrappers = {name: recorder(name) for name in _P2P}
    unwrap = {wrappers["isend"]: originals["isend"], wrappers["irecv"]: originals["irecv"]}

    class P2POp(originals["P2POp"]):  # accepts the recorded isend / irecv, holds the real ones
        def __new__(cls, op, *args, **kwargs):
            return super().__new__(cls, unwrap.get(op, op), *args, **kwargs)

        def __init__(self, op, *args, **kwargs):
            super().__init__(unwrap.get(op, op), *args, **kwargs)

    def batch_isend_irecv(p2p_op_list):
        for op in p2p_op_list:
            name = "isend" if op.op is originals["isend"] else "irecv"
            ops.append((name, None if op.peer is None else int(op.peer)))
        return originals["batch_isend_irecv"](p2p_op_list)

    for name, wrapper in {**wrappers, "P2POp": P2POp, "batch_isend_irecv": batch_isend_irecv}.items():
        setattr(dist, name, wrapper)
    try:
        mine = [t.chunk(P, dim=2)[rank].clone() for t in (q, k, v)]
        return "ok", fn(*mine), ops
    except NotImplementedError:
        return "todo", None, ops
    except Exception as exc:  # noqa: BLE001 - reported by the check, never raised
        return "raised", f"{type(exc).__name__}: {exc}".splitlines()[0][:200], ops
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


# --- the rehearsal: P ranks as threads of this process, over a recording stand-in of dist ---------


class _Abort(BaseException):
    """Raised inside a rehearsal thread to end it (a deadlock found, or the rehearsal given up)."""


class _Unsupported(Exception):
    """The learner's function did something the rehearsal does not model: the real ranks decide."""


class _Message:
    """One posted send or receive; complete once matched with its counterpart."""

    def __init__(self, name, peer, tensor):
        self.name, self.peer, self.tensor, self.done = name, peer, tensor, False


class _Work:
    """What the stand-in's isend / irecv return: ``wait()`` blocks until the message is matched."""

    def __init__(self, world, message):
        self._world, self._message = world, message

    def wait(self, timeout=None):
        self._world.wait(self._message)
        return True

    def is_completed(self):
        return self._message.done


class _World:
    """P ranks in threads with gloo's point-to-point semantics: a send completes once its receive
    is posted (a blocking send waits for it, as gloo's does), a receive once its send is posted;
    messages between two ranks with one tag match in order. A rank that waits while no other can
    move is a deadlock, seen at once."""

    def __init__(self, P):
        self.P, self.cond, self.local = P, threading.Condition(), threading.local()
        self.sends, self.recvs = {}, {}  # (src, dst, tag) -> [posted, unmatched]
        self.ops = [[] for _ in range(P)]  # (name, peer) per rank, in program order
        self.waiting = [None] * P  # the message a rank is blocked on
        self.finished = [False] * P
        self.outcome = [None] * P  # (status, payload) of each rank's call
        self.stop = False

    # the stand-in's functions (the names of torch.distributed)
    def get_rank(self, group=None):
        return self.local.rank

    def get_world_size(self, group=None):
        return self.P

    def is_initialized(self):
        return True

    def _post(self, name, tensor, peer, tag):
        me = self.local.rank
        if not isinstance(tensor, torch.Tensor) or peer is None or not 0 <= int(peer) < self.P:
            raise _Unsupported(name)
        peer = int(peer)
        self.ops[me].append((name, peer))
        key = (me, peer, tag) if name.endswith("send") else (peer, me, tag)
        mine, theirs = (self.sends, self.recvs) if name.endswith("send") else (self.recvs, self.sends)
        message = _Message(name, peer, tensor)
        with self.cond:
            if self.stop:
                raise _Abort
            if theirs.get(key):
                other = theirs[key].pop(0)
                send, recv = (message, other) if name.endswith("send") else (other, message)
                if send.tensor.shape != recv.tensor.shape:
                    raise _Unsupported("shapes")
                recv.tensor.copy_(send.tensor)
                send.done = recv.done = True
                self.cond.notify_all()
            else:
                mine.setdefault(key, []).append(message)
        return message

    def wait(self, message):
        me = self.local.rank
        with self.cond:
            while not message.done:
                if self.stop:
                    raise _Abort
                self.waiting[me] = message
                self.cond.notify_all()
                self.cond.wait()
            self.waiting[me] = None

    def isend(self, tensor, dst=None, group=None, tag=0, group_dst=None):
        return _Work(self, self._post("isend", tensor, dst if dst is not None else group_dst, tag))

    def irecv(self, tensor, src=None, group=None, tag=0, group_src=None):
        return _Work(self, self._post("irecv", tensor, src if src is not None else group_src, tag))

    def send(self, tensor, dst=None, group=None, tag=0, group_dst=None):
        self.wait(self._post("send", tensor, dst if dst is not None else group_dst, tag))

    def recv(self, tensor, src=None, group=None, tag=0, group_src=None):
        peer = src if src is not None else group_src
        self.wait(self._post("recv", tensor, peer, tag))
        return peer

    def batch_isend_irecv(self, p2p_op_list):
        return [op.op(op.tensor, op.peer, tag=op.tag) for op in p2p_op_list]

    def stand_in(self):
        """name -> function: what replaces torch.distributed's own during the rehearsal."""
        world = self

        class P2POp:
            def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
                if op not in (world.isend, world.irecv):
                    raise _Unsupported("P2POp")
                self.op, self.tensor, self.tag = op, tensor, tag
                self.peer = peer if peer is not None else group_peer

        names = ("get_rank", "get_world_size", "is_initialized", *_P2P, "batch_isend_irecv")
        return {**{name: getattr(self, name) for name in names}, "P2POp": P2POp}

    def rank_main(self, rank, fn, args):
        self.local.rank = rank
        try:
            self.outcome[rank] = ("ok", fn(*args))
        except _Abort:
            self.outcome[rank] = ("stopped", None)
        except NotImplementedError:
            self.outcome[rank] = ("todo", None)
        except BaseException as exc:  # noqa: BLE001 - a stand-in's limit or the learner's error
            self.outcome[rank] = ("raised", exc)
        finally:
            with self.cond:
                self.finished[rank] = True
                self.cond.notify_all()

    def stuck(self):
        """{rank: the message it waits for} when no rank can move (a deadlock); None while one can."""
        blocked = {r: m for r, m in enumerate(self.waiting) if m is not None and not m.done}
        running = [r for r in range(self.P) if not self.finished[r] and r not in blocked]
        return None if running or not blocked else blocked


def _rehearse(fn, q, k, v, P):
    """Run ``fn`` on P ranks as threads of this process, over a stand-in for torch.distributed's
    point-to-point functions that records every send and receive (no process, no socket).
    Returns ``(ops per rank, outcome per rank, ranks left waiting or None)``, or None when the
    rehearsal proves nothing (the function used what the stand-in lacks, or ran past
    :data:`REHEARSAL_S`): then the real ranks decide."""
    if dist.is_available() and dist.is_initialized():  # under torchrun: this process is a rank
        return None
    world = _World(P)
    originals = {name: getattr(dist, name) for name in world.stand_in()}
    blocks = [[t.chunk(P, dim=2)[r].clone() for t in (q, k, v)] for r in range(P)]
    threads = [
        threading.Thread(target=world.rank_main, args=(r, fn, blocks[r]), daemon=True, name=f"rehearsal rank {r}")
        for r in range(P)
    ]
    stuck, deadline = None, time.monotonic() + REHEARSAL_S
    sink = io.StringIO()  # what the learner's function prints is not this check's output
    try:
        for name, replacement in world.stand_in().items():
            setattr(dist, name, replacement)
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            for thread in threads:
                thread.start()
            with world.cond:
                while not all(world.finished):
                    stuck = world.stuck()
                    left = deadline - time.monotonic()
                    if stuck is not None or left <= 0:
                        break
                    world.cond.wait(timeout=min(left, 0.5))
                world.stop = True
                world.cond.notify_all()
            for thread in threads:
                thread.join(timeout=2.0)
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
    if stuck is None and not all(world.finished):
        return None  # ran past the deadline: the real ranks, with their own timeout, decide
    if any(status == "raised" and isinstance(payload, _Unsupported) for status, payload in world.outcome):
        return None
    if any(status == "raised" for status, _ in world.outcome):
        stuck = None  # the others may wait for the rank that raised (perhaps at what the stand-in lacks)
    return world.ops, world.outcome, stuck


def _wrong_neighbour(ops, r, P):
    """The first wrong peer of rank r's sends and receives, in words, or None."""
    sent = [peer for op, peer in ops if op.endswith("send")]
    received = [peer for op, peer in ops if op.endswith("recv")]
    nxt, prv = (r + 1) % P, (r - 1) % P
    wrong_to = sorted({p for p in sent if p != nxt})
    wrong_from = sorted({p for p in received if p is not None and p != prv})
    if wrong_to:
        return f"sent to rank {wrong_to[0]}"
    return f"received from rank {wrong_from[0]}" if wrong_from else None


def _rehearsal_verdict(fn, q, k, v, P, first, where):
    """What the rehearsal on P ranks already shows, as a CheckResult; None: the real ranks decide."""
    rehearsal = _rehearse(fn, q, k, v, P)
    if rehearsal is None:
        return None
    ops, outcome, stuck = rehearsal
    name = "ring_steps"
    if stuck is not None:  # found at once, without waiting out a hang of the real ranks
        wrong = [(r, _wrong_neighbour(ops[r], r, P)) for r in range(P)]
        r, said = next(((r, said) for r, said in wrong if said is not None), (None, None))
        if said is not None:
            said = said.replace("received from rank", "waited for a block from rank")
            words = f"rank {r} {said}, and then every rank waited for another"
        elif len(stuck) == P and len({m.name for m in stuck.values()}) == 1:  # the same blocking call first
            waited, then = (
                ("receive", "sent") if next(iter(stuck.values())).name.endswith("recv") else ("send", "received")
            )
            words = (
                f"every rank waited to {waited} before any rank {then}: start the send and the receive together "
                f"(isend, irecv), then wait for both"
            )
        else:
            r, message = min(stuck.items())
            words = f"rank {r} waited for rank {message.peer}, and then every rank waited for another"
        return CheckResult(
            False,
            f"{name}: likely mistake — {_RING_WORDS['hang']} ({where})",
            f"{words}; a send to rank + 1 is only received if rank + 1 receives from rank",
        )
    for r in range(P):
        said = _wrong_neighbour(ops[r], r, P)
        if said is not None:
            return CheckResult(
                False, f"{name}: likely mistake — {_RING_WORDS['wrong neighbour']} (rank {r} {said}, {where})"
            )
    if first and all(status == "todo" for status, _ in outcome):
        return CheckResult(False, f"{name}: {NOT_ATTEMPTED}", status="not attempted")
    return None


def _fold(q_r, blocks, order, *, merge="lse"):
    """What a rank ends with when it folds ``blocks[i]`` for i in ``order`` (None: a block of zeros)."""
    out = lse = None
    for i in order:
        kb, vb = (torch.zeros_like(blocks[0][0]), torch.zeros_like(blocks[0][1])) if i is None else blocks[i]
        o, s = block_attention(q_r, kb, vb)
        if out is None:
            out, lse = o, s
        elif merge == "average":
            out, lse = (out + o) / 2, torch.logaddexp(lse, s)
        else:
            out, lse = _merge_reference(out, lse, o, s)
    return out, lse


def _ring_variants(q_r, blocks, r, P):
    """name -> (out, lse) of rank r for each likely mistake, and "right" for the correct ring."""
    arriving = [(r - s) % P for s in range(P)]  # the block a rank holds after s steps
    return {
        "right": _fold(q_r, blocks, arriving),
        "sent block": _fold(q_r, blocks, [r] * P),
        "sent block, then moved on": _fold(q_r, blocks, [r, *arriving[:-1]]),
        "average": _fold(q_r, blocks, arriving, merge="average"),
        "before wait": _fold(q_r, blocks, [r] + [None] * (P - 1)),
        "one step too many": _fold(q_r, blocks, [*arriving, r]),
        "one step too few": _fold(q_r, blocks, arriving[:-1]),
    }


_RING_WORDS = diagnoses("ring_steps")
#: what :func:`ring_steps` can name (its diagnoses; the mistakes are recognised on the ranks' results)
RING_STEPS_MISTAKES = [Mistake(name, None, words) for name, words in _RING_WORDS.items()]


def _close_to(got, want, tol=1e-8):
    return got.shape == want.shape and bool(torch.allclose(got, want, atol=tol, rtol=tol, equal_nan=False))


def _ring_case(P):
    g = torch.Generator().manual_seed(14 + P)
    return [torch.randn(1, 2, 4 * P, 8, generator=g, dtype=torch.float64) * 1.5 for _ in range(3)]


#: world size -> ranks a check left clean, kept for the next check (one start per size, not per check)
_POOL: dict[int, Ranks] = {}


def _ranks(P):
    """P started ranks: those the last check left clean, else new ones."""
    ranks = _POOL.pop(P, None)
    if ranks is not None and ranks._procs and all(proc.is_alive() for proc in ranks._procs):
        return ranks
    if ranks is not None:
        ranks.close(wait=False)
    return Ranks(P, timeout=60.0)


def _balanced(results):
    """Whether every send the ranks posted met its receive (counted per pair of ranks), so that no
    message is left over for the next job to receive by mistake."""
    sends, recvs = {}, {}
    for r, (status, _, ops) in enumerate(results):
        if status not in ("ok", "todo"):
            return False
        for op, peer in ops:
            if peer is None:
                return False
            pair = (r, peer) if op.endswith("send") else (peer, r)
            table = sends if op.endswith("send") else recvs
            table[pair] = table.get(pair, 0) + 1
    return sends == recvs


def _keep_or_close(ranks, results):
    """Keep the ranks for the next check if this job left them clean; else stop them."""
    if _balanced(results):
        old = _POOL.pop(ranks.world_size, None)
        if old is not None and old is not ranks:
            old.close(wait=False)
        _POOL[ranks.world_size] = ranks
    else:
        ranks.close(wait=False)


@atexit.register
def _close_pool():
    while _POOL:
        _POOL.popitem()[1].close()


def _where(P):
    return f"on {P} ranks, q, k, v (1, 2, {4 * P}, 8) float64, {4} positions per rank"


def _check_ring_on(fn, P, first):
    name = "ring_steps"
    q, k, v = _ring_case(P)
    where = _where(P)
    try:
        ranks = _ranks(P)
        ranks.timeout = RING_HANG_S  # the run itself: tiny blocks, a hang is a mistake
        results = ranks.run(_ring_steps_rank, fn, q, k, v)  # a hang or a failure stops the ranks
        _keep_or_close(ranks, results)
    except TimeoutError:
        return CheckResult(
            False,
            f"{name}: likely mistake — {_RING_WORDS['hang']} ({where})",
            f"the ranks were stopped after {RING_HANG_S:g} s; a send to rank + 1 is only received if rank + 1 "
            f"receives from rank",
        )
    except RuntimeError as exc:
        return CheckResult(False, f"{name}: a rank failed {where}", str(exc).splitlines()[0][:300])
    statuses = [status for status, _, _ in results]
    if "todo" in statuses:
        if first and set(statuses) == {"todo"}:
            return CheckResult(False, f"{name}: {NOT_ATTEMPTED}", status="not attempted")
        return CheckResult(False, f"{name}: your function raised NotImplementedError {where} — finish it")
    for r, (status, payload, _) in enumerate(results):
        if status == "raised":
            return CheckResult(False, f"{name}: your function raised {payload} on rank {r} ({where})")
    for r, (_, _, ops) in enumerate(results):
        said = _wrong_neighbour(ops, r, P)
        if said is not None:
            return CheckResult(
                False,
                f"{name}: likely mistake — {_RING_WORDS['wrong neighbour']} (rank {r} {said}, {where})",
            )
    blocks = list(zip(k.chunk(P, dim=2), v.chunk(P, dim=2), strict=True))
    for r, (_, got, _) in enumerate(results):
        q_r = q.chunk(P, dim=2)[r]
        variants = _ring_variants(q_r, blocks, r, P)
        want_out, want_lse = variants.pop("right")
        if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
            return CheckResult(False, f"{name}: expected a tuple (out, lse) of two tensors, got {type_name(got)}")
        out, lse = (t.to(torch.float64) for t in got)
        if out.shape != want_out.shape or lse.shape != want_lse.shape:
            return CheckResult(
                False,
                f"{name}: on rank {r}, out {tuple(out.shape)} and lse {tuple(lse.shape)}; expected out "
                f"{tuple(want_out.shape)} and lse {tuple(want_lse.shape)} ({where})",
            )
        if _close_to(out, want_out) and _close_to(lse, want_lse):
            continue
        # out and lse first: folding a block twice leaves out as it was and only moves lse
        matches = [m for m, (v_out, v_lse) in variants.items() if _close_to(out, v_out) and _close_to(lse, v_lse)]
        matches += [m for m, (v_out, _) in variants.items() if _close_to(out, v_out)]
        if matches:
            return CheckResult(False, f"{name}: likely mistake — {_RING_WORDS[matches[0]]}", f"rank {r}, {where}")
        if _close_to(out, want_out):
            return CheckResult(
                False,
                f"{name}: out is right but lse is not on rank {r} ({where}): keep the merged log-sum-exp "
                f"that merge_partials returns as the running lse",
            )
        error = float((out - want_out).abs().max())
        words = (
            "the right blocks travelled, but the fold is wrong — fold the arriving block only after wait() "
            "returns, with merge_partials"
            if ops
            else "out differs from attention over all keys"
        )
        return CheckResult(False, f"{name}: {words} (rank {r}, {where}; max abs error {error:.2g})")
    return None


def ring_steps(fn) -> CheckResult:
    """Check ``fn(q, k, v) -> (out, lse)`` on 2 and then 3 real gloo ranks: each rank passes its
    q, k, v (B, h, L/P, d_head), this rank's positions; in P − 1 steps it sends the K/V block it holds
    to rank (r + 1) % P, receives the next from (r − 1) % P, waits, and folds the arriving block into
    its running (out, lse) — attention of its queries over every key, and the log-sum-exp of the
    scores. ``fn`` may be a function of a notebook cell (it travels to the ranks by its source) or
    ``"module:function"``. A rehearsal in this process (the ranks as threads) names a wrong neighbour
    or ranks that wait for each other at once, before the real ranks run."""
    name = "ring_steps"
    if not callable(fn) and not isinstance(fn, str):
        return CheckResult(False, f"{name}: expected your function, got {type_name(fn)} — pass the function itself")
    try:
        fn = shippable(fn)
    except (TypeError, ValueError, OSError, AttributeError, ImportError) as exc:
        return CheckResult(False, f"{name}: your function cannot run on the ranks — {exc}")
    # first a rehearsal in this process (a wrong neighbour named at once), then the real ranks
    for i, P in enumerate((2, 3)):
        result = _rehearsal_verdict(fn, *_ring_case(P), P, i == 0, _where(P))
        if result is not None:
            return result
    for i, P in enumerate((2, 3)):
        result = _check_ring_on(fn, P, first=i == 0)
        if result is not None:
            return result
    return CheckResult(
        True,
        f"{name}: correct on 2 and 3 ranks (every rank's out and lse equal attention over all keys; "
        f"each rank sent to rank + 1 and received from rank − 1)",
    )
