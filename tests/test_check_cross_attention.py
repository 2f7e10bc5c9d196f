"""The cross_attention checker (notebook 05): correct single-head cross-attentions of several
kinds pass both stages (fixed inputs, then training on the reversal task), each known mistake is
named, and a function that is right but cuts the gradient fails the training stage."""

import math

import pytest
import torch
import torch.nn.functional as F

import mha_course as mc
from mha_course.lessons import reorder_task


def with_course_mask(target, source, source_lengths, w_q, w_k, w_v):
    keep = mc.padding_mask(source_lengths, source.shape[1])[:, 0]  # (B, 1, Ls)
    return mc.scaled_dot_product_attention(target @ w_q, source @ w_k, source @ w_v, keep)


def by_hand(target, source, source_lengths, w_q, w_k, w_v):
    q, k, v = target @ w_q, source @ w_k, source @ w_v
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, Lt, Ls)
    pad = torch.arange(source.shape[1]) >= source_lengths[:, None]  # (B, Ls), True = padding
    weights = scores.masked_fill(pad[:, None, :], float("-inf")).softmax(dim=-1)
    return weights @ v, weights


def with_einsum(target, source, source_lengths, w_q, w_k, w_v):
    q = torch.einsum("btd,dk->btk", target, w_q)
    k = torch.einsum("bsd,dk->bsk", source, w_k)
    v = torch.einsum("bsd,dk->bsk", source, w_v)
    scores = torch.einsum("btk,bsk->bts", q, k) * q.shape[-1] ** -0.5
    keep = torch.stack([torch.arange(source.shape[1]) < n for n in source_lengths])  # (B, Ls)
    scores = torch.where(keep[:, None], scores, torch.finfo(scores.dtype).min)
    weights = F.softmax(scores, dim=-1)
    return torch.einsum("bts,bsk->btk", weights, v), weights


@pytest.mark.parametrize("fn", [with_course_mask, by_hand, with_einsum])
def test_correct_variants_pass_both_stages(fn):
    result = mc.check.cross_attention(fn)
    assert result.passed, result
    assert "trained to reverse the source" in result.message


def test_reference_agrees_with_nn_multihead_attention():
    # one head, no biases: nn.MultiheadAttention with kdim/vdim computes the same cross-attention
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(6, 1, bias=False, kdim=10, vdim=10, batch_first=True)
    target, source = torch.randn(2, 4, 6), torch.randn(2, 5, 10)
    lengths = torch.tensor([5, 2])
    theirs, w_theirs = mha(target, source, source, key_padding_mask=torch.arange(5) >= lengths[:, None])
    ours, w_ours = reorder_task.cross_attention(
        target, source, lengths, mha.q_proj_weight.T, mha.k_proj_weight.T, mha.v_proj_weight.T
    )
    torch.testing.assert_close(mha.out_proj(ours), theirs)
    torch.testing.assert_close(w_ours, w_theirs)


def test_trained_model_learns_the_reversal():
    model, losses = reorder_task.train()
    learned = reorder_task.alignment(model)
    assert losses[-1] < 0.05 < losses[0]
    assert learned.aligned == learned.slots == 6 and learned.weight_on_target > 0.9
    assert learned.accuracy > 0.99
    torch.testing.assert_close(learned.mean_weights.sum(-1), torch.ones(6))


def test_another_order_is_learned_too():
    order = [2, 0, 5, 1, 4, 3]
    model, _ = reorder_task.train(order=order)
    assert reorder_task.alignment(model, order=order).aligned == 6


def swapped(target, source, source_lengths, w_q, w_k, w_v):
    return mc.scaled_dot_product_attention(source @ w_q, target @ w_k, target @ w_v)


def causal(target, source, source_lengths, w_q, w_k, w_v):
    keep = mc.padding_mask(source_lengths, source.shape[1])[:, 0]
    tril = torch.tril(torch.ones(target.shape[1], source.shape[1])).bool()
    return mc.scaled_dot_product_attention(target @ w_q, source @ w_k, source @ w_v, keep & tril)


def no_padding(target, source, source_lengths, w_q, w_k, w_v):
    return mc.scaled_dot_product_attention(target @ w_q, source @ w_k, source @ w_v)


def four_d_mask(target, source, source_lengths, w_q, w_k, w_v):
    q, k, v = target @ w_q, source @ w_k, source @ w_v
    keep = mc.padding_mask(source_lengths, source.shape[1])  # (B, 1, 1, Ls): one axis too many
    scores = (q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])).masked_fill(~keep, float("-inf"))  # (B, B, Lt, Ls)
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def query_softmax(target, source, source_lengths, w_q, w_k, w_v):
    q, k, v = target @ w_q, source @ w_k, source @ w_v
    pad = torch.arange(source.shape[1]) >= source_lengths[:, None]
    scores = (q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])).masked_fill(pad[:, None], float("-inf"))
    weights = scores.softmax(dim=1)
    return weights @ v, weights


def scale_d_model(target, source, source_lengths, w_q, w_k, w_v):
    keep = mc.padding_mask(source_lengths, source.shape[1])[:, 0]
    scale = target.shape[-1] ** -0.5
    return mc.scaled_dot_product_attention(target @ w_q, source @ w_k, source @ w_v, keep, scale=scale)


def detached(target, source, source_lengths, w_q, w_k, w_v):
    with torch.no_grad():  # the weights computed without autograd: only w_v can learn
        _, weights = with_course_mask(target, source, source_lengths, w_q, w_k, w_v)
    return weights @ (source @ w_v), weights


MISTAKES = {
    "swapped": (swapped, "source and target are swapped"),
    "causal": (causal, "causal triangle"),
    "no padding mask": (no_padding, "padding keys get weight"),
    "4-D mask": (four_d_mask, "an axis too many"),
    "query softmax": (query_softmax, "over the queries"),
    "scale d_model": (scale_d_model, "√d_tgt"),
    "detached": (detached, "no gradient reaches the weights"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_each_mistake_is_named(mistake):
    fn, words = MISTAKES[mistake]
    result = mc.check.cross_attention(fn)
    assert not result.passed
    assert "likely mistake" in result.message and words in result.message, result


def test_not_attempted_and_in_place_write():
    def todo(*args):
        raise NotImplementedError

    assert mc.check.cross_attention(todo).status == "not attempted"

    def writes_into_w_q(target, source, source_lengths, w_q, w_k, w_v):
        out = with_course_mask(target, source, source_lengths, w_q, w_k, w_v)
        w_q.mul_(1.0)  # in place on a leaf that requires grad: fails only under training
        return out

    result = mc.check.cross_attention(writes_into_w_q)
    assert not result.passed and "training through it raised" in result.message
