"""Top-k sparse attention, the lightning indexer, the gated delta rule and hybrid cache sizes,
against naive loops and transformers (DeepseekV32Indexer, Qwen3-Next's delta-rule functions)."""

import math

import pytest
import torch

import mha_course as mc

qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


def naive_topk_attention(q, k, v, index_scores, top_k, mask):
    """Loop over batch, head and query: sort the allowed keys by score, keep top_k, softmax them."""
    B, h, Lq, d = q.shape
    n_rep = h // k.shape[1]
    out = torch.zeros(B, h, Lq, v.shape[-1], dtype=q.dtype)
    weights = torch.zeros(B, h, Lq, k.shape[2], dtype=q.dtype)
    for b in range(B):
        for i in range(Lq):
            allowed = [j for j in range(k.shape[2]) if mask is None or bool(mask.expand(B, Lq, -1)[b, i, j])]
            keep = sorted(allowed, key=lambda j: -float(index_scores[b, i, j]))[:top_k]
            for head in range(h):
                kv = head // n_rep
                s = torch.stack([q[b, head, i] @ k[b, kv, j] for j in keep]) / math.sqrt(d)
                w = torch.softmax(s, dim=0)
                for wj, j in zip(w, keep, strict=True):
                    weights[b, head, i, j] = wj
                    out[b, head, i] += wj * v[b, kv, j]
    return out, weights


@pytest.mark.parametrize(
    "B,h,h_kv,Lq,Lk,d,top_k", [(1, 2, 1, 3, 7, 4, 3), (2, 4, 2, 5, 9, 8, 4), (2, 3, 3, 4, 4, 5, 1)]
)
@pytest.mark.parametrize("masked", [False, True])
def test_topk_matches_naive_loop(B, h, h_kv, Lq, Lk, d, top_k, masked):
    g = torch.Generator().manual_seed(Lk * 10 + top_k)
    q = torch.randn(B, h, Lq, d, generator=g, dtype=torch.float64)
    k = torch.randn(B, h_kv, Lk, d, generator=g, dtype=torch.float64)
    v = torch.randn(B, h_kv, Lk, d + 1, generator=g, dtype=torch.float64)
    scores = torch.randn(B, Lq, Lk, generator=g, dtype=torch.float64)
    mask = mc.causal_mask(Lq, Lk) if masked else None
    out, w = mc.topk_sparse_attention(q, k, v, scores, top_k, mask)
    ref_out, ref_w = naive_topk_attention(q, k, v, scores, top_k, mask)
    torch.testing.assert_close(w, ref_w)
    torch.testing.assert_close(out, ref_out)
    nonzero = (w > 0).sum(-1)  # each query row keeps min(top_k, allowed keys)
    allowed = (mask.expand(B, Lq, Lk) if masked else torch.ones(B, Lq, Lk, dtype=torch.bool)).sum(-1)
    assert torch.equal(nonzero, torch.minimum(allowed, torch.tensor(top_k))[:, None].expand_as(nonzero))


def test_topk_at_least_all_keys_is_full_attention():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=g, dtype=torch.float64) for _ in range(3))
    k, v = k[:, :2], v[:, :2]
    scores = torch.randn(2, 6, 6, generator=g, dtype=torch.float64)
    mask = mc.causal_mask(6)
    out, w = mc.topk_sparse_attention(q, k, v, scores, 6, mask)
    ref_out, ref_w = mc.scaled_dot_product_attention(q, mc.repeat_kv(k, 2), mc.repeat_kv(v, 2), mask)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)
    ref_torch = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(mc.topk_sparse_attention(q, k, v, scores, 50, mask)[0], ref_torch)


