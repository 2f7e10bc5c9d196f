"""Checkers of notebook 16 (the top-k mask, one step of the gated delta rule): correct variants
pass, each listed mistake is named, an unfinished exercise is "not attempted", a raising one never raises."""

import pytest
import torch

import mha_course as mc

# --- topk_mask ---------------------------------------------------------------------------------


def topk_scatter(scores, top_k, mask=None):
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    idx = scores.topk(min(top_k, scores.shape[-1]), dim=-1).indices
    chosen = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, idx, True)
    return chosen if mask is None else chosen & mask


def topk_by_rank(scores, top_k, mask=None):  # rank each key within its row by sorting twice
    allowed = torch.ones_like(scores, dtype=torch.bool) if mask is None else mask.expand_as(scores)
    filled = scores.masked_fill(~allowed, float("-inf"))
    rank = filled.argsort(dim=-1, descending=True).argsort(dim=-1)
    return (rank < top_k) & allowed


def topk_by_threshold(scores, top_k, mask=None):  # the k-th best allowed score per row as a cut-off
    allowed = torch.ones_like(scores, dtype=torch.bool) if mask is None else mask.expand_as(scores)
    filled = scores.masked_fill(~allowed, float("-inf"))
    kth = filled.sort(dim=-1, descending=True).values[
        ..., min(top_k, scores.shape[-1]) - 1 : min(top_k, scores.shape[-1])
    ]
    return (filled >= kth) & allowed


@pytest.mark.parametrize("fn", [topk_scatter, topk_by_rank, topk_by_threshold, mc.topk_mask])
def test_topk_mask_accepts_correct_variants(fn):
    result = mc.check.topk_mask(fn)
    assert result.passed, result


def _pick(scores, top_k, dim=-1, largest=True):
    idx = scores.topk(min(top_k, scores.shape[dim]), dim=dim, largest=largest).indices
    return torch.zeros_like(scores, dtype=torch.bool).scatter(dim, idx, True)


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda s, k, m=None: _pick(s, k) & (True if m is None else m), "top-k before the mask"),
        (lambda s, k, m=None: _pick(s, k), "the mask was ignored"),
        (
            lambda s, k, m=None: (
                _pick(s if m is None else s.masked_fill(~m, -1e9), k, dim=-2) & (True if m is None else m)
            ),
            "top-k over the wrong axis",
        ),
        (
            lambda s, k, m=None: (
                _pick(s if m is None else s.masked_fill(~m, 1e9), k, largest=False) & (True if m is None else m)
            ),
            "lowest-scoring",
        ),
        (lambda s, k, m=None: _pick(s if m is None else s.masked_fill(~m, float("-inf")), k), "also got blocked keys"),
    ],
)
def test_topk_mask_names_mistakes(fn, words):
    result = mc.check.topk_mask(fn)
    assert not result.passed and "likely mistake" in result.message and words in result.message, result


def test_topk_mask_not_attempted_and_raising():
    def todo(scores, top_k, mask=None):
        raise NotImplementedError

    assert mc.check.topk_mask(todo).status == "not attempted"
    result = mc.check.topk_mask(lambda s, k, m=None: s.topk(k + 100, dim=-1))
    assert not result.passed and "RuntimeError" in result.message


# --- delta_rule_update -------------------------------------------------------------------------


def update_einsum(state, k, v, g, beta):
    state = state * torch.exp(g)[..., None, None]
    pred = torch.einsum("bhkv,bhk->bhv", state, k)
    return state + torch.einsum("bhk,bhv->bhkv", k, beta[..., None] * (v - pred))


def update_matmul(state, k, v, g, beta):  # the matrix form S (I − β k kᵀ) on Sᵀ, then + β v kᵀ
    alpha = g.exp()[..., None, None]
    S_t = (alpha * state).transpose(-1, -2)  # (B, h, d_v, d_k)
    eye = torch.eye(k.shape[-1])
    kk = k[..., :, None] @ k[..., None, :]  # (B, h, d_k, d_k)
    S_t = S_t @ (eye - beta[..., None, None] * kk) + beta[..., None, None] * (v[..., :, None] @ k[..., None, :])
    return S_t.transpose(-1, -2)


def update_loop(state, k, v, g, beta):
    out = torch.empty_like(state)
    for b in range(state.shape[0]):
        for h in range(state.shape[1]):
            S = state[b, h] * torch.exp(g[b, h])
            out[b, h] = S + torch.outer(k[b, h], beta[b, h] * (v[b, h] - S.T @ k[b, h]))
    return out


@pytest.mark.parametrize("fn", [update_einsum, update_matmul, update_loop])
def test_delta_rule_update_accepts_correct_variants(fn):
    result = mc.check.delta_rule_update(fn)
    assert result.passed, result


def test_delta_rule_update_agrees_with_the_package_step():
    """The exercise's reference is the package's step: same state for the same inputs."""
    g = torch.Generator().manual_seed(0)
    S = torch.randn(2, 3, 4, 5, generator=g)
    k = torch.nn.functional.normalize(torch.randn(2, 3, 4, generator=g), dim=-1)
    v, gg, beta = torch.randn(2, 3, 5, generator=g), -torch.rand(2, 3, generator=g), torch.rand(2, 3, generator=g)
    new, _ = mc.delta_rule_step(S, k, k, v, gg, beta)
    torch.testing.assert_close(new, update_loop(S, k, v, gg, beta))


def decay_last(S, k, v, g, b):
    pred = torch.einsum("bhkv,bhk->bhv", S, k)
    S = S + torch.einsum("bhk,bhv->bhkv", k, b[..., None] * (v - pred))
    return S * g.exp()[..., None, None]


def transposed(S, k, v, g, b):  # reads S k and writes (v − S k) kᵀ
    S = S * g.exp()[..., None, None]
    pred = (S @ k[..., None])[..., 0]  # (B, h, d_k): S k instead of Sᵀ k
    return S + (b[..., None] * (v - pred))[..., :, None] * k[..., None, :]


def no_delta(S, k, v, g, b):
    return S * g.exp()[..., None, None] + torch.einsum("bhk,bhv->bhkv", k, b[..., None] * v)


def times_g(S, k, v, g, b):
    faded = S * g[..., None, None]
    pred = torch.einsum("bhkv,bhk->bhv", faded, k)
    return faded + torch.einsum("bhk,bhv->bhkv", k, b[..., None] * (v - pred))


@pytest.mark.parametrize(
    "fn, words",
    [
        (decay_last, "decay applied after the update"),
        (lambda S, k, v, g, b: update_einsum(S, k, v, g, torch.ones_like(b)), "beta missing"),
        (transposed, "outer product transposed"),
        (no_delta, "plain linear attention"),
        (times_g, "not by g"),
        (lambda S, k, v, g, b: update_einsum(S, k, v, torch.zeros_like(g), b), "did not fade"),
    ],
)
def test_delta_rule_update_names_mistakes(fn, words):
    result = mc.check.delta_rule_update(fn)
    assert not result.passed and "likely mistake" in result.message and words in result.message, result


def test_delta_rule_update_not_attempted_and_raising():
    def todo(state, k, v, g, beta):
        raise NotImplementedError

    assert mc.check.delta_rule_update(todo).status == "not attempted"
    result = mc.check.delta_rule_update(lambda S, k, v, g, b: S @ v)
    assert not result.passed and "RuntimeError" in result.message
