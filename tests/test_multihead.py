"""MultiHeadAttention and LoopedMultiHeadAttention against torch.nn.MultiheadAttention with
identical weights: outputs and per-head weights, both weight-transfer directions, batch_first
True and False, self- and cross-attention (kdim/vdim), bias on/off, masks translated between
conventions (ours True = attend; torch's bool masks True = blocked), fully masked rows."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import mha_course as mc

SETTINGS = settings(max_examples=30, deadline=None, database=None)
TOL = {torch.float32: {"atol": 3e-5, "rtol": 1e-4}, torch.float64: {"atol": 1e-10, "rtol": 1e-9}}
MASK_KINDS = ["none", "2d", "4d", "4d_shared_heads", "padding", "causal_padding"]


def close(actual, expected, dtype):
    torch.testing.assert_close(actual, expected, **TOL[dtype])


@torch.no_grad()
def randomize(module, gen, scale=0.4):
    """Every parameter random (nn.MultiheadAttention initialises its biases to 0, which would
    hide any bias bug)."""
    for p in module.parameters():
        p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale)
    return module


def make_mask(kind, B, h, Lq, Lk, gen):
    """Our mask (True = attend) and the equivalent nn.MultiheadAttention kwargs (True = blocked).
    Some kinds contain query rows with no allowed key."""
    if kind == "none":
        return None, {}
    if kind == "2d":
        m = torch.rand(Lq, Lk, generator=gen) < 0.6
        return m, {"attn_mask": ~m}
    if kind in ("4d", "4d_shared_heads"):
        m = torch.rand(B, h if kind == "4d" else 1, Lq, Lk, generator=gen) < 0.6
        return m, {"attn_mask": ~m.expand(B, h, Lq, Lk).reshape(B * h, Lq, Lk)}  # torch: (B*h, Lq, Lk), b-major
    lengths = torch.randint(0, Lk + 1, (B,), generator=gen)  # a length of 0 masks a whole sequence
    pad = torch.arange(Lk)[None, :] < lengths[:, None]  # (B, Lk)
    if kind == "padding":
        return pad[:, None, None, :], {"key_padding_mask": ~pad}
    causal = torch.tensor([[j <= i + Lk - Lq for j in range(Lk)] for i in range(Lq)])
    return causal & pad[:, None, None, :], {"attn_mask": ~causal, "key_padding_mask": ~pad}


@st.composite
def mha_case(draw):
    h, d_head = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    mode = draw(st.sampled_from(["self", "cross", "cross_kdim"]))
    B, Lq = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    Lk = Lq if mode == "self" else draw(st.integers(1, 5))
    kdim = draw(st.integers(1, 7)) if mode == "cross_kdim" else None
    vdim = draw(st.integers(1, 7)) if mode == "cross_kdim" else None
    return {
        "d": h * d_head,
        "h": h,
        "mode": mode,
        "B": B,
        "Lq": Lq,
        "Lk": Lk,
        "kdim": kdim,
        "vdim": vdim,
        "bias": draw(st.booleans()),
        "batch_first": draw(st.booleans()),
        "dtype": draw(st.sampled_from([torch.float32, torch.float64])),
        "mask": draw(st.sampled_from(MASK_KINDS)),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def inputs(c, gen):
    d, dt = c["d"], c["dtype"]
    x = torch.randn(c["B"], c["Lq"], d, generator=gen, dtype=dt)
    if c["mode"] == "self":
        return x, None, None
    key = torch.randn(c["B"], c["Lk"], c["kdim"] or d, generator=gen, dtype=dt)
    value = torch.randn(c["B"], c["Lk"], c["vdim"] or d, generator=gen, dtype=dt)
    return x, key, value


def run_torch(tm, query, key, value, batch_first, **kw):
    """nn.MultiheadAttention on batch-first tensors, whatever its batch_first; returns batch-first."""
    key = query if key is None else key
    value = query if value is None else value
    if not batch_first:
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    out, w = tm(query, key, value, average_attn_weights=False, **kw)
    return (out if batch_first else out.transpose(0, 1)), w


def compare(ours_out, ours_w, ref_out, ref_w, mask, c):
    """Equal where torch is defined (rows with >= 1 allowed key); ours finite everywhere."""
    B, h, Lq, Lk = c["B"], c["h"], c["Lq"], c["Lk"]
    assert torch.isfinite(ours_out).all() and torch.isfinite(ours_w).all()
    if mask is None:
        close(ours_out, ref_out, c["dtype"])
        close(ours_w, ref_w, c["dtype"])
        return
    head_rows = mask.expand(B, h, Lq, Lk).any(-1)  # (B, h, Lq): this head of this query sees a key
    out_rows = head_rows.all(1)  # torch's output row is NaN as soon as one head sees nothing
    close(ours_out[out_rows], ref_out[out_rows], c["dtype"])
    close(ours_w[head_rows], ref_w[head_rows], c["dtype"])
    assert (ours_w[~head_rows] == 0).all()


@SETTINGS
@given(mha_case())
@torch.no_grad()
def test_from_torch_matches_torch(c):
    gen = torch.Generator().manual_seed(c["seed"])
    tm = nn.MultiheadAttention(
        c["d"], c["h"], bias=c["bias"], kdim=c["kdim"], vdim=c["vdim"], batch_first=c["batch_first"], dtype=c["dtype"]
    ).eval()
    randomize(tm, gen)
    ours = mc.MultiHeadAttention.from_torch(tm).eval()
    query, key, value = inputs(c, gen)
    mask, torch_kw = make_mask(c["mask"], c["B"], c["h"], c["Lq"], c["Lk"], gen)
    out, w = ours(query, key, value, mask=mask)
    ref_out, ref_w = run_torch(tm, query, key, value, c["batch_first"], **torch_kw)
    compare(out, w, ref_out, ref_w, mask, c)


@SETTINGS
@given(mha_case())
@torch.no_grad()
def test_to_torch_matches_ours(c):
    gen = torch.Generator().manual_seed(c["seed"])
    ours = mc.MultiHeadAttention(c["d"], c["h"], bias=c["bias"], kdim=c["kdim"], vdim=c["vdim"]).to(c["dtype"])
    randomize(ours, gen).eval()
    tm = ours.to_torch().eval()
    assert tm.batch_first
    if not c["batch_first"]:  # the same weights in a sequence-first module
        seq_first = nn.MultiheadAttention(
            c["d"], c["h"], bias=c["bias"], kdim=c["kdim"], vdim=c["vdim"], dtype=c["dtype"]
        ).eval()
        seq_first.load_state_dict(tm.state_dict())
        tm = seq_first
    query, key, value = inputs(c, gen)
    mask, torch_kw = make_mask(c["mask"], c["B"], c["h"], c["Lq"], c["Lk"], gen)
    out, w = ours(query, key, value, mask=mask)
    ref_out, ref_w = run_torch(tm, query, key, value, c["batch_first"], **torch_kw)
    compare(out, w, ref_out, ref_w, mask, c)


@SETTINGS
@given(mha_case())
@torch.no_grad()
def test_need_weights_false_equals_explicit_path(c):
    """The fused-SDPA path gives the same output, fully masked rows included (0 from attention)."""
    gen = torch.Generator().manual_seed(c["seed"])
    ours = mc.MultiHeadAttention(c["d"], c["h"], bias=c["bias"], kdim=c["kdim"], vdim=c["vdim"]).to(c["dtype"])
    randomize(ours, gen).eval()
    query, key, value = inputs(c, gen)
    mask, torch_kw = make_mask(c["mask"], c["B"], c["h"], c["Lq"], c["Lk"], gen)
    out, w = ours(query, key, value, mask=mask)
    fast, none = ours(query, key, value, mask=mask, need_weights=False)
    assert none is None and torch.isfinite(fast).all()
    close(fast, out, c["dtype"])
    # and torch's own need_weights=False agrees where it is defined
    tm = ours.to_torch().eval()
    ref, _ = tm(query, query if key is None else key, query if value is None else value, need_weights=False, **torch_kw)
    rows = torch.ones(c["B"], c["Lq"], dtype=torch.bool)
    if mask is not None:
        rows = mask.expand(c["B"], c["h"], c["Lq"], c["Lk"]).any(-1).all(1)
    close(fast[rows], ref[rows], c["dtype"])


@SETTINGS
@given(mha_case())
@torch.no_grad()
def test_fully_masked_query_gives_only_the_output_bias(c):
    gen = torch.Generator().manual_seed(c["seed"])
    ours = mc.MultiHeadAttention(c["d"], c["h"], bias=c["bias"], kdim=c["kdim"], vdim=c["vdim"]).to(c["dtype"])
    randomize(ours, gen).eval()
    query, key, value = inputs(c, gen)
    mask = torch.ones(c["Lq"], c["Lk"], dtype=torch.bool)
    mask[0] = False  # query 0 may attend to nothing
    expected = ours.out_proj.bias if c["bias"] else torch.zeros(c["d"], dtype=c["dtype"])
    for need_weights in (True, False):
        out, _ = ours(query, key, value, mask=mask, need_weights=need_weights)
        assert torch.isfinite(out).all()
        close(out[:, 0], expected.expand(c["B"], c["d"]), c["dtype"])


@SETTINGS
@given(mha_case())
@torch.no_grad()
def test_self_attention_equals_passing_copies_of_x(c):
    """key=value=None (self-attention) and passing copies of x compute the same function."""
    gen = torch.Generator().manual_seed(c["seed"])
    ours = mc.MultiHeadAttention(c["d"], c["h"], bias=c["bias"]).to(c["dtype"])
    randomize(ours, gen).eval()
    x = torch.randn(c["B"], c["Lq"], c["d"], generator=gen, dtype=c["dtype"])
    out, w = ours(x)
    out2, w2 = ours(x, x.clone(), x.clone())
    close(out, out2, c["dtype"])
    close(w, w2, c["dtype"])


@st.composite
def looped_case(draw):
    c = draw(mha_case())
    c.update(mode="self", Lk=c["Lq"], kdim=None, vdim=None)
    return c


@SETTINGS
@given(looped_case())
@torch.no_grad()
def test_looped_matches_torch_and_to_fused(c):
    gen = torch.Generator().manual_seed(c["seed"])
    looped = mc.LoopedMultiHeadAttention(c["d"], c["h"], bias=c["bias"]).to(c["dtype"])
    randomize(looped, gen).eval()
    # torch's in_proj_weight stacks [W_Q; W_K; W_V], each the h per-head (d_head, d) matrices stacked by rows
    tm = nn.MultiheadAttention(c["d"], c["h"], bias=c["bias"], batch_first=True, dtype=c["dtype"]).eval()
    tm.in_proj_weight.copy_(torch.cat([looped.heads[i][n].weight for n in "qkv" for i in range(c["h"])]))
    tm.out_proj.weight.copy_(looped.out_proj.weight)
    if c["bias"]:
        tm.in_proj_bias.copy_(torch.cat([looped.heads[i][n].bias for n in "qkv" for i in range(c["h"])]))
        tm.out_proj.bias.copy_(looped.out_proj.bias)
    x = torch.randn(c["B"], c["Lq"], c["d"], generator=gen, dtype=c["dtype"])
    mask, torch_kw = make_mask(c["mask"], c["B"], c["h"], c["Lq"], c["Lk"], gen)
    out, w = looped(x, mask=mask)
    ref_out, ref_w = tm(x, x, x, average_attn_weights=False, **torch_kw)
    compare(out, w, ref_out, ref_w, mask, c)
    fused = looped.to_fused().eval()
    assert isinstance(fused, mc.MultiHeadAttention)
    f_out, f_w = fused(x, mask=mask)
    close(f_out, out, c["dtype"])
    close(f_w, w, c["dtype"])


@torch.no_grad()
def test_dropout_is_inactive_in_eval_and_active_in_training():
    gen = torch.Generator().manual_seed(0)
    tm = randomize(nn.MultiheadAttention(8, 2, dropout=0.5, batch_first=True).eval(), gen)
    ours = mc.MultiHeadAttention.from_torch(tm).eval()
    assert ours.dropout == 0.5
    x = torch.randn(2, 5, 8, generator=gen)
    ref, _ = tm(x, x, x, average_attn_weights=False)
    out, _ = ours(x)
    close(out, ref, torch.float32)
    ours.train()
    torch.manual_seed(0)
    trained, _ = ours(x)
    assert not torch.allclose(trained, out)


def test_gradients_flow_through_fully_masked_rows_without_nan():
    gen = torch.Generator().manual_seed(0)
    ours = randomize(mc.MultiHeadAttention(8, 2), gen)
    x = torch.randn(2, 4, 8, generator=gen, requires_grad=True)
    mask = mc.padding_mask([0, 3], 4)  # sequence 0 is all padding
    for need_weights in (True, False):
        ours.zero_grad()
        x.grad = None
        out, _ = ours(x, mask=mask, need_weights=need_weights)
        out.sum().backward()
        assert torch.isfinite(x.grad).all()
        assert all(torch.isfinite(p.grad).all() for p in ours.parameters())