def test_mask_comes_before_the_topk():
    """The best-scoring key is blocked: it must not be chosen, and the next allowed one takes its slot."""
    q = k = v = torch.randn(1, 1, 1, 4)
    k, v = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    scores = torch.tensor([[[5.0, 1.0, 0.0]]])
    mask = torch.tensor([[[False, True, True]]])
    _, w = mc.topk_sparse_attention(q, k, v, scores, 1, mask)
    assert w[0, 0, 0].tolist() == [0.0, 1.0, 0.0]


@pytest.mark.parametrize(
    "kwargs,error,words",
    [
        ({"top_k": 0}, ValueError, "top_k"),
        ({"top_k": 2.0}, TypeError, "top_k"),
        ({"k": torch.randn(1, 3, 5, 4)}, ValueError, "num_heads=4 is not a multiple of num_kv_heads=3"),
        ({"index_scores": torch.randn(1, 5, 5)}, ValueError, "index_scores must be (B, Lq, Lk)"),
        ({"mask": torch.ones(1, 2, 5)}, TypeError, "mask must be bool"),
        ({"q": torch.randn(2, 5, 4)}, ValueError, "q must be 4-D"),
    ],
)
def test_topk_bad_inputs(kwargs, error, words):
    args = {
        "q": torch.randn(1, 4, 2, 4),
        "k": torch.randn(1, 2, 5, 4),
        "v": torch.randn(1, 2, 5, 4),
        "index_scores": torch.randn(1, 2, 5),
        "top_k": 2,
        "mask": None,
    }
    args.update(kwargs)
    if "k" in kwargs:
        args["v"] = torch.randn(*kwargs["k"].shape)
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        mc.topk_sparse_attention(**args)


def test_indexer_selects_what_transformers_selects():
    """A tiny DeepseekV32Indexer: the course's scores, from the same projections and RoPE, pick the
    same top-k keys for every query (ignoring the padded picks of rows with fewer allowed keys)."""
    ds = pytest.importorskip("transformers.models.deepseek_v32.modeling_deepseek_v32")
    from transformers import DeepseekV32Config

    for seed, (L, topk) in enumerate([(9, 3), (12, 5), (7, 7)]):
        torch.manual_seed(seed)
        cfg = DeepseekV32Config(
            hidden_size=32, q_lora_rank=16, index_n_heads=4, index_head_dim=16, index_topk=topk, qk_rope_head_dim=8
        )
        indexer = ds.DeepseekV32Indexer(cfg, layer_idx=0).eval()
        x, q_resid = torch.randn(2, L, 32), torch.randn(2, L, 16)
        pos = torch.arange(L)
        inv = 1.0 / (10000.0 ** (torch.arange(0, 8, 2) / 8))
        freqs = torch.cat([pos[:, None] * inv, pos[:, None] * inv], -1)  # (L, 8), rotate-half layout
        cos, sin = freqs.cos()[None], freqs.sin()[None]
        causal = mc.causal_mask(L)[None]  # (1, L, L)
        picked = indexer(x, q_resid, (cos, sin), causal, pos[None])  # (2, L, topk)
        with torch.no_grad():
            q = indexer.wq_b(q_resid).view(2, L, 4, 16)  # (B, L, H_I, d_I)
            k = indexer.k_norm(indexer.wk(x))  # (B, L, d_I)
            q = torch.cat([mc.apply_rope(q[..., :8].transpose(1, 2), pos).transpose(1, 2), q[..., 8:]], -1)
            k = torch.cat([mc.apply_rope(k[..., :8], pos), k[..., 8:]], -1)
            w = indexer.weights_proj(x) * 4**-0.5  # (B, L, H_I)
            scores = mc.indexer_scores(q, k, w)  # (B, L, L)
        ours = mc.topk_mask(scores, topk, causal)
        theirs = torch.zeros(2, L, L, dtype=torch.bool).scatter_(-1, picked.long(), True) & causal
        assert torch.equal(ours, theirs)


def hf_layout(*xs):
    return [x.transpose(1, 2).contiguous() for x in xs]  # (B, h, L, ·) <-> (B, L, h, ·)


