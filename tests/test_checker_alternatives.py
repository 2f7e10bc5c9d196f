"""Every checker accepts correct solutions written another way than the course's reference.

For each exercise, at least two correct solutions that take a different route from the reference
(another formula, a loop, autograd instead of perturbations, PyTorch's own modules, a layout of
their own) must pass; and a diagnosis must not be named for code that does not make that mistake.
The exercises of notebooks 11 and 12 are tested in their own files.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import mha_course as mc
from mha_course.lessons import address_book

# --- 00: normalize_rows -------------------------------------------------------------------------


def _rows_by_loop(x):
    out = torch.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = x[i] / x[i].sum()
    return out


def _rows_by_matmul(x):
    return torch.diag(1 / x.sum(dim=1)) @ x  # D⁻¹ x: row i divided by its sum


# --- 01: scaled_dot_product_attention, address_book_query ---------------------------------------


def _sdpa_einsum_where(q, k, v, mask=None):
    scores = torch.einsum("...qd,...kd->...qk", q, k) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = torch.where(mask, scores, torch.tensor(-math.inf))
    weights = scores.softmax(dim=-1).nan_to_num(0.0)  # a row with no allowed key: weights 0
    return torch.einsum("...qk,...kv->...qv", weights, v), weights


def _sdpa_additive_torch(q, k, v, mask=None):
    bias = None if mask is None else torch.zeros(mask.shape).masked_fill(~mask, -1e9)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]))
    weights = torch.softmax(scores if bias is None else scores + bias, dim=-1)
    return out, weights


def _sdpa_exp_by_hand(q, k, v, mask=None):
    scores = q @ k.mT / math.sqrt(k.shape[-1])
    e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    if mask is not None:
        e = e * mask  # blocked keys get no weight
    total = e.sum(dim=-1, keepdim=True)
    weights = torch.where(total > 0, e / total.clamp_min(1e-30), 0.0)
    return weights @ v, weights


def _query_big_numbers(person, attribute):
    features = address_book.KEY_FEATURES
    q = torch.full((4,), -6.0)
    q[features.index(f"about {person}")] = 6.0
    q[features.index(f"is {attribute}")] = 5.5
    return q


def _query_by_table(person, attribute):
    table = {
        ("Zhang San", "address"): [6.0, -6.0, 6.0, -6.0],
        ("Zhang San", "phone"): [6.0, -6.0, -6.0, 6.0],
        ("Li Si", "address"): [-6.0, 6.0, 6.0, -6.0],
    }
    return torch.tensor(table[person, attribute])


# --- 02: multi_head_attention_per_head, multi_head_attention -------------------------------------


def _per_head_torch_sdpa(x, w_q, w_k, w_v, w_o):
    heads = [F.scaled_dot_product_attention(x @ wq, x @ wk, x @ wv) for wq, wk, wv in zip(w_q, w_k, w_v, strict=True)]
    return torch.cat(heads, dim=-1) @ w_o


def _per_head_einsum(x, w_q, w_k, w_v, w_o):
    q, k, v = (torch.einsum("bld,hde->bhle", x, w) for w in (w_q, w_k, w_v))  # (B, h, L, d_head)
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    heads = weights @ v  # (B, h, L, d_head)
    w_o_per_head = w_o.reshape(w_q.shape[0], w_q.shape[2], -1)  # (h, d_head, d_model)
    return torch.einsum("bhle,hed->bld", heads, w_o_per_head)  # the sum over heads of head_i @ W_O block i


def _mha_column_slices(x, w_q, w_k, w_v, w_o, num_heads):
    d_head = x.shape[-1] // num_heads
    outs = []
    for i in range(num_heads):
        block = slice(i * d_head, (i + 1) * d_head)
        q, k, v = x @ w_q[:, block], x @ w_k[:, block], x @ w_v[:, block]
        outs.append(torch.softmax(q @ k.transpose(1, 2) / d_head**0.5, dim=-1) @ v)
    return torch.cat(outs, dim=-1) @ w_o


def _mha_torch_module(x, w_q, w_k, w_v, w_o, num_heads):
    d = x.shape[-1]
    mha = torch.nn.MultiheadAttention(d, num_heads, bias=False, batch_first=True)
    mha.in_proj_weight.copy_(torch.cat([w_q.T, w_k.T, w_v.T]))  # nn stores (out, in)
    mha.out_proj.weight.copy_(w_o.T)
    out, _ = mha(x, x, x, need_weights=False)
    return out


def _mha_view_torch_sdpa(x, w_q, w_k, w_v, w_o, num_heads):
    B, L, d = x.shape
    q, k, v = ((x @ w).view(B, L, num_heads, -1).permute(0, 2, 1, 3) for w in (w_q, w_k, w_v))
    o = F.scaled_dot_product_attention(q, k, v)  # (B, h, L, d_head)
    return o.permute(0, 2, 1, 3).reshape(B, L, d) @ w_o


# --- 03: count_attention_params, attention_flops_split --------------------------------------------


def _params_from_modules(d_model, num_heads, num_kv_heads=None, bias=True):
    kv_width = (num_kv_heads or num_heads) * (d_model // num_heads)
    with torch.device("meta"):  # shapes only: no memory for Llama 2 70B's 8192 × 8192 matrices
        projections = [torch.nn.Linear(d_model, width, bias=bias) for width in (d_model, kv_width, kv_width, d_model)]
    return sum(p.numel() for layer in projections for p in layer.parameters())


def _params_per_head(d_model, num_heads, num_kv_heads=None, bias=True):
    d_head = d_model // num_heads
    h_kv = num_heads if num_kv_heads is None else num_kv_heads
    per_query_head = d_model * d_head + d_head * d_model  # its W_Q columns and W_O rows
    per_kv_head = 2 * d_model * d_head  # its W_K and W_V columns
    biases = (num_heads * d_head + 2 * h_kv * d_head + d_model) if bias else 0
    return num_heads * per_query_head + h_kv * per_kv_head + biases


def _flops_counted_by_torch(batch, q_len, kv_len, d_model, num_heads, head_dim):
    from torch.utils.flop_counter import FlopCounterMode

    inner = num_heads * head_dim
    xq, xkv = torch.zeros(batch, q_len, d_model), torch.zeros(batch, kv_len, d_model)
    w_q, w_k, w_v, w_o = (torch.zeros(d_model, inner),) * 3 + (torch.zeros(inner, d_model),)
    with FlopCounterMode(display=False) as projections:
        q, k, v = xq @ w_q, xkv @ w_k, xkv @ w_v
        heads = torch.zeros(batch, q_len, inner)
        _ = heads @ w_o
    q = q.view(batch, q_len, num_heads, head_dim).transpose(1, 2)
    k, v = (t.view(batch, kv_len, num_heads, head_dim).transpose(1, 2) for t in (k, v))
    with FlopCounterMode(display=False) as scores:
        _ = torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
    return projections.get_total_flops(), scores.get_total_flops()


def _flops_per_token(batch, q_len, kv_len, d_model, num_heads, head_dim):
    inner = num_heads * head_dim
    per_query = 2 * (d_model * inner + inner * d_model)  # its W_Q row and its W_O row
    per_key = 2 * (2 * d_model * inner)  # its W_K and W_V rows
    per_pair = 2 * (2 * inner)  # one query-key pair: a score and a weighted value, over every head
    return batch * (q_len * per_query + kv_len * per_key), batch * q_len * kv_len * per_pair


# --- 05: causal_mask, leaks_future -----------------------------------------------------------------


def _causal_by_comparison(q_len, k_len=None):
    k_len = q_len if k_len is None else k_len
    return torch.arange(k_len)[None, :] <= torch.arange(q_len)[:, None] + (k_len - q_len)


def _causal_by_triu(q_len, k_len=None):
    k_len = k_len or q_len
    return ~torch.ones(q_len, k_len, dtype=torch.bool).triu(k_len - q_len + 1)


def _causal_by_slicing(q_len, k_len=None):
    k_len = k_len or q_len
    return torch.tril(torch.ones(k_len, k_len)).bool()[k_len - q_len :]  # the last q_len rows


def _leaks_by_autograd(layer, x):
    x = x.clone().requires_grad_(True)
    out = layer(x)
    out = out[0] if isinstance(out, tuple) else out
    L = x.shape[1]
    for t in range(L - 1):
        (grad,) = torch.autograd.grad(out[:, t].sum(), x, retain_graph=True)
        if grad[:, t + 1 :].abs().max() > 0:
            return True
    return False


def _leaks_by_jacobian(layer, x):
    def first(y):
        return y[0] if isinstance(y, tuple) else y

    jac = torch.autograd.functional.jacobian(lambda inp: first(layer(inp)), x[:1])  # (1, L, d, 1, L, d)
    influence = jac.abs().sum(dim=(0, 2, 3, 5))  # (L out, L in)
    return bool((influence.triu(1) > 0).any())


def _leaks_one_position_at_a_time(layer, x):
    def first(y):
        return y[0] if isinstance(y, (tuple, list)) else y

    before = first(layer(x))
    for j in range(1, x.shape[1]):
        x2 = x.clone()
        x2[:, j] += 1.0
        after = first(layer(x2))
        if not torch.equal(before[:, :j], after[:, :j]):
            return True
    return False


def _leaks_with_numpy(layer, x):
    import numpy as np

    def first(y):
        return (y[0] if isinstance(y, (tuple, list)) else y).numpy()

    before = first(layer(x))
    for t in range(x.shape[1] - 1):
        x2 = x.clone()
        x2[:, t + 1 :] = torch.randn(x2[:, t + 1 :].shape)
        if not np.array_equal(before[:, : t + 1], first(layer(x2))[:, : t + 1]):
            return True
    return False


# --- 06: write_kv ---------------------------------------------------------------------------------


def _write_kv_narrow(k_cache, v_cache, k, v, length):
    n = k.shape[2]
    k_cache.narrow(2, length, n).copy_(k)
    v_cache.narrow(2, length, n).copy_(v)
    return k_cache.narrow(2, 0, length + n), v_cache.narrow(2, 0, length + n)


def _write_kv_index_copy(k_cache, v_cache, k, v, length):
    positions = torch.arange(length, length + k.shape[2])
    k_cache.index_copy_(2, positions, k)
    v_cache.index_copy_(2, positions, v)
    end = int(positions[-1]) + 1
    return k_cache[:, :, :end], v_cache[:, :, :end]


def _write_kv_per_position(k_cache, v_cache, k, v, length):
    for i in range(k.shape[2]):
        k_cache[:, :, length + i] = k[:, :, i]
        v_cache[:, :, length + i] = v[:, :, i]
    return k_cache[..., : length + k.shape[2], :], v_cache[..., : length + k.shape[2], :]


# --- 07: ablate_heads, gradient_importance -----------------------------------------------------------


def _ablate_by_clone(head_outputs, w_o, b_o, heads):
    kept = head_outputs.clone()
    kept[:, heads] = 0.0
    B, h, L, d_head = kept.shape
    return F.linear(kept.transpose(1, 2).reshape(B, L, h * d_head), w_o, b_o)


def _ablate_by_sum_of_kept_heads(head_outputs, w_o, b_o, heads):
    B, h, L, d_head = head_outputs.shape
    out = b_o.expand(B, L, -1).clone()
    for i in range(h):
        if i not in heads:  # each head's contribution is its output times its block of W_O's columns
            out += head_outputs[:, i] @ w_o[:, i * d_head : (i + 1) * d_head].T
    return out


def _importance_by_per_sequence_backward(loss_fn, batch_size, num_heads):
    importance = torch.zeros(num_heads)
    for b in range(batch_size):
        gates = torch.ones(batch_size, num_heads, requires_grad=True)
        loss_fn(gates)[b].backward()
        importance += gates.grad[b].abs()
    return importance / batch_size


def _importance_by_jacobian(loss_fn, batch_size, num_heads):
    jac = torch.autograd.functional.jacobian(loss_fn, torch.ones(batch_size, num_heads, dtype=torch.float64))
    per_sequence = jac[torch.arange(batch_size), torch.arange(batch_size)]  # (B, h): ∂loss_b/∂gates[b]
    return per_sequence.abs().mean(dim=0)


# --- 09: online_softmax_update, tiled_attention ------------------------------------------------------


def _online_nan_to_num(row_max, row_sum, acc, scores, v):
    new_max = torch.maximum(row_max, scores.max(dim=-1, keepdim=True).values)
    alpha = torch.exp(row_max - new_max).nan_to_num(0.0)  # -inf - -inf: nothing seen yet
    p = torch.exp(scores - new_max).nan_to_num(0.0)
    return new_max, alpha * row_sum + p.sum(dim=-1, keepdim=True), alpha * acc + p @ v


def _online_where(row_max, row_sum, acc, scores, v):
    new_max = torch.cat([row_max, scores], dim=-1).amax(dim=-1, keepdim=True)
    safe = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
    alpha = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), torch.exp(row_max - safe))
    p = torch.exp(scores - safe)
    return new_max, row_sum * alpha + p.sum(-1, keepdim=True), acc * alpha + torch.einsum("...qk,...kd->...qd", p, v)


def _tiled_logsumexp(q, k, v, mask=None, *, block_size=64):
    """Tiles merged by their log-sum-exp (the form FlashAttention-2's backward keeps)."""
    shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    Lq, Lk = q.shape[-2], k.shape[-2]
    if mask is not None:
        mask = mask.expand(*shape, Lq, Lk)
    out = torch.zeros(*shape, Lq, v.shape[-1])
    for i in range(0, Lq, block_size):
        qi = q[..., i : i + block_size, :] / math.sqrt(q.shape[-1])
        lse = torch.full((*shape, qi.shape[-2], 1), -math.inf)
        o = torch.zeros(*shape, qi.shape[-2], v.shape[-1])
        for j in range(0, Lk, block_size):
            s = qi @ k[..., j : j + block_size, :].transpose(-2, -1)
            if mask is not None:
                s = s.masked_fill(~mask[..., i : i + block_size, j : j + block_size], -math.inf)
            tile_lse = torch.logsumexp(s, dim=-1, keepdim=True)
            new_lse = torch.logaddexp(lse, tile_lse)
            keep_old = torch.exp(lse - new_lse).nan_to_num(0.0)
            take_new = torch.exp(tile_lse - new_lse).nan_to_num(0.0)
            o = o * keep_old + torch.softmax(s, dim=-1).nan_to_num(0.0) @ v[..., j : j + block_size, :] * take_new
            lse = new_lse
        out[..., i : i + block_size, :] = o
    return out


def _tiled_with_the_update(q, k, v, mask=None, *, block_size=64):
    """The key loop outside, every query block's running state in one tensor."""
    q = q * q.shape[-1] ** -0.5
    shape = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    Lq, Lk = q.shape[-2], k.shape[-2]
    m = torch.full((*shape, Lq, 1), -math.inf)
    ell = torch.zeros(*shape, Lq, 1)
    acc = torch.zeros(*shape, Lq, v.shape[-1])
    for j in range(0, Lk, block_size):
        kj, vj = k[..., j : j + block_size, :], v[..., j : j + block_size, :]
        for i in range(0, Lq, block_size):
            s = q[..., i : i + block_size, :] @ kj.transpose(-2, -1)
            if mask is not None:
                tile = mask.expand(*shape, Lq, Lk)[..., i : i + block_size, j : j + block_size]
                s = s.masked_fill(~tile, -math.inf)
            rows = slice(i, i + block_size)
            m[..., rows, :], ell[..., rows, :], acc[..., rows, :] = _online_nan_to_num(
                m[..., rows, :], ell[..., rows, :], acc[..., rows, :], s, vj.expand(*shape, *vj.shape[-2:])
            )
    return torch.where(ell > 0, acc / ell.clamp_min(1e-30), 0.0)


ALTERNATIVES = {
    "normalize_rows": [_rows_by_loop, _rows_by_matmul],
    "scaled_dot_product_attention": [_sdpa_einsum_where, _sdpa_additive_torch, _sdpa_exp_by_hand],
    "address_book_query": [_query_big_numbers, _query_by_table],
    "multi_head_attention_per_head": [_per_head_torch_sdpa, _per_head_einsum],
    "multi_head_attention": [_mha_column_slices, _mha_torch_module, _mha_view_torch_sdpa],
    "count_attention_params": [_params_from_modules, _params_per_head],
    "attention_flops_split": [_flops_counted_by_torch, _flops_per_token],
    "causal_mask": [_causal_by_comparison, _causal_by_triu, _causal_by_slicing],
    "leaks_future": [_leaks_by_autograd, _leaks_by_jacobian, _leaks_one_position_at_a_time, _leaks_with_numpy],
    "write_kv": [_write_kv_narrow, _write_kv_index_copy, _write_kv_per_position],
    "ablate_heads": [_ablate_by_clone, _ablate_by_sum_of_kept_heads],
    "gradient_importance": [_importance_by_per_sequence_backward, _importance_by_jacobian],
    "online_softmax_update": [_online_nan_to_num, _online_where],
    "tiled_attention": [_tiled_logsumexp, _tiled_with_the_update],
}

CASES = [(name, fn) for name, fns in ALTERNATIVES.items() for fn in fns]


@pytest.mark.parametrize(("checker", "fn"), CASES, ids=[f"{n}-{f.__name__.lstrip('_')}" for n, f in CASES])
def test_a_correct_alternative_passes(checker, fn):
    result = mc.check.CHECKERS[checker](fn)
    assert result.passed, repr(result)


def test_every_audited_exercise_has_two_alternatives():
    assert all(len(fns) >= 2 for fns in ALTERNATIVES.values())


@pytest.mark.parametrize("fn", [_sdpa_einsum_where, _sdpa_exp_by_hand], ids=lambda f: f.__name__)
def test_sdpa_alternatives_pass_the_stretch_check(fn):
    assert mc.check.scaled_dot_product_attention(fn, fully_masked_rows=True).passed


# --- diagnoses name only what the code does ---------------------------------------------------------


def _first_output(y):
    return y[0] if isinstance(y, (tuple, list)) else y


def _leaks_next_position_only(layer, x):
    """Wrong: output t is compared only after changing input t + 1 (it changes every input, one at
    a time, and never only the last one)."""
    before = _first_output(layer(x))
    for t in range(x.shape[1] - 1):
        x2 = x.clone()
        x2[:, t + 1] += 1.0
        if not torch.equal(before[:, t], _first_output(layer(x2))[:, t]):
            return True
    return False


def test_a_leak_test_that_changes_each_next_input_is_not_told_it_changed_only_the_last():
    result = mc.check.leaks_future(_leaks_next_position_only)
    assert not result.passed and "position 1 reads position 4" in result.details
    assert "changing only the last input" not in result.message, "that code changes every input"
    assert "the one right after t" in result.message and "change every input after t" in result.message


def _jacrev_importance(loss_fn, batch_size, num_heads):
    jac = torch.func.jacrev(loss_fn)(torch.ones(batch_size, num_heads, dtype=torch.float64))  # (B, B, h)
    return torch.einsum("bbh->bh", jac).abs().mean(dim=0)


def _online_in_place(row_max, row_sum, acc, scores, v):
    new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
    safe = new_max.nan_to_num(neginf=0.0)  # a row that has seen only -inf: exp(-inf - 0) = 0
    alpha = torch.exp(row_max - safe)
    p = torch.exp(scores - safe)
    row_sum.mul_(alpha).add_(p.sum(dim=-1, keepdim=True))
    acc.mul_(alpha).add_(p @ v)
    return new_max, row_sum, acc


@pytest.mark.parametrize(
    ("checker", "fn"),
    [("gradient_importance", _jacrev_importance), ("online_softmax_update", _online_in_place)],
    ids=["gradient_importance-jacrev", "online_softmax_update-in_place"],
)
def test_more_alternatives_pass(checker, fn):
    assert mc.check.CHECKERS[checker](fn).passed
