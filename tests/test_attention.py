"""mc.scaled_dot_product_attention against two independent references: a naive pure-Python
loop over (batch, query, key) written here from the formula, and PyTorch's own
F.scaled_dot_product_attention. Property-based over batch shapes, lengths (Lq != Lk), widths
(d_k != d_v), masks (random, causal, padding, rows with no allowed key), scales and dtypes."""

import math

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import mha_course as mc

SETTINGS = settings(max_examples=40, deadline=None, database=None)
DTYPES = st.sampled_from([torch.float32, torch.float64])
TOL = {torch.float32: {"atol": 2e-5, "rtol": 1e-4}, torch.float64: {"atol": 1e-10, "rtol": 1e-9}}
MASK_KINDS = st.sampled_from(["none", "random", "causal", "padding", "empty_rows"])


def close(actual, expected, dtype):
    torch.testing.assert_close(actual.double(), expected.double(), **TOL[dtype])


def naive_attention(q, k, v, mask, scale):
    """Reference from the definition, one number at a time, in Python floats (float64).

    q (N, Lq, dk), k (N, Lk, dk), v (N, Lk, dv), mask (N, Lq, Lk) bool or None.
    A query with no allowed key gets weights 0 and output 0.
    """
    Q, K, V = q.double().tolist(), k.double().tolist(), v.double().tolist()
    M = None if mask is None else mask.tolist()
    outs, weights = [], []
    for n in range(len(Q)):
        out_n, w_n = [], []
        for i in range(len(Q[n])):
            allowed = [j for j in range(len(K[n])) if M is None or M[n][i][j]]
            s = {j: scale * sum(a * b for a, b in zip(Q[n][i], K[n][j], strict=True)) for j in allowed}
            w = [0.0] * len(K[n])
            if allowed:
                top = max(s.values())
                e = {j: math.exp(s[j] - top) for j in allowed}
                z = sum(e.values())
                for j in allowed:
                    w[j] = e[j] / z
            out_n.append([sum(w[j] * V[n][j][c] for j in range(len(K[n]))) for c in range(len(V[n][0]))])
            w_n.append(w)
        outs.append(out_n)
        weights.append(w_n)
    return torch.tensor(outs, dtype=torch.float64), torch.tensor(weights, dtype=torch.float64)


def make_mask(kind, batch, lq, lk, gen):
    """A bool mask (True = may attend) of the given kind, built without mha_course, and a shape
    that exercises broadcasting: (Lq, Lk), (*batch, 1, Lk) or (*batch, Lq, Lk)."""
    if kind == "none":
        return None
    if kind == "random":  # full shape, at least one allowed key per row
        m = torch.rand(*batch, lq, lk, generator=gen) < 0.6
        m[..., 0] = True
        return m
    if kind == "causal":  # bottom-right aligned; rows i with i + lk - lq < 0 see nothing
        return torch.tensor([[j <= i + lk - lq for j in range(lk)] for i in range(lq)])
    if kind == "padding":  # per batch element a length in [1, lk], broadcast over queries
        lengths = torch.randint(1, lk + 1, batch or (1,), generator=gen)
        m = torch.arange(lk) < lengths[..., None]
        return m.reshape(*batch, 1, lk)
    # "empty_rows": random, and some query rows entirely False
    m = torch.rand(*batch, lq, lk, generator=gen) < 0.5
    m[..., torch.rand(lq, generator=gen) < 0.4, :] = False
    m[..., 0, :] = False
    return m


@st.composite
def attention_case(draw):
    dtype = draw(DTYPES)
    batch = draw(st.sampled_from([(), (2,), (3,), (2, 3)]))
    lq, lk = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    dk, dv = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q = torch.randn(*batch, lq, dk, generator=gen, dtype=dtype)
    k = torch.randn(*batch, lk, dk, generator=gen, dtype=dtype)
    v = torch.randn(*batch, lk, dv, generator=gen, dtype=dtype)
    mask = make_mask(draw(MASK_KINDS), batch, lq, lk, gen)
    scale = draw(st.sampled_from([None, 1.0, 0.3, 2.5]))
    return q, k, v, mask, scale, dtype


def flat(t, batch, last2):
    """Expand to (*batch, *last2) and flatten the batch dims to one N dim."""
    return t.expand(*batch, *last2).reshape(-1, *last2)


