"""Checkers of notebook 15: correct variants of the soft-capped scores and the gated output pass,
each listed mistake is named, an unfinished exercise is "not attempted" and a raising one never raises."""

import math

import pytest
import torch

import mha_course as mc

# --- softcap_scores ----------------------------------------------------------------------------


def capped_einsum(q, k, mask, softcap, scale):
    s = torch.einsum("bhqd,bhkd->bhqk", q * scale, k)
    return torch.where(mask, softcap * torch.tanh(s / softcap), torch.tensor(float("-inf")))


def capped_loop(q, k, mask, softcap, scale):  # one score at a time, with math.tanh
    B, h, Lq, _ = q.shape
    Lk = k.shape[2]
    mask = mask.expand(B, h, Lq, Lk)
    out = torch.empty(B, h, Lq, Lk)
    for idx in torch.cartesian_prod(*(torch.arange(n) for n in (B, h, Lq, Lk))).tolist():
        b, i, t, j = idx
        s = float(q[b, i, t] @ k[b, i, j]) * scale
        out[b, i, t, j] = softcap * math.tanh(s / softcap) if mask[b, i, t, j] else -math.inf
    return out


def capped_via_library(q, k, mask, softcap, scale):  # the library's scores, from its attention weights' logs
    s = (q @ k.transpose(-2, -1)) * scale
    s = softcap * torch.tanh(s / softcap)
    return s.masked_fill(mask.logical_not(), -torch.inf)


@pytest.mark.parametrize("fn", [capped_einsum, capped_loop, capped_via_library])
def test_softcap_scores_accepts_correct_variants(fn):
    result = mc.check.softcap_scores(fn)
    assert result.passed, result


def _s(q, k):
    return q @ k.transpose(-2, -1)


@pytest.mark.parametrize(
    "fn, words",
    [
        (
            lambda q, k, m, c, sc: c * torch.tanh((_s(q, k) * sc).masked_fill(~m, float("-inf")) / c),
            "tanh(−inf) = −1",
        ),
        (lambda q, k, m, c, sc: (c * torch.tanh(_s(q, k) / c) * sc).masked_fill(~m, float("-inf")), "unscaled"),
        (lambda q, k, m, c, sc: (c * torch.tanh(_s(q, k) * sc)).masked_fill(~m, float("-inf")), "divide inside"),
        (lambda q, k, m, c, sc: (_s(q, k) * sc).clamp(-c, c).masked_fill(~m, float("-inf")), "not a clamp"),
        (lambda q, k, m, c, sc: (_s(q, k) * sc).masked_fill(~m, float("-inf")), "not capped"),
        (lambda q, k, m, c, sc: (c * torch.tanh(_s(q, k) * sc / c)).masked_fill(~m, 0.0), "needs −inf"),
    ],
)
def test_softcap_scores_names_mistakes(fn, words):
    result = mc.check.softcap_scores(fn)
    assert not result.passed and "likely mistake" in result.message and words in result.message, result


def test_softcap_scores_not_attempted_and_raising():
    def todo(q, k, mask, softcap, scale):
        raise NotImplementedError

    assert mc.check.softcap_scores(todo).status == "not attempted"
    result = mc.check.softcap_scores(lambda q, k, m, c, s: q @ k)
    assert not result.passed and "RuntimeError" in result.message


# --- gated_output ------------------------------------------------------------------------------


def gated_chunk(head_outputs, q_and_gate, o_proj_weight):
    B, h, L, d = head_outputs.shape
    _, gate = q_and_gate.view(B, L, h, 2 * d).chunk(2, dim=-1)  # (B, L, h, d)
    out = head_outputs * torch.sigmoid(gate).transpose(1, 2)  # (B, h, L, d)
    return torch.nn.functional.linear(out.transpose(1, 2).flatten(2), o_proj_weight)


def gated_loop(head_outputs, q_and_gate, o_proj_weight):  # head by head, with 1 / (1 + e^-g)
    B, h, L, d = head_outputs.shape
    parts = []
    for i in range(h):
        g = q_and_gate[..., 2 * d * i + d : 2 * d * (i + 1)]  # (B, L, d)
        parts.append(head_outputs[:, i] / (1 + torch.exp(-g)))
    return torch.cat(parts, dim=-1) @ o_proj_weight.T


def gated_per_head_projection(head_outputs, q_and_gate, o_proj_weight):  # o_proj split into per-head blocks
    B, h, L, d = head_outputs.shape
    gate = torch.sigmoid(q_and_gate.unflatten(-1, (h, 2, d))[..., 1, :])  # (B, L, h, d)
    blocks = o_proj_weight.unflatten(1, (h, d))  # (d_model, h, d)
    return torch.einsum("bhld,blhd,mhd->blm", head_outputs, gate, blocks)


@pytest.mark.parametrize("fn", [gated_chunk, gated_loop, gated_per_head_projection])
def test_gated_output_accepts_correct_variants(fn):
    result = mc.check.gated_output(fn)
    assert result.passed, result


def _merged(x):
    B, h, L, d = x.shape
    return x.transpose(1, 2).reshape(B, L, h * d)


def _gate(qg, h, d):
    return qg.view(*qg.shape[:2], h, 2 * d)[..., d:].reshape(*qg.shape[:2], h * d)


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda o, qg, w: (_merged(o) * _gate(qg, o.shape[1], o.shape[3])) @ w.T, "raw gate logits"),
        (
            lambda o, qg, w: (
                (_merged(o) * torch.sigmoid(qg.view(*qg.shape[:2], o.shape[1], -1)[..., : o.shape[3]].flatten(2))) @ w.T
            ),
            "which is the query",
        ),
        (lambda o, qg, w: (_merged(o) * torch.sigmoid(qg[..., qg.shape[-1] // 2 :])) @ w.T, "layout is per head"),
        (
            lambda o, qg, w: (
                (o * torch.sigmoid(qg[..., o.shape[3] : 2 * o.shape[3]])[:, None]).transpose(1, 2).flatten(2) @ w.T
            ),
            "first head's gate",
        ),
        (
            lambda o, qg, w: (_merged(o) @ w.T) * torch.sigmoid(_gate(qg, o.shape[1], o.shape[3])),
            "after o_proj",
        ),
    ],
)
def test_gated_output_names_mistakes(fn, words):
    result = mc.check.gated_output(fn)
    assert not result.passed and "likely mistake" in result.message and words in result.message, result


def test_gated_output_not_attempted_and_raising():
    def todo(head_outputs, q_and_gate, o_proj_weight):
        raise NotImplementedError

    assert mc.check.gated_output(todo).status == "not attempted"
    result = mc.check.gated_output(lambda o, qg, w: o @ w)
    assert not result.passed and "RuntimeError" in result.message


def test_the_gated_layer_is_what_the_checker_expects():
    """The package's layer with output_gate=True computes the checker's reference."""
    from mha_course.check.modern import _gated_reference

    torch.manual_seed(0)
    layer = mc.GroupedQueryAttention(8, 2, 2, output_gate=True).double()
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    q_and_gate = layer.q_proj(x)  # (1, 5, 16)
    q = q_and_gate.view(1, 5, 2, 8)[..., :4].transpose(1, 2)
    k, v = (p(x).view(1, 5, 2, 4).transpose(1, 2) for p in (layer.k_proj, layer.v_proj))
    heads = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = _gated_reference(heads, q_and_gate, layer.o_proj.weight)
    torch.testing.assert_close(layer(x, is_causal=True)[0], expected, atol=1e-12, rtol=0)