def hf_delta_layout(q, k, v):
    """q, k, v as Qwen3-Next's layer hands them to its delta-rule functions: each query/key head
    repeated for its group of consecutive value heads (transformers 5.20 repeats in the layer, 5.25
    inside the functions, where heads already repeated pass through unchanged), in (B, L, h, ·)."""
    group = v.shape[1] // q.shape[1]
    return hf_layout(q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1), v)


def random_delta_inputs(B, h_k, h_v, L, d_k, d_v, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(B, h_k, L, d_k, generator=g, dtype=dtype), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, h_k, L, d_k, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(B, h_v, L, d_v, generator=g, dtype=dtype)
    decay = -torch.nn.functional.softplus(torch.randn(B, h_v, L, generator=g, dtype=dtype))  # <= 0
    beta = torch.rand(B, h_v, L, generator=g, dtype=dtype)
    s0 = torch.randn(B, h_v, d_k, d_v, generator=g, dtype=dtype) * 0.1
    return q, k, v, decay, beta, s0


def naive_delta_rule(q, k, v, g, beta, s0):
    """Matrix form, one token and one head at a time: S = e^g S (I − β k kᵀ) ... written on Sᵀ."""
    B, h_v, L, d_v = v.shape
    r = h_v // k.shape[1]
    out = torch.zeros_like(v)
    state = s0.clone()
    for b in range(B):
        for h in range(h_v):
            S = state[b, h].T.clone()  # (d_v, d_k): maps a key to a value
            for t in range(L):
                kt, qt = k[b, h // r, t], q[b, h // r, t] / math.sqrt(k.shape[-1])
                eye = torch.eye(k.shape[-1], dtype=v.dtype)
                S = math.exp(g[b, h, t]) * S @ (eye - beta[b, h, t] * torch.outer(kt, kt))
                S = S + beta[b, h, t] * torch.outer(v[b, h, t], kt)
                out[b, h, t] = S @ qt
            state[b, h] = S.T
    return out, state


SHAPES = [(1, 1, 1, 5, 4, 3, 2), (2, 2, 4, 11, 8, 6, 4), (1, 2, 2, 16, 4, 4, 8), (2, 1, 2, 7, 3, 5, 64)]


@pytest.mark.parametrize("B,h_k,h_v,L,d_k,d_v,chunk", SHAPES)
def test_delta_rule_recurrent_and_chunked_match_naive_and_each_other(B, h_k, h_v, L, d_k, d_v, chunk):
    q, k, v, g, beta, s0 = random_delta_inputs(B, h_k, h_v, L, d_k, d_v, seed=L)
    ref_out, ref_state = naive_delta_rule(q, k, v, g, beta, s0)
    rec = mc.gated_delta_rule(q, k, v, g, beta, initial_state=s0)
    chk = mc.gated_delta_rule(q, k, v, g, beta, chunk_size=chunk, initial_state=s0)
    for out, state in (rec, chk):
        torch.testing.assert_close(out, ref_out)
        torch.testing.assert_close(state, ref_state)


@pytest.mark.parametrize("B,h_k,h_v,L,d_k,d_v,chunk", SHAPES)
@pytest.mark.parametrize("with_state", [False, True])
def test_delta_rule_equals_transformers(B, h_k, h_v, L, d_k, d_v, chunk, with_state):
    q, k, v, g, beta, s0 = random_delta_inputs(B, h_k, h_v, L, d_k, d_v, seed=L + 1, dtype=torch.float32)
    s0 = s0 if with_state else None
    hq, hk, hv = hf_delta_layout(q, k, v)
    hg, hb = g.transpose(1, 2).contiguous(), beta.transpose(1, 2).contiguous()
    tol = {"atol": 2e-5, "rtol": 2e-5}  # transformers computes in float32
    ref = qwen3_next.torch_recurrent_gated_delta_rule(hq, hk, hv, hg, hb, s0, output_final_state=True)
    ref_c = qwen3_next.torch_chunk_gated_delta_rule(
        hq, hk, hv, hg, hb, chunk_size=chunk, initial_state=s0, output_final_state=True
    )
    ours = mc.gated_delta_rule(
        q.double(), k.double(), v.double(), g.double(), beta.double(), initial_state=None if s0 is None else s0.double()
    )
    ours_c = mc.gated_delta_rule(q, k, v, g, beta, chunk_size=chunk, initial_state=s0)
    for (o, s), (ro, rs) in ((ours, ref), (ours_c, ref_c), (ours_c, ref)):
        torch.testing.assert_close(o.float().transpose(1, 2), ro, **tol)
        torch.testing.assert_close(s.float(), rs, **tol)


def test_delta_rule_l2norm_convention_of_qwen3_next():
    """Qwen3-Next passes use_qk_l2norm_in_kernel=True: the same as normalising q and k first."""
    q, k, v, g, beta, _ = random_delta_inputs(1, 2, 4, 9, 8, 8, seed=5, dtype=torch.float32)
    q, k = q * 3.0, k * 0.5  # not unit length
    hq, hk, hv = hf_delta_layout(q, k, v)
    ref, _ = qwen3_next.torch_chunk_gated_delta_rule(
        hq, hk, hv, g.transpose(1, 2), beta.transpose(1, 2), chunk_size=4, use_qk_l2norm_in_kernel=True
    )
    norm = torch.nn.functional.normalize
    ours, _ = mc.gated_delta_rule(norm(q, dim=-1), norm(k, dim=-1), v, g, beta, chunk_size=4)
    torch.testing.assert_close(ours.transpose(1, 2), ref, atol=2e-5, rtol=2e-5)


def test_delta_rule_by_hand():
    """One head, d_k = d_v = 1, k = 1, β = 1, no decay: the state becomes the last value exactly
    (the delta rule overwrites), while q = 1 reads it (scaled by 1/√1)."""
    v = torch.tensor([2.0, -1.0, 5.0]).view(1, 1, 3, 1)
    ones = torch.ones(1, 1, 3, 1)
    out, state = mc.gated_delta_rule(ones, ones, v, torch.zeros(1, 1, 3), torch.ones(1, 1, 3))
    assert out.flatten().tolist() == [2.0, -1.0, 5.0]
    assert state.item() == 5.0
    half = torch.full((1, 1, 3), math.log(0.5))  # halve the state before each write, β = 0: nothing written
    _, state = mc.gated_delta_rule(ones, ones, v, half, torch.zeros(1, 1, 3), initial_state=torch.ones(1, 1, 1, 1))
    assert state.item() == 0.125


@pytest.mark.parametrize(
    "change,error,words",
    [
        ({"g": 0.1}, ValueError, "g is a log-decay and must be <= 0"),
        ({"h_v": 3}, ValueError, "h_v=3 are not a multiple of the key heads h_k=2"),
        ({"chunk_size": 0}, ValueError, "chunk_size"),
        ({"state": (1, 4, 3, 3)}, ValueError, "initial_state must be"),
        ({"beta_shape": (1, 4, 5)}, ValueError, "beta must be"),
    ],
)
def test_delta_rule_bad_inputs(change, error, words):
    h_v = change.get("h_v", 4)
    q, k = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    v = torch.randn(1, h_v, 6, 3)
    g = torch.full((1, h_v, 6), -0.1) + change.get("g", 0.0) + (0.2 if "g" in change else 0.0)
    beta = torch.rand(*change.get("beta_shape", (1, h_v, 6)))
    state = torch.zeros(*change["state"]) if "state" in change else None
    with pytest.raises(error, match=words):
        mc.gated_delta_rule(q, k, v, g, beta, chunk_size=change.get("chunk_size"), initial_state=state)


def test_linear_attention_equals_kernelised_softmax_form():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 5, generator=g, dtype=torch.float64) for _ in range(3))
    phi = lambda x: torch.nn.functional.elu(x) + 1  # noqa: E731
    kernel = (phi(q) @ phi(k).transpose(-1, -2)).masked_fill(~mc.causal_mask(7), 0.0)  # (.., L, L)
    ref = (kernel / kernel.sum(-1, keepdim=True)) @ v
    torch.testing.assert_close(mc.linear_attention(q, k, v), ref)


