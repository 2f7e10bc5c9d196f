"""The backward pass (mha_course.backward): every gradient against autograd through PyTorch's own
F.scaled_dot_product_attention in float64, gradcheck, masks, GQA and bad inputs."""

import pytest
import torch
import torch.nn.functional as F

import mha_course as mc
from mha_course import backward as bw
from mha_course import backward_dropout as bdrop
from mha_course.lessons import backward_pass as bp_lesson
from mha_course.tiled import tiled_attention

F64 = torch.float64
TOL = 1e-10


def _randn(*shape, g):
    return torch.randn(*shape, generator=g, dtype=F64)


def autograd_grads(q, k, v, grad_out, mask=None, *, scale=None, enable_gqa=False):
    """The reference: autograd through PyTorch's SDPA (mask True = attend, as the course's)."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
    out.backward(grad_out)
    return q.grad, k.grad, v.grad


def assert_close(got, expected):
    for name, a, b in zip(("dq", "dk", "dv"), got, expected, strict=True):
        assert a.shape == b.shape, (name, a.shape, b.shape)
        err = (a - b).abs().max().item()
        assert err < TOL, f"{name}: max abs error {err:.3g}"


SHAPES = [  # (q shape, k shape, v shape): Lq ≠ Lk, d_k ≠ d_v, batch and head dims, broadcasting
    ((7, 5), (11, 5), (11, 4)),
    ((2, 9, 8), (2, 6, 8), (2, 6, 3)),
    ((2, 3, 7, 5), (2, 3, 13, 5), (2, 3, 13, 6)),
    ((2, 3, 7, 5), (1, 3, 10, 5), (1, 3, 10, 2)),  # k, v broadcast over the batch
    ((2, 4, 16, 8), (2, 1, 16, 8), (2, 1, 16, 8)),  # one K/V head broadcast to every query head
]


@pytest.mark.parametrize("block_size", [3, 4, 64])
@pytest.mark.parametrize("shapes", SHAPES)
def test_attention_backward_equals_autograd(shapes, block_size):
    g = torch.Generator().manual_seed(0)
    q, k, v = (_randn(*s, g=g) for s in shapes)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    grad_out = _randn(*batch, q.shape[-2], v.shape[-1], g=g)
    assert_close(bw.attention_backward(q, k, v, grad_out, block_size=block_size), autograd_grads(q, k, v, grad_out))


def test_custom_scale():
    g = torch.Generator().manual_seed(1)
    q, k, v, go = _randn(2, 6, 4, g=g), _randn(2, 9, 4, g=g), _randn(2, 9, 3, g=g), _randn(2, 6, 3, g=g)
    got = bw.attention_backward(q, k, v, go, scale=0.3, block_size=4)
    assert_close(got, autograd_grads(q, k, v, go, scale=0.3))


@pytest.mark.parametrize("Lq,Lk", [(12, 12), (5, 12)])
def test_causal_mask(Lq, Lk):
    g = torch.Generator().manual_seed(2)
    q, k, v = _randn(2, 3, Lq, 8, g=g), _randn(2, 3, Lk, 8, g=g), _randn(2, 3, Lk, 5, g=g)
    go = _randn(2, 3, Lq, 5, g=g)
    mask = mc.causal_mask(Lq, Lk)  # the queries are the last Lq positions
    got = bw.attention_backward(q, k, v, go, mask, block_size=4)
    assert_close(got, autograd_grads(q, k, v, go, mask))
    # a key a query may not see gets no gradient from it: perturb dO of the earliest query only
    only_first = torch.zeros_like(go)
    only_first[..., 0, :] = 1.0
    _, dk, dv = bw.attention_backward(q, k, v, only_first, mask, block_size=4)
    blocked = ~mask[0]  # the keys query 0 may not see
    assert torch.all(dk[..., blocked, :] == 0) and torch.all(dv[..., blocked, :] == 0)


def test_padding_mask():
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([9, 4, 1])
    mask = mc.padding_mask(lengths, 9)  # (3, 1, 1, 9)
    q, k, v = _randn(3, 2, 9, 6, g=g), _randn(3, 2, 9, 6, g=g), _randn(3, 2, 9, 4, g=g)
    go = _randn(3, 2, 9, 4, g=g)
    got = bw.attention_backward(q, k, v, go, mask, block_size=4)
    assert_close(got, autograd_grads(q, k, v, go, mask))
    assert torch.all(got[1][2, :, 1:] == 0)  # padded keys get no gradient


def test_fully_masked_rows_get_zero_not_nan():
    """A query with no allowed key attends to nothing (output 0): its dq is 0 and it sends nothing
    to K and V. Reference: the same inputs with that query's dO set to 0 and its row unmasked."""
    g = torch.Generator().manual_seed(4)
    q, k, v = _randn(2, 8, 4, g=g), _randn(2, 10, 4, g=g), _randn(2, 10, 3, g=g)
    go = _randn(2, 8, 3, g=g)
    mask = torch.rand(2, 8, 10, generator=g) < 0.5
    mask[..., 0] = True
    dead = torch.tensor([1, 6])
    mask[0, dead] = False  # queries 1 and 6 of sequence 0 see no key
    got = bw.attention_backward(q, k, v, go, mask, block_size=3)
    assert not any(torch.isnan(t).any() for t in got)
    assert torch.all(got[0][0, dead] == 0)
    ref_mask, ref_go = mask.clone(), go.clone()
    ref_mask[0, dead], ref_go[0, dead] = True, 0.0
    assert_close(got, autograd_grads(q, k, v, ref_go, ref_mask))


