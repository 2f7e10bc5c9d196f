"""Exercise 8.1's checker: correct copies pass whichever way they are written, each listed mistake
is diagnosed by name, and the layout the checker's stand-in layers use is transformers' own: a
correct copy of a real BertLayer reproduces BertModel's attention probabilities."""

from __future__ import annotations

import pytest
import torch

import mha_course as mc
from mha_course.check import bert_layer


def by_state_dict(layer, num_heads):
    sa, dense = layer.attention.self, layer.attention.output.dense
    module = mc.MultiHeadAttention(sa.query.in_features, num_heads)
    renamed = {}
    for ours, theirs in {"q_proj": sa.query, "k_proj": sa.key, "v_proj": sa.value, "out_proj": dense}.items():
        renamed |= {f"{ours}.{key}": value for key, value in theirs.state_dict().items()}
    module.load_state_dict(renamed)
    return module


def by_copying_parameters(layer, num_heads):
    sa = layer.attention.self
    module = mc.MultiHeadAttention(sa.key.weight.shape[1], num_heads)
    pairs = zip(
        (module.q_proj, module.k_proj, module.v_proj, module.out_proj),
        (sa.query, sa.key, sa.value, layer.attention.output.dense),
        strict=True,
    )
    with torch.no_grad():
        for ours, theirs in pairs:
            ours.weight.copy_(theirs.weight)
            ours.bias.copy_(theirs.bias)
    return module


class PerHead(torch.nn.Module):
    """A third way: h explicit heads, sliced out of the layer's matrices, and W_O kept whole."""

    def __init__(self, layer, num_heads):
        super().__init__()
        sa = layer.attention.self
        self.q, self.k, self.v, self.o = sa.query, sa.key, sa.value, layer.attention.output.dense
        self.h = num_heads

    def forward(self, x, mask=None):
        B, L, d = x.shape
        dh = d // self.h
        outs, weights = [], []
        for i in range(self.h):
            rows = slice(i * dh, (i + 1) * dh)
            q = x @ self.q.weight[rows].T + self.q.bias[rows]
            k = x @ self.k.weight[rows].T + self.k.bias[rows]
            v = x @ self.v.weight[rows].T + self.v.bias[rows]
            scores = q @ k.transpose(-2, -1) / dh**0.5  # (B, L, L)
            if mask is not None:
                scores = scores.masked_fill(~mask[:, 0], float("-inf"))
            w = torch.softmax(scores, dim=-1)
            weights.append(w)
            outs.append(w @ v)
        return self.o(torch.cat(outs, dim=-1)), torch.stack(weights, dim=1)


@pytest.mark.parametrize("fn", [by_state_dict, by_copying_parameters, PerHead], ids=lambda f: f.__name__)
def test_correct_copies_pass(fn):
    result = mc.check.attention_from_bert(fn)
    assert result.passed, result


@pytest.mark.parametrize("mistake", bert_layer.ATTENTION_FROM_BERT_MISTAKES, ids=lambda m: m.name)
def test_each_mistake_is_diagnosed_by_name(mistake):
    result = mc.check.attention_from_bert(mistake.fn)
    assert result.status == "failed"
    assert f"likely mistake — {mistake.diagnosis.split(':')[0]}" in result.message, result


def test_unattempted_wrong_types_and_errors_are_reported_without_raising():
    def todo(layer, num_heads):
        raise NotImplementedError

    assert mc.check.attention_from_bert(todo).status == "not attempted"
    assert (
        "expected a module" in mc.check.attention_from_bert(lambda layer, h: layer.attention.self.query.weight).message
    )
    assert "raised" in mc.check.attention_from_bert(lambda layer, h: layer.attention.query).message
    assert "expected your function" in mc.check.attention_from_bert("attention_from_bert").message


def test_the_stand_in_layout_is_transformers_bert_layer():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=24,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=48,
        max_position_embeddings=16,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 50, (2, 7))
    attention_mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    with torch.no_grad():
        ref = model(ids, attention_mask=attention_mask, output_attentions=True, output_hidden_states=True)
        for i, layer in enumerate(model.encoder.layer):
            module = by_copying_parameters(layer, config.num_attention_heads)
            x = ref.hidden_states[i]  # the layer's input
            _, weights = module(x, mask=attention_mask.bool()[:, None, None, :])
            torch.testing.assert_close(weights, ref.attentions[i], atol=1e-6, rtol=1e-5)
            assert mc.check.attention_from_bert(lambda _layer, h, m=module: m).passed is False  # fixed weights fail
