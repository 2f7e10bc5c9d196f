"""repeat_kv, GroupedQueryAttention and KVCache against independent references:
torch.repeat_interleave; F.scaled_dot_product_attention(..., enable_gqa=True) on projections
done by hand with F.linear; MultiHeadAttention with the K/V weights repeated per group; a
hand-pooled MHA -> GQA conversion; and KV-cache decoding vs full causal recomputation."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import mha_course as mc

SETTINGS = settings(max_examples=30, deadline=None, database=None)
TOL = {torch.float32: {"atol": 3e-5, "rtol": 1e-4}, torch.float64: {"atol": 1e-10, "rtol": 1e-9}}
DTYPES = st.sampled_from([torch.float32, torch.float64])


def close(actual, expected, dtype):
    torch.testing.assert_close(actual, expected, **TOL[dtype])


@torch.no_grad()
def randomize(module, gen, scale=0.4):
    for p in module.parameters():
        p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale)
    return module


@SETTINGS
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4), st.integers(1, 5), st.integers(1, 4), DTYPES)
def test_repeat_kv_equals_repeat_interleave(b, h_kv, n_rep, length, d, dtype):
    x = torch.randn(b, h_kv, length, d, dtype=dtype)
    out = mc.repeat_kv(x, n_rep)
    assert torch.equal(out, torch.repeat_interleave(x, n_rep, dim=1))
    for i in range(h_kv * n_rep):  # query head i reads KV head i // n_rep
        assert torch.equal(out[:, i], x[:, i // n_rep])


@st.composite
def gqa_case(draw, default_head_dim=False):
    h_kv, n_rep = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    h = h_kv * n_rep
    if default_head_dim:
        head_dim = draw(st.integers(1, 4))
        d_model = h * head_dim
    else:  # head_dim need not be d_model // h (Gemma 2: 16 x 256 = 4096 != 3584)
        d_model, head_dim = draw(st.integers(1, 12)), draw(st.integers(1, 5))
    return {
        "d": d_model,
        "h": h,
        "h_kv": h_kv,
        "hd": head_dim,
        "head_dim_arg": None if default_head_dim else head_dim,
        "B": draw(st.integers(1, 3)),
        "L": draw(st.integers(1, 6)),
        "bias": draw(st.booleans()),
        "dtype": draw(DTYPES),
        "mask": draw(st.sampled_from(["none", "2d", "4d", "padding", "causal", "causal_padding"])),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def build(c, gen):
    m = mc.GroupedQueryAttention(c["d"], c["h"], c["h_kv"], head_dim=c["head_dim_arg"], bias=c["bias"])
    return randomize(m.to(c["dtype"]), gen).eval()


def make_mask(c, gen):
    """(mask for GQA, is_causal flag, the same mask as one explicit bool tensor or None)."""
    B, h, L = c["B"], c["h"], c["L"]
    kind = c["mask"]
    tril = torch.ones(L, L, dtype=torch.bool).tril()
    lengths = torch.randint(0, L + 1, (B,), generator=gen)  # 0: a sequence of padding only
    pad = (torch.arange(L)[None, :] < lengths[:, None])[:, None, None, :]
    if kind == "none":
        return None, False, None
    if kind == "2d":
        m = torch.rand(L, L, generator=gen) < 0.6
        return m, False, m
    if kind == "4d":
        m = torch.rand(B, h, L, L, generator=gen) < 0.6
        return m, False, m
    if kind == "padding":
        return pad, False, pad
    if kind == "causal":
        return None, True, tril
    return pad, True, pad & tril


def by_hand(m, x, mask, c):
    """GQA computed from m's weights with F.linear and SDPA's own enable_gqa."""
    B, L = x.shape[:2]
    w = {n: (getattr(m, f"{n}_proj").weight, getattr(m, f"{n}_proj").bias) for n in "qkvo"}
    q = F.linear(x, *w["q"]).view(B, L, c["h"], c["hd"]).transpose(1, 2)
    k = F.linear(x, *w["k"]).view(B, L, c["h_kv"], c["hd"]).transpose(1, 2)
    v = F.linear(x, *w["v"]).view(B, L, c["h_kv"], c["hd"]).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return F.linear(out.transpose(1, 2).reshape(B, L, c["h"] * c["hd"]), *w["o"])


def valid_rows(mask, c):
    """(B, L) rows whose every head has >= 1 allowed key (where SDPA's output is defined)."""
    if mask is None:
        return torch.ones(c["B"], c["L"], dtype=torch.bool)
    return mask.expand(c["B"], c["h"], c["L"], c["L"]).any(-1).all(1)


@SETTINGS
@given(gqa_case())
@torch.no_grad()
def test_gqa_matches_sdpa_enable_gqa_by_hand(c):
    gen = torch.Generator().manual_seed(c["seed"])
    m = build(c, gen)
    x = torch.randn(c["B"], c["L"], c["d"], generator=gen, dtype=c["dtype"])
    mask, is_causal, full = make_mask(c, gen)
    ref = by_hand(m, x, full, c)
    rows = valid_rows(full, c)
    for need_weights in (True, False):
        out, w = m(x, mask=mask, is_causal=is_causal, need_weights=need_weights)
        assert torch.isfinite(out).all()
        close(out[rows], ref[rows], c["dtype"])
        assert (w is None) != need_weights


def mha_with_repeated_kv(gqa, c):
    """An MHA whose K/V heads are the GQA's K/V heads repeated for every query head of a group."""
    mha = mc.MultiHeadAttention(c["d"], c["h"], bias=c["bias"]).to(c["dtype"]).eval()
    n_rep = c["h"] // c["h_kv"]

    def rep(t):  # rows are h_kv blocks of hd rows; repeat each block n_rep times
        blocks = t.split(c["hd"], dim=0)
        return torch.cat([blk for blk in blocks for _ in range(n_rep)], dim=0)

    with torch.no_grad():
        mha.q_proj.load_state_dict(gqa.q_proj.state_dict())
        mha.out_proj.load_state_dict(gqa.o_proj.state_dict())
        for src, dst in ((gqa.k_proj, mha.k_proj), (gqa.v_proj, mha.v_proj)):
            dst.weight.copy_(rep(src.weight))
            if c["bias"]:
                dst.bias.copy_(rep(src.bias))
    return mha


@SETTINGS
@given(gqa_case(default_head_dim=True))
@torch.no_grad()
def test_gqa_equals_mha_with_repeated_kv_weights(c):
    gen = torch.Generator().manual_seed(c["seed"])
    gqa = build(c, gen)
    mha = mha_with_repeated_kv(gqa, c)
    x = torch.randn(c["B"], c["L"], c["d"], generator=gen, dtype=c["dtype"])
    _, is_causal, full = make_mask(c, gen)
    out, w = gqa(x, mask=full)
    ref_out, ref_w = mha(x, mask=full)
    close(out, ref_out, c["dtype"])
    close(w, ref_w, c["dtype"])
    fast, _ = gqa(x, mask=full, need_weights=False)
    close(fast, ref_out, c["dtype"])  # fully masked rows included: both give the o_proj bias
    if c["h_kv"] == c["h"]:  # no sharing: GQA is MHA with the very same weights
        assert torch.equal(mha.k_proj.weight, gqa.k_proj.weight)


@SETTINGS
@given(gqa_case(default_head_dim=True))
@torch.no_grad()
def test_from_mha_full_heads_is_exact_and_fewer_heads_mean_pool(c):
    gen = torch.Generator().manual_seed(c["seed"])
    mha = randomize(mc.MultiHeadAttention(c["d"], c["h"], bias=c["bias"]).to(c["dtype"]), gen).eval()
    x = torch.randn(c["B"], c["L"], c["d"], generator=gen, dtype=c["dtype"])
    _, _, full = make_mask(c, gen)
    same = mc.GroupedQueryAttention.from_mha(mha, c["h"])
    close(same(x, mask=full)[0], mha(x, mask=full)[0], c["dtype"])

    gqa = mc.GroupedQueryAttention.from_mha(mha, c["h_kv"])
    n_rep, hd = c["h"] // c["h_kv"], c["hd"]

    def pooled(t):  # group g averages MHA heads g*n_rep ... (g+1)*n_rep - 1, written as a loop
        groups = []
        for g in range(c["h_kv"]):
            heads = [t[i * hd : (i + 1) * hd] for i in range(g * n_rep, (g + 1) * n_rep)]
            groups.append(sum(heads) / n_rep)
        return torch.cat(groups)

    for src, dst in ((mha.k_proj, gqa.k_proj), (mha.v_proj, gqa.v_proj)):
        close(dst.weight, pooled(src.weight), c["dtype"])
        if c["bias"]:
            close(dst.bias, pooled(src.bias), c["dtype"])
    assert torch.equal(gqa.q_proj.weight, mha.q_proj.weight) and torch.equal(gqa.o_proj.weight, mha.out_proj.weight)
    # behaviour: the converted GQA computes the MHA whose K/V heads are replaced by their group mean
    ref = mha_with_repeated_kv(gqa, c)
    close(gqa(x, mask=full)[0], ref(x, mask=full)[0], c["dtype"])


@st.composite
def decode_case(draw):
    c = draw(gqa_case())
    c["L"] = draw(st.integers(2, 8))
    c["prompt"] = draw(st.integers(1, c["L"] - 1))
    c["max_length"] = draw(st.sampled_from([None, c["L"], c["L"] + 3]))  # growing, or preallocated
    return c


@SETTINGS
@given(decode_case())
@torch.no_grad()
def test_kv_cache_decoding_equals_full_recomputation(c):
    gen = torch.Generator().manual_seed(c["seed"])
    m = build(c, gen)
    B, L, P = c["B"], c["L"], c["prompt"]
    x = torch.randn(B, L, c["d"], generator=gen, dtype=c["dtype"])
    tril = torch.ones(L, L, dtype=torch.bool).tril()  # the causal mask, written out
    full_out, full_w = m(x, mask=tril)

    cache = mc.KVCache(max_length=c["max_length"])
    assert cache.length == 0 and cache.nbytes == 0
    out, w = m(x[:, :P], cache=cache, is_causal=True)  # prefill the prompt
    close(out, full_out[:, :P], c["dtype"])
    close(w, full_w[:, :, :P, :P], c["dtype"])
    steps = [out]
    for t in range(P, L):  # then one token at a time
        need_weights = t % 2 == 0
        out, w = m(x[:, t : t + 1], cache=cache, is_causal=True, need_weights=need_weights)
        assert cache.length == t + 1
        if need_weights:
            close(w, full_w[:, :, t : t + 1, : t + 1], c["dtype"])
        steps.append(out)
        esize = torch.empty((), dtype=c["dtype"]).element_size()
        assert cache.nbytes == mc.kv_cache_bytes(1, c["h_kv"], c["hd"], t + 1, batch=B, bytes_per_element=esize)
    close(torch.cat(steps, dim=1), full_out, c["dtype"])
    # the cache holds exactly the K and V projections of every position, per KV head
    k = F.linear(x, m.k_proj.weight, m.k_proj.bias).view(B, L, c["h_kv"], c["hd"]).transpose(1, 2)
    v = F.linear(x, m.v_proj.weight, m.v_proj.bias).view(B, L, c["h_kv"], c["hd"]).transpose(1, 2)
    close(cache.keys, k, c["dtype"])
    close(cache.values, v, c["dtype"])
    if c["max_length"] is not None:  # the buffers hold max_length positions; keys/values are views
        assert cache.reserved_nbytes == cache.nbytes * c["max_length"] // L
        assert cache.keys._base is not None and cache.keys.shape[2] == L  # a view of the buffer


def test_preallocated_update_writes_in_place_and_returns_views():
    cache = mc.KVCache(max_length=6)
    k, v = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    k_all, v_all = cache.update(k[:, :, :3], v[:, :, :3])
    buffer = k_all.untyped_storage()
    assert torch.equal(k_all, k[:, :, :3]) and k_all.shape == (2, 3, 3, 5)
    k_all, v_all = cache.update(k[:, :, 3:], v[:, :, 3:])
    assert torch.equal(k_all, k) and torch.equal(v_all, v)
    assert k_all.untyped_storage().data_ptr() == buffer.data_ptr()  # the same buffer, written in place
    assert k_all._base is not None and v_all._base is not None  # views, not copies
    assert cache.length == 4 and cache.reserved_nbytes == 2 * 2 * 3 * 6 * 5 * 4
    assert cache.nbytes == 2 * 2 * 3 * 4 * 5 * 4
    with pytest.raises(ValueError, match="max_length=6.*has 4 and the update adds 3"):
        cache.update(k[:, :, :3], v[:, :, :3])
    cache.crop(2)
    k_all, _ = cache.update(k[:, :, 3:], v[:, :, 3:])  # written at position 2
    assert torch.equal(k_all, torch.cat([k[:, :, :2], k[:, :, 3:]], dim=2))
    with pytest.raises(ValueError, match="length=5 is more than the 3 cached"):
        cache.crop(5)
    with pytest.raises(ValueError, match="max_length"):
        mc.KVCache(max_length=0)
    with pytest.raises(ValueError, match="does not match the cached"):
        cache.update(torch.randn(1, 3, 1, 5), torch.randn(1, 3, 1, 5))
    cache.reset()
    assert cache.length == 0 and cache.keys is None and cache.reserved_nbytes == 0


def test_growing_cache_crop():
    cache = mc.KVCache()
    k = torch.randn(1, 2, 5, 3)
    cache.update(k, k)
    cache.crop(3)
    assert torch.equal(cache.keys, k[:, :, :3]) and cache.length == 3
    k_all, _ = cache.update(k[:, :, 4:], k[:, :, 4:])
    assert torch.equal(k_all, k[:, :, [0, 1, 2, 4]])


def test_kv_cache_reset_and_nbytes_of_real_storage():
    cache = mc.KVCache()
    k = torch.randn(2, 4, 3, 8, dtype=torch.float16)
    cache.update(k, k.clone())
    cache.update(k[:, :, :1], k[:, :, :1])
    storage = sum(t.contiguous().untyped_storage().nbytes() for t in (cache.keys, cache.values))
    assert cache.length == 4 and cache.nbytes == storage == 2 * 2 * 4 * 4 * 8 * 2
    cache.reset()
    assert cache.length == 0 and cache.nbytes == 0 and cache.keys is None


@torch.no_grad()
def test_mqa_single_kv_head_shares_keys_across_all_query_heads():
    """num_kv_heads=1: every query head attends over the same keys, so with W_Q rows identical
    across heads every head's weights are identical."""
    gen = torch.Generator().manual_seed(0)
    m = randomize(mc.GroupedQueryAttention(8, 4, 1), gen)
    m.q_proj.weight.copy_(m.q_proj.weight[:2].repeat(4, 1))
    _, w = m(torch.randn(2, 5, 8, generator=gen))
    for i in range(1, 4):
        torch.testing.assert_close(w[:, i], w[:, 0])
