"""The backward of every split, across real gloo ranks (127.0.0.1 only), against autograd through
one process: Megatron's f/g and sequence parallelism's collectives, tensor-parallel attention, the
ring, Ulysses, sequence parallelism and a 2 × 2 tensor × context mesh; bytes against the formulas.

Two process groups (2 and 4 ranks) are started once for the module and reused by every test."""

import pytest
import torch
from torch import nn

import mha_course as mc
from mha_course import distributed as md
from mha_course.distributed.tensor_parallel import _rows

F64 = torch.float64


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _err(a, b):
    return (a - b).abs().max().item()


def _one_process(q, k, v, grad_out, causal):
    """Autograd through one process: attention over the whole sequence and its gradients."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    n_rep = q.shape[1] // k.shape[1]
    mask = mc.causal_mask(q.shape[2]) if causal else None
    out = mc.scaled_dot_product_attention(q, mc.repeat_kv(k, n_rep), mc.repeat_kv(v, n_rep), mask)[0]
    out.backward(grad_out)
    return out.detach(), q.grad, k.grad, v.grad


def _tol(dtype):
    return 1e-12 if dtype == F64 else 2e-5


# --- the operators: forward and backward of each collective --------------------------------------


@pytest.mark.parametrize("P", [2, 4])
def test_f_and_g_are_each_others_adjoints(ranks, P):
    x, g = torch.randn(P, 3, 8, generator=_gen(1), dtype=F64), torch.randn(P, 3, 8, generator=_gen(2), dtype=F64)
    # f: identity forward, all-reduce backward
    results = ranks[P].run(md.collective_rank, "copy_to_ranks", x, g)
    for rank, (out, grad, fwd, bwd) in enumerate(results):
        assert torch.equal(out, x[rank])
        assert _err(grad, g.sum(0)) < 1e-12
        assert fwd == {} and bwd == {"all_reduce": 2 * (P - 1) * 3 * 8 * 8 // P}
    # g: all-reduce forward, identity backward
    results = ranks[P].run(md.collective_rank, "sum_over_ranks", x, g)
    for rank, (out, grad, fwd, bwd) in enumerate(results):
        assert _err(out, x.sum(0)) < 1e-12
        assert torch.equal(grad, g[rank])
        assert fwd == {"all_reduce": 2 * (P - 1) * 3 * 8 * 8 // P} and bwd == {}


@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("shape", [(2, 4, 3), (1, 8, 5)])
def test_gather_and_scatter_along_the_sequence(ranks, P, shape):
    B, Lb, d = shape  # each rank's block (B, Lb, d); the whole sequence is P·Lb positions
    x = torch.randn(P, B, Lb, d, generator=_gen(3), dtype=F64)
    g = torch.randn(P, B, P * Lb, d, generator=_gen(4), dtype=F64)
    block = (P - 1) * B * Lb * d * 8
    for rank, (out, grad, fwd, bwd) in enumerate(ranks[P].run(md.collective_rank, "gather_sequence", x, g)):
        assert torch.equal(out, torch.cat(list(x), dim=1))  # every rank's block, in rank order
        mine = slice(rank * Lb, (rank + 1) * Lb)
        assert _err(grad, g[:, :, mine].sum(0)) < 1e-12  # reduce-scatter: my block, summed over ranks
        assert fwd == {"all_gather": block} and bwd == {"reduce_scatter": block}
    x = torch.randn(P, B, P * Lb, d, generator=_gen(5), dtype=F64)
    g = torch.randn(P, B, Lb, d, generator=_gen(6), dtype=F64)
    for rank, (out, grad, fwd, bwd) in enumerate(ranks[P].run(md.collective_rank, "scatter_sequence", x, g)):
        assert _err(out, x.sum(0)[:, rank * Lb : (rank + 1) * Lb]) < 1e-12
        assert torch.equal(grad, torch.cat(list(g), dim=1))
        assert fwd == {"reduce_scatter": block} and bwd == {"all_gather": block}


@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize(
    "name", ["copy_to_ranks", "sum_over_ranks", "gather_sequence", "scatter_sequence", "all_to_all"]
)
def test_every_backward_is_the_adjoint(ranks, P, name):
    """<A(x), y> = <x, Aᵀ(y)>: the backward is the adjoint of the forward. A sharded tensor's inner
    product sums over the ranks; a replicated one (f's input, g's output: one tensor that every
    rank holds) counts once."""
    x = torch.randn(P, 2, 4 * P, 2 * P, 3, generator=_gen(7), dtype=F64)
    if name == "copy_to_ranks":
        x[:] = x[0]  # f's input is replicated
    out_shape = {
        "gather_sequence": (2, 4 * P * P, 2 * P, 3),
        "scatter_sequence": (2, 4, 2 * P, 3),
        "all_to_all": (2, 4, 2 * P * P, 3),
    }.get(name, (2, 4 * P, 2 * P, 3))
    y = torch.randn(P, *out_shape, generator=_gen(8), dtype=F64)
    if name == "sum_over_ranks":
        y[:] = y[0]  # g's output is replicated: its gradient is one tensor too
    results = ranks[P].run(md.collective_rank, name, x, y)
    outs, grads = [r[0] for r in results], [r[1] for r in results]
    out_ranks = range(1) if name == "sum_over_ranks" else range(P)
    in_ranks = range(1) if name == "copy_to_ranks" else range(P)
    forward_side = sum((outs[r] * y[r]).sum() for r in out_ranks)
    backward_side = sum((x[r] * grads[r]).sum() for r in in_ranks)
    assert abs(forward_side - backward_side) < 1e-10 * (1 + abs(forward_side))
    if name == "all_to_all":  # the transpose sends what the forward sent
        assert results[0][2] == results[0][3] == {"all_to_all": (P - 1) * 2 * 4 * (2 * P) * 3 * 8}


# --- tensor parallelism -----------------------------------------------------------------------------


def _check_shard_grads(module, grads, rank, P):
    """Each rank's weight shards' gradients = the matching slices of the full module's."""
    if isinstance(module, mc.MultiHeadAttention):
        h, h_kv, hd, proj = module.num_heads, module.num_heads, module.d_head, module.out_proj
    else:
        h, h_kv, hd, proj = module.num_heads, module.num_kv_heads, module.head_dim, module.o_proj
    q_heads, kv_heads = md.heads_of_rank(rank, P, h, h_kv)
    q_rows, kv_rows = _rows(q_heads, hd), _rows(kv_heads, hd)
    expected = {
        "q.weight": module.q_proj.weight.grad[q_rows],
        "k.weight": module.k_proj.weight.grad[kv_rows],
        "v.weight": module.v_proj.weight.grad[kv_rows],
        "o_weight": proj.weight.grad[:, q_rows],
    }
    if module.q_proj.bias is not None:
        expected |= {
            "q.bias": module.q_proj.bias.grad[q_rows],
            "k.bias": module.k_proj.bias.grad[kv_rows],
            "v.bias": module.v_proj.bias.grad[kv_rows],
            "o_bias": proj.bias.grad,
        }
    assert set(grads) == set(expected), (sorted(grads), sorted(expected))
    for name, want in expected.items():
        assert _err(grads[name], want) < 1e-12, (rank, name)