@pytest.mark.parametrize("h,h_kv", [(8, 2), (6, 3), (4, 1), (4, 4)])
def test_gqa_sums_each_group(h, h_kv):
    g = torch.Generator().manual_seed(5)
    q, k, v = _randn(2, h, 7, 8, g=g), _randn(2, h_kv, 10, 8, g=g), _randn(2, h_kv, 10, 5, g=g)
    go = _randn(2, h, 7, 5, g=g)
    mask = mc.causal_mask(7, 10)
    got = bw.attention_backward(q, k, v, go, mask, block_size=4, enable_gqa=True)
    assert got[1].shape == k.shape and got[2].shape == v.shape
    assert_close(got, autograd_grads(q, k, v, go, mask, enable_gqa=True))


def test_repeat_kv_backward_is_the_adjoint_of_repeat_kv():
    """⟨repeat_kv(x), y⟩ = ⟨x, repeat_kv_backward(y)⟩ for all x, y, and = autograd of repeat_kv."""
    g = torch.Generator().manual_seed(6)
    x, y = _randn(2, 3, 5, 4, g=g), _randn(2, 12, 5, 4, g=g)
    assert torch.allclose((mc.repeat_kv(x, 4) * y).sum(), (x * bw.repeat_kv_backward(y, 4)).sum())
    xr = x.clone().requires_grad_()
    mc.repeat_kv(xr, 4).backward(y)
    assert torch.allclose(xr.grad, bw.repeat_kv_backward(y, 4), atol=1e-12)


def test_softmax_backward_equals_autograd():
    g = torch.Generator().manual_seed(7)
    s = _randn(2, 3, 5, 7, g=g).requires_grad_()
    dp = _randn(2, 3, 5, 7, g=g)
    p = torch.softmax(s, dim=-1)
    p.backward(dp)
    assert (bw.softmax_backward(p.detach(), dp) - s.grad).abs().max() < TOL


def test_backward_tile_sums_to_the_whole():
    """One tile with every key and query = the full gradient (the loop adds nothing else)."""
    g = torch.Generator().manual_seed(8)
    q, k, v, go = _randn(6, 4, g=g), _randn(9, 4, g=g), _randn(9, 3, g=g), _randn(6, 3, g=g)
    out, lse = tiled_attention(q, k, v, return_lse=True)
    delta = (go * out).sum(-1, keepdim=True)
    got = bw.backward_tile(q, k, v, go, lse, delta, scale=0.5)
    assert_close(got, autograd_grads(q, k, v, go))


def test_lse_is_the_log_sum_exp_and_tiled_output_unchanged():
    g = torch.Generator().manual_seed(9)
    q, k, v = _randn(2, 10, 4, g=g), _randn(2, 13, 4, g=g), _randn(2, 13, 3, g=g)
    mask = torch.rand(2, 10, 13, generator=g) < 0.5
    mask[0, 3] = False
    out, lse = tiled_attention(q, k, v, mask, block_size=4, return_lse=True)
    s = (q @ k.transpose(-2, -1) / 2.0).masked_fill(~mask, float("-inf"))
    assert torch.allclose(lse, torch.logsumexp(s, dim=-1, keepdim=True), atol=1e-12)
    assert lse[0, 3].item() == float("-inf")
    assert torch.equal(out, tiled_attention(q, k, v, mask, block_size=4))


