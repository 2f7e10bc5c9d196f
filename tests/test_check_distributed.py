"""Checkers of notebook 14: correct variants pass, each listed mistake is named, and a learner's
exception or an unfinished exercise never makes a check raise."""

import pytest
import torch

import mha_course as mc

# --- heads_of_rank -----------------------------------------------------------------------------


def heads_by_arange(rank, world_size, num_heads, num_kv_heads):
    per = num_heads // world_size
    q = torch.arange(rank * per, (rank + 1) * per)
    return q, torch.unique(q // (num_heads // num_kv_heads))


def heads_by_chunks(rank, world_size, num_heads, num_kv_heads):
    q = torch.arange(num_heads).chunk(world_size)[rank]
    n_rep = num_heads // num_kv_heads
    first, last = int(q[0]) // n_rep, int(q[-1]) // n_rep
    return q, torch.arange(first, last + 1)


def heads_by_lists(rank, world_size, num_heads, num_kv_heads):
    per, n_rep = num_heads // world_size, num_heads // num_kv_heads
    q = [i for i in range(num_heads) if i // per == rank]
    kv = sorted({i // n_rep for i in q})
    return torch.tensor(q), torch.tensor(kv)


@pytest.mark.parametrize("fn", [heads_by_arange, heads_by_chunks, heads_by_lists])
def test_heads_of_rank_accepts_correct_variants(fn):
    result = mc.check.heads_of_rank(fn)
    assert result.passed, result


def test_heads_of_rank_names_mistakes():
    def strided(rank, world_size, num_heads, num_kv_heads):
        q = torch.arange(rank, num_heads, world_size)
        return q, torch.unique(q // (num_heads // num_kv_heads))

    def kv_blocks(rank, world_size, num_heads, num_kv_heads):
        q, _ = heads_by_arange(rank, world_size, num_heads, num_kv_heads)
        per = max(num_kv_heads // world_size, 1)
        return q, torch.arange(rank * per, (rank + 1) * per) % num_kv_heads

    def modulo(rank, world_size, num_heads, num_kv_heads):
        q, _ = heads_by_arange(rank, world_size, num_heads, num_kv_heads)
        return q, torch.unique(q % num_kv_heads)

    def everything(rank, world_size, num_heads, num_kv_heads):
        return heads_by_arange(rank, world_size, num_heads, num_kv_heads)[0], torch.arange(num_kv_heads)

    for fn, words in [
        (strided, "contiguous block"),
        (modulo, "not i % h_kv"),
        (everything, "every rank holds all the KV heads"),
    ]:
        result = mc.check.heads_of_rank(fn)
        assert not result.passed and "likely mistake" in result.message and words in result.message, (fn, result)
    # a block split of the KV heads that wraps instead of going empty is still wrong, if not named
    assert not mc.check.heads_of_rank(kv_blocks).passed


def test_heads_of_rank_kv_split_like_queries_is_named():
    def kv_like_queries(rank, world_size, num_heads, num_kv_heads):
        q, _ = heads_by_arange(rank, world_size, num_heads, num_kv_heads)
        per = num_kv_heads // world_size
        return q, torch.arange(rank * per, (rank + 1) * per)

    result = mc.check.heads_of_rank(kv_like_queries)
    assert not result.passed and "replicated" in result.message, result


def test_heads_of_rank_not_attempted_and_raising():
    def todo(*args):
        raise NotImplementedError

    def broken(rank, world_size, num_heads, num_kv_heads):
        return torch.arange(num_heads).view(world_size, -1)[rank], None.shape

    assert mc.check.heads_of_rank(todo).status == "not attempted"
    result = mc.check.heads_of_rank(broken)
    assert not result.passed and "AttributeError" in result.message


# --- merge_partials ----------------------------------------------------------------------------


def merge_logaddexp(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    safe = lse.masked_fill(lse == float("-inf"), 0.0)
    wa, wb = torch.exp(lse_a - safe), torch.exp(lse_b - safe)
    return wa[..., None] * out_a + wb[..., None] * out_b, lse


def merge_sigmoid(out_a, lse_a, out_b, lse_b):  # the form of ring-flash-attention's update
    both = torch.isfinite(lse_a) & torch.isfinite(lse_b)
    w_b = torch.where(both, torch.sigmoid(lse_b - lse_a), torch.isfinite(lse_b).to(out_a.dtype))
    out = out_a - w_b[..., None] * (out_a - out_b)
    lse = torch.where(both, lse_a - torch.nn.functional.logsigmoid(lse_a - lse_b), torch.maximum(lse_a, lse_b))
    return out, lse


def merge_by_max(out_a, lse_a, out_b, lse_b):
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    ea, eb = torch.exp(lse_a - m), torch.exp(lse_b - m)
    total = ea + eb
    out = torch.where(total[..., None] > 0, (ea[..., None] * out_a + eb[..., None] * out_b) / total[..., None], 0.0)
    return out, m + torch.log(total)


@pytest.mark.parametrize("fn", [merge_logaddexp, merge_sigmoid, merge_by_max])
def test_merge_partials_accepts_correct_variants(fn):
    result = mc.check.merge_partials(fn)
    assert result.passed, result


def test_merge_partials_names_mistakes():
    def average(out_a, lse_a, out_b, lse_b):
        return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)

    def no_division(out_a, lse_a, out_b, lse_b):
        return lse_a.exp()[..., None] * out_a + lse_b.exp()[..., None] * out_b, torch.logaddexp(lse_a, lse_b)

    def lse_max(out_a, lse_a, out_b, lse_b):
        return merge_logaddexp(out_a, lse_a, out_b, lse_b)[0], torch.maximum(lse_a, lse_b)

    def overflow(out_a, lse_a, out_b, lse_b):
        ea, eb = lse_a.exp(), lse_b.exp()
        return (ea[..., None] * out_a + eb[..., None] * out_b) / (ea + eb)[..., None], (ea + eb).log()

    def no_guard(out_a, lse_a, out_b, lse_b):
        lse = torch.logaddexp(lse_a, lse_b)
        return (lse_a - lse).exp()[..., None] * out_a + (lse_b - lse).exp()[..., None] * out_b, lse

    for fn, words in [
        (average, "averaged"),
        (no_division, "not divided by their sum"),
        (lse_max, "max(lse_a, lse_b)"),
        (overflow, "overflows"),
        (no_guard, "neither part saw a key"),
    ]:
        result = mc.check.merge_partials(fn)
        assert not result.passed and "likely mistake" in result.message and words in result.message, (fn, result)


def test_merge_partials_not_attempted_and_raising():
    def todo(*args):
        raise NotImplementedError

    def broken(out_a, lse_a, out_b, lse_b):
        return out_a @ out_b[..., :-1, :], lse_a  # (.., Lq, d) @ (.., Lq - 1, d): a shape error

    assert mc.check.merge_partials(todo).status == "not attempted"
    result = mc.check.merge_partials(broken)
    assert not result.passed and "RuntimeError" in result.message


def test_checkers_are_registered():
    assert {"heads_of_rank", "merge_partials", "ring_steps"} <= set(mc.check.available())


# --- ring_steps: the learner's ring on real ranks ------------------------------------------------
# Each variant is a top-level function of this file: the check ships it to the ranks by its source.

import torch.distributed as dist  # noqa: E402


def _exchange(kv, to, frm):
    arriving = torch.empty_like(kv)
    requests = [dist.isend(kv, to), dist.irecv(arriving, frm)]
    for request in requests:
        request.wait()
    return arriving


def ring_isend(q, k, v):
    rank, P = dist.get_rank(), dist.get_world_size()
    kv = torch.stack([k, v])
    out, lse = mc.distributed.block_attention(q, k, v)
    for _ in range(P - 1):
        kv = _exchange(kv, (rank + 1) % P, (rank - 1) % P)
        out, lse = mc.merge_partials(out, lse, *mc.distributed.block_attention(q, kv[0], kv[1]))
    return out, lse


def ring_send_recv_ordered(q, k, v):  # blocking send/recv, even ranks send first: no deadlock
    rank, P = dist.get_rank(), dist.get_world_size()
    out, lse = mc.distributed.block_attention(q, k, v)
    for _ in range(P - 1):
        k_in, v_in = torch.empty_like(k), torch.empty_like(v)
        for tensor, arriving in ((k, k_in), (v, v_in)):
            if rank % 2 == 0:
                dist.send(tensor, dst=(rank + 1) % P)
                dist.recv(arriving, src=(rank - 1) % P)
            else:
                dist.recv(arriving, src=(rank - 1) % P)
                dist.send(tensor, dst=(rank + 1) % P)
        k, v = k_in, v_in
        o, s = mc.distributed.block_attention(q, k, v)
        m = torch.maximum(lse, s)
        w_a, w_b = torch.exp(lse - m), torch.exp(s - m)
        out, lse = (w_a[..., None] * out + w_b[..., None] * o) / (w_a + w_b)[..., None], m + torch.log(w_a + w_b)
    return out, lse


def ring_backwards(q, k, v):  # sends to rank − 1, receives from rank + 1: a ring, the wrong way round
    rank, P = dist.get_rank(), dist.get_world_size()
    kv = torch.stack([k, v])
    out, lse = mc.distributed.block_attention(q, k, v)
    for _ in range(P - 1):
        kv = _exchange(kv, (rank - 1) % P, (rank + 1) % P)
        out, lse = mc.merge_partials(out, lse, *mc.distributed.block_attention(q, kv[0], kv[1]))
    return out, lse


def ring_receive_from_next(q, k, v):  # sends to rank + 1 and receives from rank + 1: a hang on 3 ranks
    rank, P = dist.get_rank(), dist.get_world_size()
    kv = torch.stack([k, v])
    out, lse = mc.distributed.block_attention(q, k, v)
    for _ in range(P - 1):
        kv = _exchange(kv, (rank + 1) % P, (rank + 1) % P)
        out, lse = mc.merge_partials(out, lse, *mc.distributed.block_attention(q, kv[0], kv[1]))
    return out, lse


def ring_folds_sent_block(q, k, v):
    rank, P = dist.get_rank(), dist.get_world_size()
    kv = torch.stack([k, v])
    out, lse = mc.distributed.block_attention(q, k, v)
    for _ in range(P - 1):
        arriving = _exchange(kv, (rank + 1) % P, (rank - 1) % P)
        out, lse = mc.merge_partials(out, lse, *mc.distributed.block_attention(q, kv[0], kv[1]))
        kv = arriving
    return out, lse


def ring_folds_before_wait(q, k, v):
    rank, P = dist.get_rank(), dist.get_world_size()
    kv = torch.stack([k, v])
    out, lse = mc.distributed.block_attention(q, k, v)
    for _ in range(P - 1):
        arriving = torch.zeros_like(kv)
        out, lse = mc.merge_partials(out, lse, *mc.distributed.block_attention(q, arriving[0], arriving[1]))
        requests = [dist.isend(kv, (rank + 1) % P), dist.irecv(arriving, (rank - 1) % P)]
        for request in requests:
            request.wait()
        kv = arriving
    return out, lse


def ring_averages(q, k, v):
    rank, P = dist.get_rank(), dist.get_world_size()
    kv = torch.stack([k, v])
    out, lse = mc.distributed.block_attention(q, k, v)
    for _ in range(P - 1):
        kv = _exchange(kv, (rank + 1) % P, (rank - 1) % P)
        o, s = mc.distributed.block_attention(q, kv[0], kv[1])
        out, lse = (out + o) / 2, torch.logaddexp(lse, s)
    return out, lse


def ring_p_steps(q, k, v):
    rank, P = dist.get_rank(), dist.get_world_size()
    kv = torch.stack([k, v])
    out, lse = mc.distributed.block_attention(q, k, v)
    for _ in range(P):
        kv = _exchange(kv, (rank + 1) % P, (rank - 1) % P)
        out, lse = mc.merge_partials(out, lse, *mc.distributed.block_attention(q, kv[0], kv[1]))
    return out, lse


def ring_p_minus_2_steps(q, k, v):
    rank, P = dist.get_rank(), dist.get_world_size()
    kv = torch.stack([k, v])
    out, lse = mc.distributed.block_attention(q, k, v)
    for _ in range(P - 2):
        kv = _exchange(kv, (rank + 1) % P, (rank - 1) % P)
        out, lse = mc.merge_partials(out, lse, *mc.distributed.block_attention(q, kv[0], kv[1]))
    return out, lse


def ring_batch(q, k, v):  # the step as ring-flash-attention writes it: P2POp + batch_isend_irecv
    rank, P = dist.get_rank(), dist.get_world_size()
    kv = torch.stack([k, v])
    out, lse = mc.distributed.block_attention(q, k, v)
    for _ in range(P - 1):
        arriving = torch.empty_like(kv)
        ops = [dist.P2POp(dist.isend, kv, (rank + 1) % P), dist.P2POp(dist.irecv, arriving, (rank - 1) % P)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        kv = arriving
        out, lse = mc.merge_partials(out, lse, *mc.distributed.block_attention(q, kv[0], kv[1]))
    return out, lse


def ring_batch_backwards(q, k, v):  # batch_isend_irecv with the ring the wrong way round
    rank, P = dist.get_rank(), dist.get_world_size()
    kv = torch.stack([k, v])
    out, lse = mc.distributed.block_attention(q, k, v)
    for _ in range(P - 1):
        arriving = torch.empty_like(kv)
        ops = [dist.P2POp(dist.isend, kv, (rank - 1) % P), dist.P2POp(dist.irecv, arriving, (rank + 1) % P)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        kv = arriving
        out, lse = mc.merge_partials(out, lse, *mc.distributed.block_attention(q, kv[0], kv[1]))
    return out, lse


def ring_send_recv_backwards(q, k, v):  # blocking send / recv in a safe order, the wrong way round
    rank, P = dist.get_rank(), dist.get_world_size()
    out, lse = mc.distributed.block_attention(q, k, v)
    for _ in range(P - 1):
        k_in, v_in = torch.empty_like(k), torch.empty_like(v)
        for tensor, arriving in ((k, k_in), (v, v_in)):
            if rank == 0:
                dist.send(tensor, dst=(rank - 1) % P)
                dist.recv(arriving, src=(rank + 1) % P)
            else:
                dist.recv(arriving, src=(rank + 1) % P)
                dist.send(tensor, dst=(rank - 1) % P)
        k, v = k_in, v_in
        out, lse = mc.merge_partials(out, lse, *mc.distributed.block_attention(q, k, v))
    return out, lse


def ring_batch_receive_from_next(q, k, v):  # batch_isend_irecv receiving from rank + 1: a hang on 3 ranks
    rank, P = dist.get_rank(), dist.get_world_size()
    kv = torch.stack([k, v])
    out, lse = mc.distributed.block_attention(q, k, v)
    for _ in range(P - 1):
        arriving = torch.empty_like(kv)
        ops = [dist.P2POp(dist.isend, kv, (rank + 1) % P), dist.P2POp(dist.irecv, arriving, (rank + 1) % P)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        kv = arriving
        out, lse = mc.merge_partials(out, lse, *mc.distributed.block_attention(q, kv[0], kv[1]))
    return out, lse


def ring_receives_first(q, k, v):  # the right neighbours, but every rank's blocking recv comes first
    rank, P = dist.get_rank(), dist.get_world_size()
    out, lse = mc.distributed.block_attention(q, k, v)
    for _ in range(P - 1):
        kv, arriving = torch.stack([k, v]), torch.empty(2, *k.shape, dtype=k.dtype)
        dist.recv(arriving, src=(rank - 1) % P)
        dist.send(kv, dst=(rank + 1) % P)
        k, v = arriving[0], arriving[1]
        out, lse = mc.merge_partials(out, lse, *mc.distributed.block_attention(q, k, v))
    return out, lse


def ring_barrier_then_receives_first(q, k, v):  # what the rehearsal cannot follow (a barrier), then a hang
    dist.barrier()
    return ring_receives_first(q, k, v)


def ring_and_a_send_nobody_receives(q, k, v):  # right results, but a message is left over
    out, lse = ring_isend(q, k, v)
    if dist.get_rank() == 0:
        dist.isend(torch.zeros(3), 1)
    return out, lse


def ring_that_prints(q, k, v):
    print(f"rank {dist.get_rank()} starts")
    return ring_isend(q, k, v)


def ring_todo(q, k, v):
    raise NotImplementedError("Exercise 14.3: your code here")


def ring_broken(q, k, v):
    return q @ k, None


@pytest.mark.parametrize("fn", [ring_isend, ring_send_recv_ordered, ring_batch])
def test_ring_steps_accepts_correct_variants(fn):
    result = mc.check.ring_steps(fn)
    assert result.passed, result


@pytest.mark.parametrize(
    "fn, words",
    [
        (ring_backwards, "rank 0 sent to rank 2"),
        (ring_batch_backwards, "rank 0 sent to rank 2"),
        (ring_send_recv_backwards, "rank 0 sent to rank 2"),
        (ring_receive_from_next, "wrong neighbour: a rank waited for a block no rank sent it"),
        (ring_batch_receive_from_next, "wrong neighbour: a rank waited for a block no rank sent it"),
        (ring_receives_first, "wrong neighbour: a rank waited for a block no rank sent it"),
        (ring_folds_sent_block, "folded the block this rank sent"),
        (ring_folds_before_wait, "before wait() returned"),
        (ring_averages, "averaged the running output"),
        (ring_p_steps, "one step too many"),
        (ring_p_minus_2_steps, "one step too few"),
    ],
)
def test_ring_steps_names_mistakes(fn, words):
    result = mc.check.ring_steps(fn)
    assert not result.passed and result.status == "failed", result
    assert "likely mistake" in result.message and words in result.message, result


def test_ring_steps_not_attempted_raising_and_unshippable():
    assert mc.check.ring_steps(ring_todo).status == "not attempted"
    result = mc.check.ring_steps(ring_broken)
    assert not result.passed and "RuntimeError" in result.message and "rank 0" in result.message, result
    result = mc.check.ring_steps(lambda q, k, v: (q, k))
    assert not result.passed and "cannot run on the ranks" in result.message and "lambda" in result.message, result


def _no_ranks(*args, **kwargs):
    raise AssertionError("the check ran the real ranks")


@pytest.mark.parametrize(
    "fn, detail",
    [
        (ring_backwards, None),
        (ring_batch_backwards, None),
        (ring_send_recv_backwards, None),
        (ring_receive_from_next, "rank 0 waited for a block from rank 1"),
        (ring_batch_receive_from_next, "rank 0 waited for a block from rank 1"),
        (ring_receives_first, "every rank waited to receive before any rank sent"),
    ],
)
def test_a_wrong_neighbour_is_named_before_any_rank_starts(monkeypatch, fn, detail):
    """The rehearsal in one process names a wrong neighbour or a deadlock at once: no real rank is
    asked, and no hang is waited out."""
    from mha_course.check import distributed as checks

    monkeypatch.setattr(checks, "_check_ring_on", _no_ranks)
    result = mc.check.ring_steps(fn)
    assert not result.passed and "likely mistake — wrong neighbour" in result.message, result
    assert detail is None or detail in result.details, result


@pytest.mark.parametrize("fn", [ring_backwards, ring_batch_backwards, ring_send_recv_backwards])
def test_the_real_ranks_record_every_form_of_send_and_receive(monkeypatch, fn):
    """Without the rehearsal, the recorder on the real ranks still sees every send and receive:
    isend / irecv, send / recv, and the P2POp list of batch_isend_irecv."""
    from mha_course.check import distributed as checks

    monkeypatch.setattr(checks, "_rehearse", lambda *args: None)
    result = checks._check_ring_on(checks.shippable(fn), 3, first=False)  # on 2 ranks backwards is forwards
    assert result is not None, "the recorder saw nothing wrong"
    assert not result.passed and "likely mistake — wrong neighbour" in result.message, result
    assert "rank 0 sent to rank 2" in result.message, result


def test_a_hang_the_rehearsal_cannot_follow_is_stopped_by_the_timeout(monkeypatch):
    """The last resort: a function the rehearsal cannot follow (it calls a barrier) that then hangs
    on the real ranks is stopped after RING_HANG_S and named (lowered here, not waited out)."""
    from mha_course.check import distributed as checks

    monkeypatch.setattr(checks, "RING_HANG_S", 2.0)
    fn = checks.shippable(ring_barrier_then_receives_first)
    assert checks._rehearsal_verdict(fn, *checks._ring_case(2), 2, True, "on 2 ranks") is None
    result = mc.check.ring_steps(ring_barrier_then_receives_first)
    assert not result.passed and "wrong neighbour: a rank waited for a block no rank sent it" in result.message
    assert "stopped after 2 s" in result.details, result


def test_the_rehearsal_leaves_torch_distributed_as_it_was():
    names = ("get_rank", "get_world_size", "is_initialized", "send", "recv", "isend", "irecv", "P2POp")
    before = {name: getattr(dist, name) for name in (*names, "batch_isend_irecv")}
    for fn in (ring_todo, ring_backwards, ring_batch_receive_from_next):  # decided by the rehearsal
        assert not mc.check.ring_steps(fn).passed
    assert {name: getattr(dist, name) for name in before} == before
    assert not dist.is_initialized()


def _pids(P):
    from mha_course.check import distributed as checks

    ranks = checks._POOL.get(P)
    return None if ranks is None else [proc.pid for proc in ranks._procs]


def test_the_ranks_serve_the_next_check_only_when_left_clean():
    """One start of the ranks serves many checks, but only while every send met its receive: a
    message left over could be received by the next check's ring and make a right ring look wrong."""
    assert mc.check.ring_steps(ring_isend).passed
    kept = _pids(2), _pids(3)
    assert None not in kept
    assert mc.check.ring_steps(ring_p_steps).message.startswith("ring_steps: likely mistake — one step too many")
    assert (_pids(2), _pids(3)) == kept  # the same processes ran the second check
    assert mc.check.ring_steps(ring_and_a_send_nobody_receives).passed  # the results are right ...
    assert _pids(2) is None and _pids(3) is None  # ... but those ranks are not used again


def test_what_the_rehearsal_prints_is_not_the_checks_output(capsys):
    result = mc.check.ring_steps(ring_that_prints)
    assert result.passed, result
    assert "starts" not in capsys.readouterr().out  # the ranks' threads printed into the rehearsal's sink