@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize(
    "kind, shape, causal",
    [
        ("mha", (2, 6, 32), False),
        ("mha", (1, 9, 16), True),
        ("gqa_split", (2, 8, 32), True),
        ("gqa_shared", (2, 5, 32), False),
    ],
)
def test_tensor_parallel_backward_equals_one_process(ranks, P, kind, shape, causal):
    torch.manual_seed(P + len(kind))
    B, L, d_model = shape
    module = {
        "mha": lambda: mc.MultiHeadAttention(d_model, 4),
        "gqa_split": lambda: mc.GroupedQueryAttention(d_model, 8, 4),  # h_kv = 4: split on 2 or 4 ranks
        "gqa_shared": lambda: mc.GroupedQueryAttention(d_model, 4, 1),  # one KV head on every rank
    }[kind]().double()
    x = torch.randn(B, L, d_model, generator=_gen(9), dtype=F64)
    grad_out = torch.randn(B, L, d_model, generator=_gen(10), dtype=F64)
    xr = x.clone().requires_grad_()
    expected = module(xr, mask=mc.causal_mask(L) if causal else None)[0]
    expected.backward(grad_out)
    results = ranks[P].run(md.tensor_parallel_backward_rank, module, x, grad_out, None, causal)
    formula = md.communication_bytes(
        "tensor", batch=B, length=L, num_heads=4, num_kv_heads=4, head_dim=d_model // 4, world_size=P,
        bytes_per_element=8, d_model=d_model,
    )  # fmt: skip
    back = md.communication_bytes(
        "tensor", batch=B, length=L, num_heads=4, num_kv_heads=4, head_dim=d_model // 4, world_size=P,
        bytes_per_element=8, d_model=d_model, direction="backward",
    )  # fmt: skip
    for rank, (out, dx, grads, fwd, bwd) in enumerate(results):
        assert _err(out, expected) < 1e-12
        assert _err(dx, xr.grad) < 1e-12  # f's all-reduce: every rank ends with the whole dx
        _check_shard_grads(module, grads, rank, P)
        assert fwd == {"all_reduce": formula} and bwd == {"all_reduce": back} and formula == back


