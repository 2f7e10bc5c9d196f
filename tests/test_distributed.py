"""Attention across real gloo ranks (127.0.0.1 only) against one-process attention.

Two process groups (2 and 4 ranks) are started once for the module and reused by every test; each
has a timeout, so a rank that hangs fails its test instead of hanging the run."""

import math
import time

import pytest
import torch

import mha_course as mc
from mha_course import distributed as md
from mha_course.tiled import merge_partials

TIMEOUT = 60.0


def _tol(dtype):
    return 1e-12 if dtype == torch.float64 else 1e-5


def _seeded(seed):
    return torch.Generator().manual_seed(seed)


# --- tensor parallelism ------------------------------------------------------------------------


@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_tensor_parallel_mha_equals_one_process(ranks, P, dtype):
    torch.manual_seed(P)
    module = mc.MultiHeadAttention(32, 8).to(dtype)
    x = torch.randn(2, 6, 32, dtype=dtype)
    mask = torch.rand(2, 1, 6, 6, generator=_seeded(1)) < 0.7
    mask[..., 0] = True
    expected, _ = module(x, mask=mask)
    results = ranks[P].run(md.tensor_parallel_rank, module, x, mask)
    for rank, (out, (q_heads, kv_heads), sent) in enumerate(results):
        assert (out - expected).abs().max() < _tol(dtype), rank
        assert q_heads == list(range(rank * 8 // P, (rank + 1) * 8 // P)) == kv_heads
        payload = 2 * 6 * 32 * x.element_size()  # one (B, L, d_model) all-reduce
        assert sent == {"all_reduce": 2 * (P - 1) * payload // P}  # what a ring all-reduce sends per rank


@pytest.mark.parametrize(
    ("P", "h", "h_kv", "expected_kv"),
    [
        (2, 8, 4, [[0, 1], [2, 3]]),  # ranks ≤ KV heads: the KV heads are split
        (4, 8, 2, [[0], [0], [1], [1]]),  # ranks > KV heads: each KV head replicated on 2 ranks
        (4, 4, 1, [[0], [0], [0], [0]]),  # MQA: the one KV head on every rank
    ],
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_tensor_parallel_gqa_equals_one_process(ranks, P, h, h_kv, expected_kv, dtype):
    torch.manual_seed(h * h_kv)
    module = mc.GroupedQueryAttention(32, h, h_kv, bias=True).to(dtype)
    x = torch.randn(3, 5, 32, dtype=dtype)
    expected, _ = module(x, is_causal=True)
    results = ranks[P].run(md.tensor_parallel_rank, module, x, None, True)
    assert [kv for _, (_, kv), _ in results] == expected_kv
    for out, _, _ in results:
        assert (out - expected).abs().max() < _tol(dtype)


def test_heads_of_rank_rejects_bad_splits():
    with pytest.raises(ValueError, match="num_heads=6 is not divisible by world_size=4"):
        md.heads_of_rank(0, 4, 6, 6)
    with pytest.raises(ValueError, match="rank must be an int in \\[0, world_size=2\\)"):
        md.heads_of_rank(2, 2, 4, 4)
    with pytest.raises(ValueError, match="num_heads=6 is not divisible"):
        md.TensorParallelAttention(mc.MultiHeadAttention(12, 6), 0, 4)
    # 12 query heads, 3 KV heads on 2 ranks: rank 0 would read KV heads [0, 1], rank 1 [1, 2]
    with pytest.raises(ValueError, match="num_kv_heads=3 is neither a multiple nor a divisor of world_size=2"):
        md.heads_of_rank(0, 2, 12, 3)
    assert md.heads_of_rank(1, 4, 12, 2)[1].tolist() == [0]  # 4 = 2·2: each KV head on two ranks
    with pytest.raises(TypeError, match="MultiHeadAttention or GroupedQueryAttention"):
        md.TensorParallelAttention(torch.nn.Linear(4, 4), 0, 2)


def _dtensor_available():
    try:
        from torch.distributed.device_mesh import init_device_mesh  # noqa: F401
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel  # noqa: F401
    except ImportError as exc:  # pragma: no cover - recorded as the skip reason
        return str(exc)
    return ""


@pytest.mark.skipif(bool(_dtensor_available()), reason=f"DTensor tensor parallelism missing: {_dtensor_available()}")
@pytest.mark.parametrize(("P", "module"), [(2, "mha"), (4, "mha"), (2, "gqa")])
def test_pytorch_tensor_parallel_equals_the_course(ranks, P, module):
    """PyTorch's ColwiseParallel / RowwiseParallel on a CPU mesh (gloo) = the course's split = one process."""
    torch.manual_seed(7)
    m = mc.MultiHeadAttention(16, 4).double() if module == "mha" else mc.GroupedQueryAttention(16, 4, 2).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    expected, _ = m(x)
    reference = ranks[P].run(md.dtensor_rank, m, x)
    ours = ranks[P].run(md.tensor_parallel_rank, m, x)
    for theirs, (out, _, _) in zip(reference, ours, strict=True):
        assert (theirs - expected).abs().max() < 1e-12
        assert (theirs - out).abs().max() < 1e-12


# --- sequence parallelism ----------------------------------------------------------------------


def _qkv(B, h, h_kv, L, d, dtype, seed):
    g = _seeded(seed)
    return (torch.randn(B, n, L, d, generator=g, dtype=dtype) for n in (h, h_kv, h_kv))


def _one_process(q, k, v, causal):
    n_rep = q.shape[1] // k.shape[1]
    mask = mc.causal_mask(q.shape[2]) if causal else None
    return mc.scaled_dot_product_attention(q, mc.repeat_kv(k, n_rep), mc.repeat_kv(v, n_rep), mask)[0]


@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "balanced"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ring_attention_equals_one_process(ranks, P, causal, layout, dtype):
    B, h, h_kv, L, d = 2, 4, 2, 16, 8
    q, k, v = _qkv(B, h, h_kv, L, d, dtype, seed=P + 10 * causal)
    results = ranks[P].run(md.ring_rank, q, k, v, causal, layout)
    out = md.unshard_sequence([r[0] for r in results], layout)
    assert (out - _one_process(q, k, v, causal)).abs().max() < _tol(dtype)
    per_rank = md.communication_bytes(
        "ring",
        batch=B,
        length=L,
        num_heads=h,
        num_kv_heads=h_kv,
        head_dim=d,
        world_size=P,
        bytes_per_element=q.element_size(),
    )
    assert [r[2] for r in results] == [{"send": per_rank}] * P
    assert per_rank == (P - 1) * 2 * B * h_kv * (L // P) * d * q.element_size()


@pytest.mark.parametrize("P", [2, 4])
def test_causal_ring_work_per_rank(ranks, P):
    """The sequence in 2P chunks of c positions: with contiguous blocks rank r computes 4r + 3 of the
    causal chunk pairs (the last rank most); the balanced layout gives every rank 2P + 1. The total,
    P(2P + 1) pairs (the chunks on and below the diagonal), is the same."""
    B, h, L, d = 1, 2, 8 * P, 4
    q, k, v = _qkv(B, h, h, L, d, torch.float64, seed=3)
    chunk = (L // (2 * P)) ** 2  # scores in one (query chunk, key chunk) pair
    contiguous = [r[1] for r in ranks[P].run(md.ring_rank, q, k, v, True, "contiguous")]
    balanced = [r[1] for r in ranks[P].run(md.ring_rank, q, k, v, True, "balanced")]
    assert contiguous == [(4 * r + 3) * chunk for r in range(P)]
    assert balanced == [(2 * P + 1) * chunk] * P
    assert sum(balanced) == sum(contiguous) == P * (2 * P + 1) * chunk
    full = [r[1] for r in ranks[P].run(md.ring_rank, q, k, v, False, "contiguous")]
    assert full == [L * L // P] * P  # without a mask every rank computes all its L/P × L scores


@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ulysses_equals_one_process(ranks, P, causal, dtype):
    B, h, h_kv, L, d = 2, 8, 4, 12, 4
    q, k, v = _qkv(B, h, h_kv, L, d, dtype, seed=20 + P)
    results = ranks[P].run(md.ulysses_rank, q, k, v, causal)
    out = md.unshard_sequence([r[0] for r in results])
    assert (out - _one_process(q, k, v, causal)).abs().max() < _tol(dtype)
    chunk = B * (L // P) * d * q.element_size()  # one head of one rank's block
    by_hand = 2 * (P - 1) * (h // P) * chunk + 2 * (P - 1) * (h_kv // P) * chunk  # Q and out, K and V
    formula = md.communication_bytes(
        "ulysses",
        batch=B,
        length=L,
        num_heads=h,
        num_kv_heads=h_kv,
        head_dim=d,
        world_size=P,
        bytes_per_element=q.element_size(),
    )
    assert [r[1] for r in results] == [{"all_to_all": by_hand}] * P
    assert formula == by_hand


@pytest.mark.parametrize(("h", "h_kv"), [(8, 2), (4, 1)])
def test_ulysses_repeats_too_few_kv_heads_to_one_per_rank(ranks, h, h_kv):
    B, L, d, P = 2, 8, 4, 4
    q, k, v = _qkv(B, h, h_kv, L, d, torch.float64, seed=h + h_kv)
    results = ranks[P].run(md.ulysses_rank, q, k, v, True)
    out = md.unshard_sequence([r[0] for r in results])
    assert (out - _one_process(q, k, v, True)).abs().max() < 1e-12
    chunk = B * (L // P) * d * q.element_size()  # one head of one rank's block
    by_hand = 2 * (P - 1) * (h // P) * chunk + 2 * (P - 1) * 1 * chunk  # Q and out; K and V, one head per rank
    formula = md.communication_bytes(
        "ulysses", batch=B, length=L, num_heads=h, num_kv_heads=h_kv, head_dim=d, world_size=P, bytes_per_element=8
    )
    assert [r[1] for r in results] == [{"all_to_all": by_hand}] * P
    assert formula == by_hand


def test_ulysses_needs_heads_divisible_by_ranks():
    q, k, v = _qkv(1, 3, 3, 8, 4, torch.float64, seed=0)
    with pytest.raises(RuntimeError, match="num_heads=3 is not divisible by 2 ranks"):
        md.launch(md.ulysses_rank, 2, q, k, v, timeout=TIMEOUT)


def test_ulysses_formula_needs_heads_divisible_by_ranks():
    with pytest.raises(ValueError, match="num_kv_heads=3 divisible by it or a divisor of it"):
        md.communication_bytes("ulysses", batch=1, length=64, num_heads=32, num_kv_heads=3, head_dim=4, world_size=16)


def test_tensor_parallel_bytes_formula():
    payload = 2 * 6 * 32 * 4
    assert (
        md.communication_bytes("tensor", batch=2, length=6, num_heads=8, num_kv_heads=8, head_dim=4, world_size=4)
        == 2 * 3 * payload // 4
    )


LLAMA = dict(batch=1, length=131072, num_heads=32, num_kv_heads=8, head_dim=128, bytes_per_element=2)


def test_wire_bytes_of_a_llama_3_8b_like_layer():
    mib = {
        (scheme, P): md.communication_bytes(scheme, **LLAMA, world_size=P) / 2**20
        for scheme in ("tensor", "ring", "ulysses")
        for P in (4, 8, 16)
    }
    # the all-reduce's payload is B·L·d_model·2 bytes = 1,024 MiB; a ring sends 2(P-1)/P of it
    assert [mib["tensor", P] for P in (4, 8, 16)] == [1536, 1792, 1920]
    assert [mib["ring", P] for P in (4, 8, 16)] == [384, 448, 480]  # (P-1)/P of 2·h_kv·L·d_head·2 bytes
    # 16 ranks, 8 KV heads: each repeated twice, so K and V count as 16 heads
    assert [mib["ulysses", P] for P in (4, 8, 16)] == [480, 280, 180]


def test_backward_bytes():
    for P in (2, 4, 8):
        forward = {s: md.communication_bytes(s, **LLAMA, world_size=P) for s in ("tensor", "ring", "ulysses")}
        backward = {
            s: md.communication_bytes(s, **LLAMA, world_size=P, direction="backward")
            for s in ("tensor", "ring", "ulysses")
        }
        assert backward["tensor"] == forward["tensor"]  # the all-reduce of dx
        assert backward["ulysses"] == forward["ulysses"]  # the same four all-to-alls, reversed
        block = 2 * 1 * 8 * (131072 // P) * 128 * 2  # one rank's K and V block, bf16
        assert forward["ring"] == (P - 1) * block
        assert backward["ring"] == (P - 1) * block + P * block  # K/V round again, dK/dV one step further
    with pytest.raises(ValueError, match="direction must be 'forward' or 'backward'"):
        md.communication_bytes("ring", **LLAMA, world_size=4, direction="both")


@pytest.mark.parametrize("P", [2, 4])
def test_ring_all_reduce_equals_all_reduce_and_sends_what_the_counter_counts(ranks, P):
    x = torch.randn(3, 8, generator=_seeded(P), dtype=torch.float64)
    results = ranks[P].run(md.ring_all_reduce_rank, x)
    payload = x.numel() * x.element_size()
    for error, by_sends, counted in results:
        assert error < 1e-12
        assert by_sends == counted == 2 * (P - 1) * payload // P


# --- the merge and the sharding helpers (one process) -----------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_merge_partials_equals_attention_over_all_keys(dtype):
    g = _seeded(5)
    q, k, v = (torch.randn(2, 3, 7, 4, generator=g, dtype=dtype) for _ in range(3))
    scores = q @ k.transpose(-2, -1) / 2

    def partial(keys):
        s = scores[..., keys]
        return torch.softmax(s, -1) @ v[..., keys, :], torch.logsumexp(s, -1)

    out, lse = merge_partials(*partial(slice(0, 3)), *partial(slice(3, 7)))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert (out - expected).abs().max() < _tol(dtype)
    assert (lse - torch.logsumexp(scores, -1)).abs().max() < _tol(dtype)


def test_shard_and_unshard_round_trip():
    x = torch.arange(16.0).view(1, 16, 1)
    for layout in ("contiguous", "balanced"):
        shards = [md.shard_sequence(x, r, 4, layout, dim=1) for r in range(4)]
        assert torch.equal(md.unshard_sequence(shards, layout, dim=1), x)
    assert md.sequence_positions(16, 1, 4, "balanced").tolist() == [2, 3, 12, 13]
    with pytest.raises(ValueError, match="length=12 must be divisible by 8"):
        md.sequence_positions(12, 0, 4, "balanced")
    with pytest.raises(ValueError, match="layout must be one of"):
        md.sequence_positions(12, 0, 4, "striped")


# --- the launcher -------------------------------------------------------------------------------


def test_launcher_rejects_what_it_cannot_start():
    with pytest.raises(ValueError, match=f"at most {md.MAX_WORLD_SIZE}"):
        md.Ranks(md.MAX_WORLD_SIZE + 1)
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        md.Ranks(0)
    with pytest.raises(ValueError, match="start_method='teleport' is not available"):
        md.Ranks(2, start_method="teleport")


def test_launcher_refuses_a_function_a_process_cannot_import(ranks):
    with pytest.raises(TypeError, match="not importable by name"):
        ranks[2].run(lambda: 1)


def test_launch_returns_each_ranks_result_in_order():
    assert md.launch(torch.distributed.get_rank, 2, timeout=TIMEOUT) == [0, 1]


def test_a_hung_rank_fails_instead_of_hanging():
    with md.Ranks(2, timeout=TIMEOUT) as group:  # a start slowed by a busy machine is not the hang tested
        group.timeout = 1.0
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="did not answer within timeout=1 s during sleep"):
            group.run(time.sleep, 30)
        assert time.monotonic() - start < 20
        with pytest.raises(RuntimeError, match="were stopped"):
            group.run(time.sleep, 0)


def test_a_rank_error_is_raised_with_its_traceback():
    with md.Ranks(2, timeout=TIMEOUT) as group:
        with pytest.raises(RuntimeError, match="(?s)rank [01] raised during sqrt.*ValueError: math domain error"):
            group.run(math.sqrt, -1.0)
        with pytest.raises(RuntimeError, match="were stopped"):
            group.run(math.sqrt, 1.0)


@pytest.mark.slow
def test_launch_under_torchrun(tmp_path):
    """Under torchrun the launcher starts nothing: each torchrun process runs its own rank."""
    import os
    import random
    import socket
    import subprocess
    import sys

    script = tmp_path / "tp.py"
    script.write_text(
        "import sys, torch, mha_course as mc\n"
        "from mha_course import distributed as md\n"
        "torch.manual_seed(0)\n"
        "m = mc.MultiHeadAttention(16, 4).double(); x = torch.randn(2, 8, 16, dtype=torch.float64)\n"
        "res = md.launch(md.tensor_parallel_rank, 2, m, x)\n"
        "err = max((out - m(x)[0]).abs().max().item() for out, _, _ in res)\n"
        # each rank writes a file of its own: two ranks printing to one pipe can interleave their words
        "rank = torch.distributed.get_rank()\n"
        "line = f'heads {[r[1][0] for r in res]} ok {err < 1e-12}'\n"
        "open(sys.argv[1] + f'/rank{rank}.txt', 'w').write(line)\n"
    )

    def free_port():
        # below the range the OS hands out for port 0 (32768-60999 on Linux), so that no socket another
        # process opens meanwhile takes it; a port taken all the same is tried again with another
        while True:
            port = random.randrange(20000, 32000)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port

    env = {**os.environ, "PYTHONPATH": str(__import__("pathlib").Path(mc.__file__).parent.parent)}
    for _ in range(3):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            str(script),
            str(tmp_path),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
        if "address already in use" not in done.stderr.lower():
            break
    assert done.returncode == 0, done.stderr[-2000:]
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.txt").read_text() == "heads [[0, 1], [2, 3]] ok True", rank


# --- the package's layout ----------------------------------------------------------------------


def test_each_part_of_the_design_lives_in_its_own_module_and_keeps_its_public_name():
    homes = {
        "launcher": ["Ranks", "launch", "MAX_WORLD_SIZE"],
        "traffic": ["Traffic", "ring_all_reduce"],
        "tensor_parallel": ["heads_of_rank", "TensorParallelAttention", "tensor_parallel_rank", "dtensor_rank"],
        "layouts": ["sequence_positions", "shard_sequence", "unshard_sequence"],
        "ring": ["ring_attention", "ring_rank"],
        "ulysses": ["ulysses_attention", "ulysses_rank"],
        "allgather": ["allgather_attention", "allgather_rank"],
        "costs": ["communication_bytes"],
    }
    import importlib

    for module, names in homes.items():
        home = importlib.import_module(f"mha_course.distributed.{module}")
        for name in names:
            assert getattr(md, name) is getattr(home, name), (module, name)
    assert mc.ring_attention is md.ring_attention and mc.Ranks is md.Ranks  # the top-level names too


@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("layout", ["contiguous", "balanced"])
@pytest.mark.parametrize("causal", [False, True])
def test_allgather_context_parallelism_equals_one_process_and_sends_the_rings_bytes(ranks, P, layout, causal):
    B, h, h_kv, L, d = 2, 4, 2, 16, 4
    q, k, v = _qkv(B, h, h_kv, L, d, torch.float64, seed=30 + P + causal)
    results = ranks[P].run(md.allgather_rank, q, k, v, causal, layout)
    out = md.unshard_sequence([r[0] for r in results], layout)
    assert (out - _one_process(q, k, v, causal)).abs().max() < 1e-12
    block = 2 * B * h_kv * (L // P) * d * 8  # one rank's K and V
    ring = md.communication_bytes(
        "ring", batch=B, length=L, num_heads=h, num_kv_heads=h_kv, head_dim=d, world_size=P, bytes_per_element=8
    )
    assert [r[1] for r in results] == [{"all_gather": (P - 1) * block}] * P
    assert ring == (P - 1) * block


# --- shipping a function that the ranks cannot import by name -----------------------------------

_SCALE = 3.0  # a global the shipped function reads: it travels by pickling


def _scaled(x):
    return x * _SCALE


def rank_and_scaled(x):  # defined in a test file, as in a notebook cell: travels by its source
    return torch.distributed.get_rank(), _scaled(x)


def test_a_function_not_importable_by_name_travels_by_its_source(ranks):
    assert md.shippable(rank_and_scaled) is not rank_and_scaled  # this file is not importable on a rank
    assert md.shippable(md.ring_rank) is md.ring_rank  # the course's functions travel by name
    got = ranks[2].run(rank_and_scaled, torch.arange(3.0))
    assert [r for r, _ in got] == [0, 1]
    for _, x in got:
        torch.testing.assert_close(x, torch.tensor([0.0, 3.0, 6.0]))


def test_a_file_written_from_a_notebook_runs_afresh_each_time(ranks, tmp_path):
    path = tmp_path / "rank_job.py"
    for factor in (10, 20):  # rewritten between runs, as %%writefile does: the ranks see the new code
        path.write_text(
            f"import torch.distributed as dist\n\n\ndef job(a):\n    return dist.get_rank() + {factor} * a\n"
        )
        assert ranks[2].run(f"{path}:job", 1) == [factor, factor + 1]


def test_what_cannot_travel_is_refused_with_what_to_do(ranks):
    def nested(x):
        return x

    with pytest.raises(TypeError, match="nested function"):
        ranks[2].run(nested, 1)
    with pytest.raises(ValueError, match="expected 'module:function'"):
        ranks[2].run("no_colon_here", 1)
    with pytest.raises(FileNotFoundError, match="no file"):
        ranks[2].run("missing_file.py:job", 1)
    with pytest.raises(AttributeError, match="has no function 'nope'"):
        ranks[2].run("mha_course.distributed:nope", 1)
    with pytest.raises(TypeError, match="must be a function"):
        ranks[2].run(42)


@pytest.mark.slow
def test_ranks_end_when_the_process_that_started_them_ends_without_closing_them():
    """A kernel killed, or a process that ends with os._exit (an xdist worker does), never closes
    its Ranks: the ranks notice that it is gone and end too, instead of waiting forever."""
    import subprocess
    import sys

    script = (
        "import os\n"
        "from mha_course import distributed as md\n"
        "ranks = md.Ranks(2)\n"
        "print(*ranks.run(os.getpid), flush=True)\n"
        "os._exit(0)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2, out.stdout + out.stderr
    deadline = time.monotonic() + 4 * md.launcher.PARENT_CHECK_S + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if md.launcher._alive(p)]
    assert not alive, f"ranks {alive} outlived the process that started them"