def test_hybrid_configs_equal_transformers_defaults():
    from transformers import KimiLinearConfig, Qwen3NextConfig

    qn, kimi = Qwen3NextConfig(), KimiLinearConfig()
    c = mc.HYBRID_MODEL_CONFIGS["Qwen3-Next-80B-A3B"]
    assert c.num_layers == qn.num_hidden_layers
    assert list(c.full_attention_layers) == [i for i, t in enumerate(qn.layer_types) if t == "full_attention"]
    assert (c.full_num_kv_heads, c.full_head_dim) == (qn.num_key_value_heads, qn.head_dim)
    assert (c.linear_num_key_heads, c.linear_num_value_heads) == (qn.linear_num_key_heads, qn.linear_num_value_heads)
    assert (c.linear_key_head_dim, c.linear_value_head_dim) == (qn.linear_key_head_dim, qn.linear_value_head_dim)
    assert c.linear_conv_kernel == qn.linear_conv_kernel_dim
    c = mc.HYBRID_MODEL_CONFIGS["Kimi Linear 48B-A3B"]
    assert c.num_layers == kimi.num_hidden_layers
    assert list(c.full_attention_layers) == [i for i, t in enumerate(kimi.layer_types) if t == "full_attention"]
    assert (c.kv_lora_rank, c.qk_rope_head_dim) == (kimi.kv_lora_rank, kimi.qk_rope_head_dim)
    assert (c.linear_num_value_heads, c.linear_key_head_dim) == (kimi.linear_num_heads, kimi.linear_head_dim)
    assert c.linear_conv_kernel == kimi.linear_conv_kernel_dim
    assert c.context_length == kimi.max_position_embeddings