def test_shared_kv_heads_need_their_gradients_summed(ranks):
    """A KV head replicated on two ranks: each copy's gradient alone holds only its rank's query
    heads' share; summed over the copies it is the head's gradient."""
    torch.manual_seed(0)
    module = mc.GroupedQueryAttention(16, 4, 2).double()  # on 4 ranks: KV head 0 on ranks 0 and 1
    x = torch.randn(1, 4, 16, generator=_gen(11), dtype=F64)
    module(x)[0].sum().backward()
    share = mc.GroupedQueryAttention(16, 4, 2).double()
    share.load_state_dict(module.state_dict())
    with torch.no_grad():
        share.o_proj.weight[:, 4:] = 0  # only query head 0 (rank 0's) reaches the output
    share(x)[0].sum().backward()
    kv_rows = _rows(torch.tensor([0]), 4)
    full, rank0_share = module.k_proj.weight.grad[kv_rows], share.k_proj.weight.grad[kv_rows]
    assert _err(full, rank0_share) > 1e-3
    assert md.MegatronAttention(module, 0, 4).shares_kv_heads and not md.MegatronAttention(module, 0, 2).shares_kv_heads
    results = ranks[4].run(md.tensor_parallel_backward_rank, module, x, torch.ones(1, 4, 16, dtype=F64))
    for rank in (0, 1):
        assert _err(results[rank][2]["k.weight"], full) < 1e-12


# --- ring attention ---------------------------------------------------------------------------------


