"""Checker of notebook 10's pre-norm block: correct variants pass (the parts called as modules, or
their weights used by hand), each listed mistake is named, an unfinished exercise is "not attempted"
and a raising one never raises."""

import pytest
import torch
import torch.nn.functional as F

import mha_course as mc
from mha_course.check import block as checker


def as_modules(x, parts, mask=None):
    x = x + parts["attn"](parts["norm1"](x), mask=mask)[0]
    h = parts["norm2"](x)
    return x + parts["down"](F.silu(parts["gate"](h)) * parts["up"](h))


def by_hand(x, parts, mask=None):  # the norms and the feed-forward written out from their weights
    def rms(t, norm):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight

    out, _ = parts["attn"](rms(x, parts["norm1"]), mask=mask)
    x = x + out
    h = rms(x, parts["norm2"])
    gate, up = h @ parts["gate"].weight.T, h @ parts["up"].weight.T
    return x + (gate * torch.sigmoid(gate) * up) @ parts["down"].weight.T


@pytest.mark.parametrize("fn", [as_modules, by_hand])
def test_correct_variants_pass(fn):
    result = mc.check.pre_norm_block(fn)
    assert result.passed, result


def test_the_reference_is_a_llama_decoder_layer_written_out():
    g = torch.Generator().manual_seed(0)
    parts = checker.make_parts(8, 2, 16, g)
    x = torch.randn(2, 5, 8, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(
            checker._reference(x, parts, mc.causal_mask(5)), by_hand(x, parts, mc.causal_mask(5))
        )


@pytest.mark.parametrize("mistake", checker.PRE_NORM_BLOCK_MISTAKES, ids=lambda m: m.name)
def test_each_mistake_is_named(mistake):
    result = mc.check.pre_norm_block(mistake.fn)
    assert not result.passed and f"likely mistake — {mistake.diagnosis}" in result.message, result


def test_not_attempted_and_raising():
    def todo(x, parts, mask=None):
        raise NotImplementedError

    assert mc.check.pre_norm_block(todo).status == "not attempted"
    result = mc.check.pre_norm_block(lambda x, parts, mask=None: parts["nope"](x))
    assert not result.passed and "KeyError" in result.message