@pytest.mark.parametrize("gqa", [False, True])
def test_flash_attention_loss_backward_equals_autograd(gqa):
    g = torch.Generator().manual_seed(10)
    h_kv = 2 if gqa else 4
    q, k, v = _randn(2, 4, 9, 6, g=g), _randn(2, h_kv, 12, 6, g=g), _randn(2, h_kv, 12, 5, g=g)
    go = _randn(2, 4, 9, 5, g=g)
    mask = mc.causal_mask(9, 12)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = bw.flash_attention(*leaves, mask, block_size=4, enable_gqa=gqa)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    assert (out - ref).abs().max() < TOL
    (out * go).sum().backward()
    assert_close([t.grad for t in leaves], autograd_grads(q, k, v, go, mask, enable_gqa=gqa))


def test_gradcheck():
    g = torch.Generator().manual_seed(11)
    q, k, v = (_randn(*s, g=g).requires_grad_() for s in ((1, 2, 5, 3), (1, 2, 7, 3), (1, 1, 7, 2)))
    mask = torch.rand(5, 7, generator=g) < 0.6
    mask[:, 0] = True

    def fn(q, k, v):
        return bw.flash_attention(q, k, v, mask, block_size=3)

    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_saves_no_score_matrix():
    """What the autograd graph keeps for backward: O(L·d) numbers, not the (L, L) weights."""
    from mha_course.kit.memory import peak_memory

    L, d = 512, 16
    q, k, v = (torch.randn(1, L, d, requires_grad=True) for _ in range(3))
    outs = {}

    def forward(fn):
        outs["out"] = fn()  # kept alive: its graph holds what the backward needs

    flash = peak_memory(lambda: forward(lambda: bw.flash_attention(q, k, v, block_size=64)))
    plain = peak_memory(lambda: forward(lambda: mc.scaled_dot_product_attention(q, k, v)[0]))
    score_matrix = L * L * 4
    assert flash < score_matrix / 4 < score_matrix <= plain


@pytest.mark.parametrize(
    "call,error,words",
    [
        (lambda q, k, v, go: bw.attention_backward(q, k, v, go[..., :2]), ValueError, "grad_out must have"),
        (lambda q, k, v, go: bw.attention_backward(q, k, v, go.float()), TypeError, "grad_out must have q's dtype"),
        (lambda q, k, v, go: bw.attention_backward(q, k, v, "x"), TypeError, "grad_out must be a torch.Tensor"),
        (lambda q, k, v, go: bw.attention_backward(q, k[..., :3], v, go), ValueError, "same last dim d_k"),
        (lambda q, k, v, go: bw.attention_backward(q, k, v, go, torch.ones(4, 6)), TypeError, "mask must be bool"),
        (
            lambda q, k, v, go: bw.attention_backward(q, k, v, go, torch.ones(3, 6, dtype=torch.bool)),
            ValueError,
            "does not broadcast",
        ),
        (lambda q, k, v, go: bw.attention_backward(q, k, v, go, block_size=0), ValueError, "block_size"),
        (
            lambda q, k, v, go: bw.attention_backward(q, k[:, :3], v[:, :3], go, enable_gqa=True),
            ValueError,
            "not a multiple of",
        ),
        (lambda q, k, v, go: bw.flash_attention(q, k, v[:, :2], enable_gqa=True), ValueError, "same number of heads"),
        (lambda q, k, v, go: bw.flash_attention(q[0], k[0], v[0], enable_gqa=True), ValueError, "must be 4-D"),
        (lambda q, k, v, go: bw.repeat_kv_backward(go, 3), ValueError, "not a multiple of n_rep=3"),
    ],
)
def test_bad_inputs(call, error, words):
    g = torch.Generator().manual_seed(12)
    q, k, v, go = _randn(2, 4, 4, 5, g=g), _randn(2, 4, 6, 5, g=g), _randn(2, 4, 6, 3, g=g), _randn(2, 4, 4, 3, g=g)
    with pytest.raises(error, match=words):
        call(q, k, v, go)


