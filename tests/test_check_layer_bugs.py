"""Exercise 17.1's checker: two differently written correct diagnosers pass, each listed mistake
is named, answers outside the vocabulary are reported, and every layer the checker builds really
has the one bug it is labelled with (measured here with the course's diagnostics)."""

from __future__ import annotations

import pytest
import torch

import mha_course as mc
from mha_course.check import layer_bugs as lb
from mha_course.lessons import diagnostics as dg


def with_the_course_diagnostics(layer):
    x = torch.randn(3, 10, layer.d_model, generator=torch.Generator().manual_seed(7))
    empty = mc.causal_mask(10).clone()
    empty[0] = False
    with torch.no_grad():
        if not torch.isfinite(layer(x, mask=empty)[0]).all():
            return "nan"
        leak, _ = dg.causal_leakage(lambda t: layer(t, mask=mc.causal_mask(10))[0], x)
        if leak > 1e-6:
            return "leak"
        _, w = layer(x)
    if dg.attention_entropy(w, normalize=True).min() > 0.99:
        return "uniform"
    similarity = dg.head_similarity(w) - torch.eye(layer.num_heads)
    return "identical heads" if similarity.max() > 0.999 else "healthy"


def by_hand(layer):
    x = torch.randn(1, 6, layer.d_model)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    with torch.no_grad():
        out, w = layer(x, mask=causal)
        changed = x.clone()
        changed[0, -1] = 5.0  # only the last token
        past = (layer(changed, mask=causal)[0][0, :-1] - out[0, :-1]).abs().max()
        blocked = torch.zeros(6, 6, dtype=torch.bool)
        blocked[:, 0] = True
        blocked[2, 0] = False  # query 2 reads nothing
        nan = torch.isnan(layer(x, mask=blocked)[0]).any()
        _, w = layer(x)
    spread = (w - 1 / 6).abs().max()
    copies = (w - w[:, :1]).abs().max()
    if nan:
        return "nan"
    if past > 0:
        return "leak"
    if spread < 1e-6:
        return "uniform"
    return "identical heads" if copies < 1e-6 else "healthy"


@pytest.mark.parametrize("fn", [with_the_course_diagnostics, by_hand, lb._wrong()], ids=["dg", "by hand", "checker's"])
def test_correct_diagnosers_pass(fn):
    result = mc.check.find_bug(fn)
    assert result.passed, result


@pytest.mark.parametrize("mistake", lb.FIND_BUG_MISTAKES, ids=lambda m: m.name)
def test_each_mistake_is_named(mistake):
    result = mc.check.find_bug(mistake.fn)
    assert result.status == "failed" and result.message == f"find_bug: likely mistake — {mistake.diagnosis}", result


def test_bad_answers_and_errors_are_reported_without_raising():
    def todo(layer):
        raise NotImplementedError

    assert mc.check.find_bug(todo).status == "not attempted"
    assert "return one of 'healthy'" in mc.check.find_bug(lambda layer: 3).message
    assert "raised ZeroDivisionError" in mc.check.find_bug(lambda layer: 1 / 0).message
    swapped = {"leak": "nan", "nan": "leak"}
    result = mc.check.find_bug(lambda layer: swapped.get(by_hand(layer), by_hand(layer)))
    assert result.status == "failed" and "you said" in result.message


def test_each_layer_has_exactly_its_bug():
    x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(3))
    layers = lb._layers(16, 4, torch.Generator().manual_seed(0))
    empty = mc.causal_mask(7).clone()
    empty[2] = False
    with torch.no_grad():
        for label, layer in layers.items():
            finite = torch.isfinite(layer(x, mask=empty)[0]).all().item()
            leak, _ = dg.causal_leakage(lambda t, m=layer: m(t, mask=mc.causal_mask(7))[0], x)
            _, w = layer(x)
            entropy = dg.attention_entropy(w, normalize=True)
            similarity = (dg.head_similarity(w) - torch.eye(4)).max().item()
            assert finite == (label != "nan"), label
            assert (leak > 1e-6) == (label == "leak"), (label, leak)
            assert (entropy.min() > 0.999) == (label == "uniform"), (label, entropy)
            assert (similarity > 0.999) == (label in ("identical heads", "uniform")), (label, similarity)
            if label != "uniform":
                assert entropy.max() < 0.8, (label, entropy)  # sharp enough to tell from uniform