def test_hybrid_cache_bytes_equal_a_tiny_transformers_cache():
    """Build a tiny Qwen3-Next, run it with a cache, and count the bytes its cache really holds."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    cfg = Qwen3NextConfig(
        vocab_size=32, hidden_size=16, intermediate_size=16, moe_intermediate_size=8, num_experts=2,
        num_experts_per_tok=1, shared_expert_intermediate_size=8, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=4, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=4, linear_value_head_dim=3, linear_conv_kernel_dim=4,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(cfg).eval()
    L = 10
    with torch.no_grad():
        cache = model(torch.randint(0, 32, (1, L)), use_cache=True).past_key_values
    held = 0
    for layer in cache.layers:
        for value in vars(layer).values():
            tensors = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else [value]
            held += sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor) and t.dim() > 0)
    ours = mc.HybridModelConfig(
        name="tiny", num_layers=4, full_attention_layers=(3,), linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=4, linear_value_head_dim=3, linear_conv_kernel=4, source="test",
        full_num_kv_heads=2, full_head_dim=4,
    )  # fmt: skip
    assert ours.cache_bytes(L, bytes_per_element=4, state_bytes_per_element=4) == held


def test_hybrid_cache_bytes_by_hand():
    c = mc.HYBRID_MODEL_CONFIGS["Qwen3-Next-80B-A3B"]
    per_token = 12 * 2 * 2 * 256 * 2  # 12 full layers, K and V, 2 heads of 256, bf16
    state = 36 * (32 * 128 * 128 + (2 * 16 * 128 + 32 * 128) * 4) * 4  # 36 linear layers, float32
    assert c.cache_bytes(1000) == 1000 * per_token + state
    assert c.cache_bytes(0) == state