def test_exported():
    assert mc.attention_backward is bw.attention_backward
    assert mc.flash_attention is bw.flash_attention


# ---------------------------------------------------------------------------------------------
# notebook 13's helpers (mha_course.lessons.backward_pass)


def test_mha_backward_by_hand_equals_autograd():
    from mha_course.lessons import backward_pass as lesson

    torch.manual_seed(0)
    for bias in (True, False):
        mha = mc.MultiHeadAttention(24, 3, bias=bias).double()
        x = torch.randn(2, 7, 24, dtype=F64, requires_grad=True)
        dy = torch.randn(2, 7, 24, dtype=F64)
        mask = mc.padding_mask(torch.tensor([7, 3]), 7)
        hand = lesson.mha_backward(mha, x.detach(), dy, mask)
        mha.zero_grad()
        mha(x, mask=mask)[0].backward(dy)
        reference = {"x": x.grad, **{n: p.grad for n, p in mha.named_parameters()}}
        assert set(hand) == set(reference)
        for name in reference:
            assert (hand[name] - reference[name]).abs().max() < TOL, name


def test_backward_flops_counted_equal_the_formula():
    from mha_course.lessons import backward_pass as lesson

    counts = lesson.backward_flops(mc.MultiHeadAttention(32, 4), torch.randn(2, 16, 32), block_size=8)
    B, L, d = 2, 16, 32
    assert counts["forward"] == counts["formula forward"] == 8 * B * L * d**2 + 4 * B * L**2 * d
    assert counts["backward"] == 2 * counts["forward"]
    assert counts["core backward"] == 2 * counts["core forward"] == 2 * 4 * B * L**2 * d
    assert counts["recomputing backward"] == 5 * 2 * B * L**2 * d  # one more Q Kᵀ than autograd's four


def test_training_memory_grows_with_l_squared_only_when_stored():
    from mha_course.lessons import backward_pass as lesson

    small, large = lesson.training_memory([128, 512], num_heads=2, d_head=16, block_size=64, repeats=1)
    assert large["stored_bytes"] >= 2 * large["score_bytes"]  # at least the weights and their gradient
    assert large["recomputed_bytes"] < large["score_bytes"] / 2
    assert large["stored_bytes"] / small["stored_bytes"] > 10  # 16× the L²
    assert large["recomputed_bytes"] / small["recomputed_bytes"] < 4.5  # ~4× the L
    assert large["time_ratio"] > 0


def test_saturation_shrinks_the_gradient():
    from mha_course.lessons import backward_pass as lesson

    rows = lesson.saturation([1, 128, 512])
    assert rows[0]["max_weight"] < rows[1]["max_weight"] < rows[2]["max_weight"] <= 1
    assert rows[2]["grad_norm"] < 1e-3 * rows[0]["grad_norm"]


# --- the backward with the key blocks in parallel -------------------------------------------------


def _parallel_case(seed, mask_kind):
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(2, 3, 12, 4, generator=g, dtype=torch.float64) for _ in range(4))
    mask = None
    if mask_kind == "causal":
        mask = torch.ones(12, 12, dtype=torch.bool).tril()
    elif mask_kind == "no key for one query":
        mask = torch.rand(2, 3, 12, 12, generator=g) < 0.6
        mask[..., 0] = True
        mask[1, 2, 5] = False
    out, lse = tiled_attention(q, k, v, mask, return_lse=True)
    q_, k_, v_ = (t.clone().requires_grad_() for t in (q, k, v))
    torch.nn.functional.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask).nan_to_num(0.0).backward(do)
    return (q, k, v, out, lse, do, mask), (q_.grad, k_.grad, v_.grad)


@pytest.mark.parametrize("mask_kind", [None, "causal", "no key for one query"])
@pytest.mark.parametrize("block_size", [3, 4, 5])
def test_two_pass_backward_equals_autograd(mask_kind, block_size):
    args, reference = _parallel_case(block_size, mask_kind)
    grads = bw.two_pass_backward(*args, block_size=block_size)
    for ours, ref in zip(grads, reference, strict=True):
        assert (ours - ref.nan_to_num(0.0)).abs().max() < 1e-12