@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("layout", ["contiguous", "balanced"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads, L, d", [((4, 2), 32, 8), ((2, 2), 16, 4), ((6, 3), 24, 5)])
def test_ring_backward_equals_one_process(ranks, P, layout, causal, heads, L, d):
    h, h_kv = heads
    g = _gen(12)
    q, k, v, grad_out = (torch.randn(2, n, L, d, generator=g, dtype=F64) for n in (h, h_kv, h_kv, h))
    expected = _one_process(q, k, v, grad_out, causal)
    results = ranks[P].run(md.ring_backward_rank, q, k, v, grad_out, causal, layout)
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        got = md.unshard_sequence([r[i] for r in results], layout)
        assert _err(got, expected[i]) < 1e-12, name
    kw = dict(batch=2, length=L, num_heads=h, num_kv_heads=h_kv, head_dim=d, world_size=P, bytes_per_element=8)
    block = 2 * 2 * h_kv * (L // P) * d * 8  # one rank's K and V, in bytes
    for *_, fwd, bwd in results:
        assert fwd == {"send": md.communication_bytes("ring", **kw)} == {"send": (P - 1) * block}
        assert (
            bwd == {"send": md.communication_bytes("ring", direction="backward", **kw)} == {"send": (2 * P - 1) * block}
        )


def test_ring_backward_float32(ranks):
    g = _gen(13)
    q, k, v, grad_out = (torch.randn(1, n, 16, 8, generator=g) for n in (4, 1, 1, 4))
    expected = _one_process(q, k, v, grad_out, True)
    results = ranks[4].run(md.ring_backward_rank, q, k, v, grad_out, True, "balanced")
    for i in range(4):
        assert _err(md.unshard_sequence([r[i] for r in results], "balanced"), expected[i]) < _tol(torch.float32)


def test_ring_backward_needs_the_global_lse(ranks):
    """The tile backward with each block's own log-sum-exp (softmax over the block only) is wrong:
    the global lse saved by the forward is what makes the recomputed weights the true ones."""
    g = _gen(14)
    q, k, v, grad_out = (torch.randn(1, 2, 8, 4, generator=g, dtype=F64) for _ in range(4))
    _, dq, dk, dv = _one_process(q, k, v, grad_out, False)
    # the backward of two half-sequences on their own, as if each half were all the keys
    halves = [_one_process(q, k[:, :, s], v[:, :, s], grad_out, False) for s in (slice(0, 4), slice(4, 8))]
    wrong_dk = torch.cat([halves[0][2], halves[1][2]], dim=2)
    assert _err(wrong_dk, dk) > 1e-3  # the per-block softmax gives other gradients
    results = ranks[2].run(md.ring_backward_rank, q, k, v, grad_out)
    assert _err(md.unshard_sequence([r[2] for r in results]), dk) < 1e-12


# --- Ulysses ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads, L, d", [((8, 4), 16, 4), ((8, 2), 8, 6), ((4, 4), 12, 8)])
def test_ulysses_backward_equals_one_process(ranks, P, causal, heads, L, d):
    h, h_kv = heads
    g = _gen(15)
    q, k, v, grad_out = (torch.randn(2, n, L, d, generator=g, dtype=F64) for n in (h, h_kv, h_kv, h))
    expected = _one_process(q, k, v, grad_out, causal)
    results = ranks[P].run(md.ulysses_backward_rank, q, k, v, grad_out, causal)
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        assert _err(md.unshard_sequence([r[i] for r in results]), expected[i]) < 1e-12, name
    kw = dict(batch=2, length=L, num_heads=h, num_kv_heads=h_kv, head_dim=d, world_size=P, bytes_per_element=8)
    by_hand = (P - 1) * 2 * (L // P) * (2 * h + 2 * max(h_kv, P)) * d * 8 // P  # four all-to-alls
    for *_, fwd, bwd in results:
        assert fwd == bwd == {"all_to_all": md.communication_bytes("ulysses", **kw)} == {"all_to_all": by_hand}


# --- sequence parallelism --------------------------------------------------------------------------------


def _norm(kind, d_model):
    norm = nn.LayerNorm(d_model) if kind == "layernorm" else mc.RMSNorm(d_model, compute_dtype=None)
    norm = norm.double()
    with torch.no_grad():
        for p in norm.parameters():
            p.copy_(torch.randn(p.shape, generator=_gen(16), dtype=F64))
    return norm


@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("norm_kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("shape, causal", [((2, 8, 32), True), ((1, 12, 16), False)])
def test_sequence_parallel_block_equals_one_process(ranks, P, norm_kind, shape, causal):
    B, L, d_model = shape
    torch.manual_seed(P)
    norm, module = _norm(norm_kind, d_model), mc.MultiHeadAttention(d_model, 4).double()
    x = torch.randn(B, L, d_model, generator=_gen(17), dtype=F64)
    grad_out = torch.randn(B, L, d_model, generator=_gen(18), dtype=F64)
    xr = x.clone().requires_grad_()
    expected = xr + module(norm(xr), mask=mc.causal_mask(L) if causal else None)[0]
    expected.backward(grad_out)
    tp = ranks[P].run(md.megatron_block_rank, norm, module, x, grad_out, False, causal)
    sp = ranks[P].run(md.megatron_block_rank, norm, module, x, grad_out, True, causal)
    assert _err(torch.cat([r["out"] for r in sp], dim=1), expected) < 1e-12
    assert _err(torch.cat([r["dx"] for r in sp], dim=1), xr.grad) < 1e-12
    for rank in range(P):
        assert _err(tp[rank]["out"], expected) < 1e-12 and _err(tp[rank]["dx"], xr.grad) < 1e-12
        for result in (tp[rank], sp[rank]):
            for name, p in norm.named_parameters():
                assert _err(result["grads"][f"norm.{name}"], p.grad) < 1e-12, name
            attention = {n: g for n, g in result["grads"].items() if not n.startswith("norm.")}
            _check_shard_grads(module, attention, rank, P)
    all_reduce = md.communication_bytes(
        "tensor", batch=B, length=L, num_heads=4, num_kv_heads=4, head_dim=d_model // 4, world_size=P,
        bytes_per_element=8,
    )  # fmt: skip
    sp_bytes = md.sequence_parallel_bytes(batch=B, length=L, d_model=d_model, world_size=P, bytes_per_element=8)
    for rank in range(P):
        assert tp[rank]["forward"] == tp[rank]["backward"] == {"all_reduce": all_reduce}
        assert sp[rank]["forward"] == sp[rank]["backward"] == sp_bytes
        assert sum(sp_bytes.values()) == all_reduce  # reduce-scatter + all-gather = one all-reduce
        replicated = [2 * (P - 1) * p.numel() * 8 // P for p in (*norm.parameters(), module.out_proj.bias)]
        assert sp[rank]["replicated_grads"] == {"all_reduce": sum(replicated)}
        assert tp[rank]["replicated_grads"] == {}
        full = md.norm_activation_elements(batch=B, length=L, d_model=d_model, world_size=P, sequence_parallel=False)
        shard = md.norm_activation_elements(batch=B, length=L, d_model=d_model, world_size=P, sequence_parallel=True)
        assert tp[rank]["norm_elements"] == full == 2 * B * L * d_model
        assert sp[rank]["norm_elements"] == shard == full // P


# --- a 2 × 2 mesh: tensor × context -------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["contiguous", "balanced"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind, shape", [("mha", (2, 8, 32)), ("gqa", (1, 12, 24)), ("gqa_shared", (2, 4, 16))])
def test_mesh_2x2_equals_one_process(ranks, layout, causal, kind, shape):
    B, L, d_model = shape
    torch.manual_seed(L)
    module = {
        "mha": lambda: mc.MultiHeadAttention(d_model, 4),
        "gqa": lambda: mc.GroupedQueryAttention(d_model, 4, 2),
        "gqa_shared": lambda: mc.GroupedQueryAttention(d_model, 4, 1),
    }[kind]().double()
    x = torch.randn(B, L, d_model, generator=_gen(19), dtype=F64)
    grad_out = torch.randn(B, L, d_model, generator=_gen(20), dtype=F64)
    xr = x.clone().requires_grad_()
    expected = module(xr, mask=mc.causal_mask(L) if causal else None)[0]
    expected.backward(grad_out)
    results = ranks[4].run(md.mesh_rank, module, x, grad_out, 2, causal, layout)
    assert sorted((r["t"], r["c"]) for r in results) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    h = module.num_heads
    h_kv = getattr(module, "num_kv_heads", h)
    hd = d_model // h
    for rank, r in enumerate(results):
        pos = r["positions"]
        assert r["t"] == rank % 2 and r["c"] == rank // 2
        assert _err(r["out"], expected[:, pos]) < 1e-12
        assert _err(r["dx"], xr.grad[:, pos]) < 1e-12
        _check_shard_grads(module, r["grads"], r["t"], 2)
        tensor = md.communication_bytes(
            "tensor", batch=B, length=L // 2, num_heads=h, num_kv_heads=h_kv, head_dim=hd, world_size=2,
            bytes_per_element=8, d_model=d_model,
        )  # fmt: skip
        assert r["tensor_forward"] == r["tensor_backward"] == {"all_reduce": tensor}
        local_kv = len(md.heads_of_rank(r["t"], 2, h, h_kv)[1])  # the KV heads this rank's ring carries
        kw = dict(batch=B, length=L, num_heads=h // 2, num_kv_heads=local_kv, head_dim=hd, world_size=2)
        assert r["ring_forward"] == {"send": md.communication_bytes("ring", bytes_per_element=8, **kw)}
        assert r["ring_backward"] == {
            "send": md.communication_bytes("ring", bytes_per_element=8, direction="backward", **kw)
        }


def test_one_process_references_leave_their_inputs_alone_and_run_without_grad_mode():
    torch.manual_seed(0)
    module, norm = mc.MultiHeadAttention(16, 4).double(), nn.LayerNorm(16).double()
    x, grad_out = (torch.randn(1, 4, 16, generator=_gen(21), dtype=F64) for _ in range(2))
    with torch.no_grad():
        out, dx, grads = md.one_process_grads(module, x, grad_out, norm=norm, is_causal=True)
    assert module.q_proj.weight.grad is None and not x.requires_grad
    xr = x.clone().requires_grad_()
    (xr + module(norm(xr), mask=mc.causal_mask(4))[0]).backward(grad_out)
    assert _err(dx, xr.grad) < 1e-12 and _err(grads["norm.weight"], norm.weight.grad) < 1e-12
    shard = md.shard_of_grads(grads, module, 1, 2)
    _check_shard_grads(module, {n: g for n, g in shard.items() if not n.startswith("norm.")}, 1, 2)
    assert torch.equal(
        md.flat_grads(shard, ["o_bias", "norm.bias"]), torch.cat([grads["out_proj.bias"], grads["norm.bias"]])
    )


# --- bad input ----------------------------------------------------------------------------------------


def test_bad_input_names_the_argument():
    q = torch.zeros(1, 4, 8, 2)
    with pytest.raises(ValueError, match="q .* must agree"):
        md.ring_attention_autograd(q, torch.zeros(1, 2, 4, 2), torch.zeros(1, 2, 4, 2))
    with pytest.raises(ValueError, match="num_heads=4 must be a multiple of num_kv_heads=3"):
        md.ring_attention_autograd(q, torch.zeros(1, 3, 8, 2), torch.zeros(1, 3, 8, 2))
    with pytest.raises(TypeError, match="traffic must be a GroupTraffic, got Traffic"):
        md.ring_attention_autograd(q, q, q, traffic=md.Traffic())
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        md.ring_attention_autograd([1.0], q, q)
    with pytest.raises(TypeError, match="backward_traffic must be a GroupTraffic, got dict"):
        md.copy_to_ranks(q, {})
    with pytest.raises(TypeError, match="norm must be an nn.Module"):
        md.MegatronBlock("layernorm", mc.MultiHeadAttention(8, 2), 0, 2)
    with pytest.raises(ValueError, match="length=10 must be divisible by world_size=4"):
        md.sequence_parallel_bytes(batch=1, length=10, d_model=8, world_size=4)
    with pytest.raises(ValueError, match="name must be one of"):
        md.collective_rank("all_reduce", q, q)
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        md.norm_activation_elements(batch=1, length=8, d_model=8, world_size=0, sequence_parallel=True)