@SETTINGS
@given(attention_case())
def test_matches_naive_loop(case):
    q, k, v, mask, scale, dtype = case
    out, weights = mc.scaled_dot_product_attention(q, k, v, mask, scale=scale)
    batch, (lq, dk), (lk, dv) = q.shape[:-2], q.shape[-2:], v.shape[-2:]
    s = 1 / math.sqrt(dk) if scale is None else scale
    m = None if mask is None else flat(mask, batch, (lq, lk))
    ref_out, ref_w = naive_attention(flat(q, batch, (lq, dk)), flat(k, batch, (lk, dk)), flat(v, batch, (lk, dv)), m, s)
    assert out.dtype == weights.dtype == dtype
    close(weights.reshape(-1, lq, lk), ref_w, dtype)
    close(out.reshape(-1, lq, dv), ref_out, dtype)


@SETTINGS
@given(attention_case())
def test_matches_torch_sdpa_on_rows_with_an_allowed_key(case):
    q, k, v, mask, scale, dtype = case
    out, _ = mc.scaled_dot_product_attention(q, k, v, mask, scale=scale)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    rows = torch.ones(out.shape[:-1], dtype=torch.bool) if mask is None else mask.any(-1).expand(out.shape[:-1])
    close(out[rows], ref[rows], dtype)


@SETTINGS
@given(attention_case())
def test_weights_rows_sum_to_one_or_zero_and_never_nan(case):
    q, k, v, mask, scale, dtype = case
    out, weights = mc.scaled_dot_product_attention(q, k, v, mask, scale=scale)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    has_key = torch.ones(weights.shape[:-1], dtype=torch.bool)
    if mask is not None:
        has_key = mask.any(-1).expand(weights.shape[:-1])
        assert (weights[~mask.expand(weights.shape)] == 0).all()  # masked keys get exactly 0
    sums = weights.sum(-1)
    close(sums[has_key], torch.ones_like(sums[has_key]), dtype)
    assert (sums[~has_key] == 0).all() and (out[~has_key] == 0).all()


@SETTINGS
@given(st.integers(1, 5), st.integers(2, 6), st.integers(0, 2**31 - 1))
def test_fully_masked_rows_give_zero_and_finite_gradients(lq, lk, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, lq, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, lk, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, lk, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(2, lq, lk, generator=gen) < 0.5
    mask[:, 0] = False  # query 0 sees nothing (e.g. a padded query position)
    out, weights = mc.scaled_dot_product_attention(q, k, v, mask)
    assert (out[:, 0] == 0).all() and (weights[:, 0] == 0).all()
    (out.sum() + weights.sum()).backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[:, 0] == 0).all()  # a query that attends to nothing gets no gradient


@SETTINGS
@given(DTYPES, st.integers(1, 3), st.integers(1, 3), st.integers(1, 5), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_leading_batch_dims_broadcast(dtype, a, c, lq, lk, seed):
    """q (a, 1, Lq, d), k/v (1, c, Lk, ·), mask (a, 1, Lq, Lk) broadcast to (a, c, ...)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(a, 1, lq, 5, generator=gen, dtype=dtype)
    k = torch.randn(1, c, lk, 5, generator=gen, dtype=dtype)
    v = torch.randn(1, c, lk, 3, generator=gen, dtype=dtype)
    mask = torch.rand(a, 1, lq, lk, generator=gen) < 0.7
    out, weights = mc.scaled_dot_product_attention(q, k, v, mask)
    assert out.shape == (a, c, lq, 3) and weights.shape == (a, c, lq, lk)
    full = (a, c)
    ref_out, ref_w = naive_attention(
        flat(q, full, (lq, 5)),
        flat(k, full, (lk, 5)),
        flat(v, full, (lk, 3)),
        flat(mask, full, (lq, lk)),
        1 / math.sqrt(5),
    )
    close(out.reshape(-1, lq, 3), ref_out, dtype)
    close(weights.reshape(-1, lq, lk), ref_w, dtype)


def test_scale_default_is_one_over_sqrt_dk():
    """Scaling q by 2 and passing scale=1/(2·√d_k) must give the same result as the default."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 4, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    out, w = mc.scaled_dot_product_attention(q, k, v)
    out2, w2 = mc.scaled_dot_product_attention(2 * q, k, v, scale=1 / (2 * 4.0))
    torch.testing.assert_close(out, out2)
    torch.testing.assert_close(w, w2)


def test_hand_computed_weights():
    """Scores log 4.5, log 4.5, 0 give weights 4.5 : 4.5 : 1 = 0.45, 0.45, 0.10 (the split the
    course's address-book example shows for a query that asks two questions at once)."""
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    q = torch.tensor([[math.log(4.5), math.log(4.5)]])
    v = torch.tensor([[1.0], [2.0], [3.0]])
    out, w = mc.scaled_dot_product_attention(q, k, v, scale=1.0)
    torch.testing.assert_close(w, torch.tensor([[0.45, 0.45, 0.10]]))
    torch.testing.assert_close(out, torch.tensor([[0.45 * 1 + 0.45 * 2 + 0.10 * 3]]))