@pytest.mark.parametrize("mask_kind", [None, "causal", "no key for one query"])
def test_key_blocks_with_atomic_adds_equal_autograd_in_any_order(mask_kind):
    args, (dq_ref, dk_ref, dv_ref) = _parallel_case(7, mask_kind)
    dqs = []
    for order in ([0, 1, 2, 3], [3, 1, 0, 2], [2, 3, 1, 0]):
        dq, dk, dv = bw.key_block_backward(*args, block_size=3, order=order)
        assert dq.dtype == torch.float32
        assert (dq.double() - dq_ref.nan_to_num(0.0)).abs().max() < 1e-5  # a float32 buffer
        assert (dk - dk_ref).abs().max() < 1e-12 and (dv - dv_ref).abs().max() < 1e-12
        dqs.append(dq)
    if mask_kind is None:  # float32 addition is not associative: another arrival order, other bits
        assert not torch.equal(dqs[0], dqs[1]) or not torch.equal(dqs[0], dqs[2])


def test_unsynchronised_dq_updates_are_lost():
    args, (dq_ref, _, _) = _parallel_case(8, None)
    q, k, v, out, lse, do, mask = args
    raced, _, _ = bw.key_block_backward(*args, block_size=3, race=True)
    assert (raced.double() - dq_ref).abs().max() > 0.1  # far from the gradient
    # what is left of each dQ_i is the last key block's share alone: dS of keys 9-11 times their K
    scores = q @ k.transpose(-2, -1) / 2.0
    p = torch.softmax(scores, dim=-1)
    ds = p * (do @ v.transpose(-2, -1) - (do * out).sum(-1, keepdim=True))
    last = ds[..., 9:12] @ k[..., 9:12, :] / 2.0
    assert (raced.double() - last).abs().max() < 1e-5


def test_two_pass_costs_seven_products_per_tile_instead_of_five():
    from torch.utils.flop_counter import FlopCounterMode

    args, _ = _parallel_case(9, None)

    def flops(fn):
        with FlopCounterMode(display=False) as counter:
            fn(*args, block_size=4)
        return counter.get_total_flops()

    one_pass, two_pass = flops(bw.tiled_attention_backward), flops(bw.two_pass_backward)
    B, h, L, d = args[0].shape
    assert one_pass == 5 * 2 * B * h * L * L * d  # S, dV, dP, dQ, dK: 5 products of L·L·d per head
    assert two_pass == 7 * 2 * B * h * L * L * d


# ---------------------------------------------------------------------------------------------
# dropout in the tiled backward: the mask redrawn from the seed, never stored

DROPOUT_SHAPES = [  # (batch dims, Lq, Lk, d_k, d_v, block_size)
    ((2, 3), 7, 7, 5, 3, 3),
    ((1, 2), 9, 11, 4, 6, 4),
    ((4,), 6, 13, 3, 2, 8),
    ((2, 2), 16, 16, 8, 8, 16),
]


