"""The multi_head_attention_layer checker (notebook 05, exercise 5.1): whole layers written in
different correct ways pass, each known mistake is named, and the reference it compares with is
torch.nn.MultiheadAttention itself (checked here against a per-head loop written from the formula)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mha_course as mc
from mha_course.check import layer as layer_check


class Base(nn.Module):
    """The parameters every variant shares; subclasses write forward."""

    def __init__(self, d_model, num_heads, bias=True):
        super().__init__()
        self.h, self.d_head = num_heads, d_model // num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(d_model, d_model, bias=bias) for _ in range(4)
        )

    def split(self, t):  # (B, L, d_model) -> (B, h, L, d_head)
        B, L, _ = t.shape
        return t.view(B, L, self.h, self.d_head).transpose(1, 2)

    def merge(self, t):  # (B, h, L, d_head) -> (B, L, d_model)
        B, _, L, _ = t.shape
        return t.transpose(1, 2).reshape(B, L, -1)


class ByHand(Base):  # masked_fill with -inf, returns (out, weights)
    def forward(self, x, mask=None):
        q, k, v = (self.split(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = s.softmax(-1)
        return self.out_proj(self.merge(w @ v)), w


class BySdpa(Base):  # PyTorch's fused kernel, bool mask True = attend
    def forward(self, x, mask=None):
        q, k, v = (self.split(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        return self.out_proj(self.merge(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))


class ByLoop(Base):  # a loop over the heads' column blocks, an additive mask of -1e9
    def forward(self, x, mask=None):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        outs = []
        for i in range(self.h):
            c = slice(i * self.d_head, (i + 1) * self.d_head)
            s = q[..., c] @ k[..., c].transpose(-2, -1) / self.d_head**0.5  # (B, L, L)
            if mask is not None:
                m = mask[:, 0] if mask.dim() == 4 else mask  # (B, Lq, Lk) or (Lq, Lk)
                s = s + (~m) * -1e9
            outs.append(s.softmax(-1) @ v[..., c])
        return self.out_proj(torch.cat(outs, -1))


class ByEinsum(Base):  # einsum, torch.where
    def forward(self, x, mask=None):
        B, L, d = x.shape
        q, k, v = (p(x).unflatten(-1, (self.h, self.d_head)) for p in (self.q_proj, self.k_proj, self.v_proj))
        s = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(self.d_head)
        if mask is not None:
            s = torch.where(mask, s, torch.tensor(float("-inf")))
        return self.out_proj(torch.einsum("bhqk,bkhe->bqhe", s.softmax(-1), v).reshape(B, L, d))


class ByCourse(Base):  # the course's own function
    def forward(self, x, mask=None):
        q, k, v = (mc.split_heads(p(x), self.h) for p in (self.q_proj, self.k_proj, self.v_proj))
        return self.out_proj(mc.merge_heads(mc.scaled_dot_product_attention(q, k, v, mask)[0]))


@pytest.mark.parametrize("cls", [ByHand, BySdpa, ByLoop, ByEinsum, ByCourse])
def test_correct_layers_pass_and_the_leakage_test_runs_on_them(cls):
    result = mc.check.multi_head_attention_layer(cls)
    assert result.passed, result
    assert "leakage test" in result.message and "6 cases" in result.message


def test_reference_is_nn_multihead_attention_equal_to_a_per_head_loop():
    w = layer_check._Weights(12, 3, True, 1)
    x = torch.randn(2, 5, 12)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    layer = ByLoop(12, 3)
    (wq, wk, wv, wo), (bq, bk, bv, bo) = w.tensors()
    with torch.no_grad():
        for p, wt, bt in zip(
            (layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj), (wq, wk, wv, wo), (bq, bk, bv, bo), strict=True
        ):
            p.weight.copy_(wt)
            p.bias.copy_(bt)
        torch.testing.assert_close(layer_check._reference(w, x, mask), layer(x, mask))


def _layer_with(**wrong):
    """A class whose forward is the checker-independent hand-written layer with one mistake."""

    class Wrong(Base):
        def forward(self, x, mask=None):
            B, L, d = x.shape
            bias = wrong.get("bias", True)
            lin = (lambda p, t: p(t)) if bias else (lambda p, t: F.linear(t, p.weight))
            if wrong.get("split") == "no transpose":
                q, k, v = (
                    lin(p, x).reshape(B, self.h, L, self.d_head) for p in (self.q_proj, self.k_proj, self.v_proj)
                )
            else:
                q, k, v = (self.split(lin(p, x)) for p in (self.q_proj, self.k_proj, self.v_proj))
            s = q @ k.transpose(-2, -1) / math.sqrt(d if wrong.get("width") == "d_model" else self.d_head)
            if mask is not None and not wrong.get("after"):
                s = s.masked_fill(mask if wrong.get("inverted") else ~mask, float("-inf"))
            w = s.softmax(wrong.get("dim", -1))
            if mask is not None and wrong.get("after"):
                w = w * mask
            c = w @ v
            merged = c.reshape(B, L, d) if wrong.get("merge") == "no transpose" or wrong.get("split") else self.merge(c)
            if wrong.get("no_out"):
                return merged
            if wrong.get("out_bias") is False:
                return F.linear(merged, self.out_proj.weight)
            return lin(self.out_proj, merged)

    return Wrong


@pytest.mark.parametrize(
    "wrong, words",
    [
        ({"split": "no transpose"}, "band of consecutive tokens"),
        ({"merge": "no transpose"}, "the merge reshapes"),
        ({"width": "d_model"}, "√d_model"),
        ({"inverted": True}, "polarity is inverted"),
        ({"after": True}, "after the softmax"),
        ({"dim": -2}, "query axis"),
        ({"bias": False}, "biases are not applied"),
        ({"out_bias": False}, "W_O's bias is missing"),
        ({"no_out": True}, "without W_O"),
    ],
)
def test_each_known_mistake_is_named(wrong, words):
    Wrong = _layer_with(**wrong)
    result = mc.check.multi_head_attention_layer(Wrong)
    assert not result.passed and result.status == "failed"
    assert "likely mistake" in result.message and words in result.message, result


def test_no_scale_is_named():
    class NoScale(Base):
        def forward(self, x, mask=None):
            q, k, v = (self.split(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
            return self.out_proj(self.merge(out))

    result = mc.check.multi_head_attention_layer(NoScale)
    assert not result.passed and "not scaled" in result.message, result


def test_projections_built_without_bias_are_named_as_a_missing_bias():
    class NoBias(ByHand):
        def __init__(self, d_model, num_heads, bias=True):
            super().__init__(d_model, num_heads, bias=False)

    result = mc.check.multi_head_attention_layer(NoBias)
    assert not result.passed and result.message.startswith("multi_head_attention_layer: bias missing"), result


def test_a_bias_argument_that_is_ignored_is_named():
    class AlwaysBias(ByHand):
        def __init__(self, d_model, num_heads, bias=True):
            super().__init__(d_model, num_heads, bias=True)

    result = mc.check.multi_head_attention_layer(AlwaysBias)
    assert not result.passed and "bias=False" in result.message and "pass the bias" in result.message, result


def test_layout_problems_and_placeholders():
    class NoSignature(ByHand):
        def __init__(self, d_model, num_heads):
            super().__init__(d_model, num_heads)

    assert "(d_model, num_heads, bias=True)" in mc.check.multi_head_attention_layer(NoSignature).message

    class Fused(nn.Module):
        def __init__(self, d_model, num_heads, bias=True):
            super().__init__()
            self.qkv = nn.Linear(d_model, 3 * d_model)

    assert "layer.q_proj should be an nn.Linear" in mc.check.multi_head_attention_layer(Fused).message

    class Todo(nn.Module):
        def __init__(self, d_model, num_heads, bias=True):
            super().__init__()
            raise NotImplementedError("Exercise 5.1: your code here")

    assert mc.check.multi_head_attention_layer(Todo).status == "not attempted"

    class HalfDone(Base):
        def forward(self, x, mask=None):
            raise NotImplementedError("Exercise 5.1: your code here")

    assert mc.check.multi_head_attention_layer(HalfDone).status == "not attempted"
    assert "your class" in mc.check.multi_head_attention_layer(ByHand(8, 2)).message


def test_the_leakage_stage_measures_the_learners_own_layer(monkeypatch):
    class IgnoresMask(ByHand):
        def forward(self, x, mask=None):
            return super().forward(x)

    assert layer_check._leakage(ByHand) == 0.0  # a causal layer's past does not move at all
    assert layer_check._leakage(IgnoresMask) > 0.01
    monkeypatch.setattr(layer_check, "_leakage", lambda cls: 0.25)  # as if only this stage saw a leak
    result = mc.check.multi_head_attention_layer(ByHand)
    assert not result.passed and "leakage test fails" in result.message and "2.50e-01" in result.message


def test_the_check_is_deterministic_and_leaves_the_global_rng_alone():
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    first = mc.check.multi_head_attention_layer(ByHand)
    wrong = mc.check.multi_head_attention_layer(_layer_with(inverted=True))
    assert torch.equal(before, torch.random.get_rng_state())
    assert repr(first) == repr(mc.check.multi_head_attention_layer(ByHand))
    assert repr(wrong) == repr(mc.check.multi_head_attention_layer(_layer_with(inverted=True)))