def _dropout_case(batch, Lq, Lk, d_k, d_v, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, Lq, d_k, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(*batch, Lk, d_k, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(*batch, Lk, d_v, generator=g, dtype=torch.float64, requires_grad=True)
    grad_out = torch.randn(*batch, Lq, d_v, generator=g, dtype=torch.float64)
    return q, k, v, grad_out


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("case", DROPOUT_SHAPES)
def test_flash_dropout_equals_autograd_through_dense_reference_with_the_same_mask(case, is_causal, p):
    batch, Lq, Lk, d_k, d_v, bs = case
    q, k, v, grad_out = _dropout_case(batch, Lq, Lk, d_k, d_v)
    out = bdrop.flash_dropout_attention(q, k, v, p=p, seed=11, is_causal=is_causal, block_size=bs)
    mine = torch.autograd.grad(out, (q, k, v), grad_out)
    keep = bdrop.dropout_keep(11, (*batch, Lq, Lk), p, block_size=bs)
    ref_out = bdrop.dense_dropout_attention(q, k, v, keep, p, is_causal=is_causal)
    ref = torch.autograd.grad(ref_out, (q, k, v), grad_out)
    assert (out - ref_out).abs().max() < 1e-12
    for a, b in zip(mine, ref, strict=True):
        assert (a - b).abs().max() < 1e-12


@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_dropout_with_p_zero_equals_torch_sdpa(is_causal):
    q, k, v, grad_out = _dropout_case((2, 3), 10, 10, 4, 5, seed=3)
    out = bdrop.flash_dropout_attention(q, k, v, p=0.0, seed=0, is_causal=is_causal, block_size=4)
    ref_out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    mine = torch.autograd.grad(out, (q, k, v), grad_out)
    ref = torch.autograd.grad(ref_out, (q, k, v), grad_out)
    assert (out - ref_out).abs().max() < 1e-12
    for a, b in zip(mine, ref, strict=True):
        assert (a - b).abs().max() < 1e-12


def test_a_different_mask_in_the_reference_gives_different_gradients():
    q, k, v, grad_out = _dropout_case((2,), 8, 8, 4, 4)
    out = bdrop.flash_dropout_attention(q, k, v, p=0.5, seed=1, block_size=4)
    mine = torch.autograd.grad(out, (q, k, v), grad_out)
    other = bdrop.dropout_keep(2, (2, 8, 8), 0.5, block_size=4)
    ref = torch.autograd.grad(bdrop.dense_dropout_attention(q, k, v, other, 0.5), (q, k, v), grad_out)
    assert (mine[2] - ref[2]).abs().max() > 1e-3


def test_keep_mask_rate_and_redrawing():
    keep = bdrop.dropout_keep(5, (4, 64, 64), 0.3, block_size=16)
    assert abs(keep.float().mean().item() - 0.7) < 0.02
    assert torch.equal(keep, bdrop.dropout_keep(5, (4, 64, 64), 0.3, block_size=16))
    assert not torch.equal(keep, bdrop.dropout_keep(6, (4, 64, 64), 0.3, block_size=16))
    assert torch.equal(bdrop.tile_keep(5, 16, 32, (4, 16, 16), 0.3), keep[:, 16:32, 32:48])


def test_flash_dropout_saves_no_square_tensor():
    q, k, v, _ = _dropout_case((1, 2), 32, 32, 4, 4)
    _, saved = bp_lesson.saved_activations(lambda: bdrop.flash_dropout_attention(q, k, v, p=0.1, seed=0, block_size=8))
    assert saved and all(shape[-2:] != (32, 32) for shape, *_ in saved)
    keep = bdrop.dropout_keep(0, (1, 2, 32, 32), 0.1, block_size=8)
    _, dense = bp_lesson.saved_activations(lambda: bdrop.dense_dropout_attention(q, k, v, keep, 0.1))
    assert any(shape[-2:] == (32, 32) and dtype == torch.bool for shape, dtype, *_ in dense)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [({"p": 1.0, "seed": 0}, ValueError, "p must be"), ({"p": 0.1, "seed": -1}, TypeError, "seed must be"),
     ({"p": 0.1, "seed": 0, "block_size": 0}, ValueError, "block_size")],
)  # fmt: skip
def test_flash_dropout_rejects_bad_arguments(kwargs, error, words):
    q, k, v, _ = _dropout_case((1,), 4, 4, 2, 2)
    with pytest.raises(error, match=words):
        bdrop.flash_dropout_attention(q, k, v, **kwargs)


def test_checkpoint_comparison_bytes_and_flops():
    B, h, d = 1, 2, 8
    rows = {
        (r["L"], r["way"]): r
        for r in bp_lesson.checkpoint_comparison([32, 64], batch=B, num_heads=h, d_head=d, block_size=16)
    }
    for L in (32, 64):
        inputs = 3 * B * h * L * d * 4  # q, k, v in float32
        # autograd keeps P and P̃ (float32) and the bool mask: 9 bytes per (query, key) pair
        assert rows[L, "autograd"]["saved_bytes"] == inputs + B * h * L * L * 9
        assert rows[L, "checkpoint"]["saved_bytes"] == inputs and rows[L, "checkpoint"]["square"] == 0
        assert rows[L, "flash"]["saved_bytes"] == inputs + B * h * L * (d + 1) * 4  # + out and lse
        assert rows[L, "checkpoint"]["same_grads"]
        product = 2 * B * h * L * L * d  # one (L, d) @ (d, L) product
        assert rows[L, "autograd"]["forward_flops"] == 2 * product
        assert rows[L, "autograd"]["backward_flops"] == 4 * product
        # the rerun stops once P is recomputed (S and P: one product), as FlashAttention recomputes S
        assert rows[L, "checkpoint"]["backward_flops"] == rows[L, "flash"]["backward_flops"] == 5 * product
