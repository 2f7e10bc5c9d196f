"""Notebook 11's context-extension experiment: the task is what it says, the model's attention
is the attention it claims (against F.scaled_dot_product_attention with the same rotations or
bias), the intervals are Student-t intervals, and a short run learns the task."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import mha_course as mc
from mha_course.lessons import rope_extension as ext


def test_retrieval_batch_holds_the_answer_once():
    g = torch.Generator().manual_seed(0)
    keys, values, query, answer = ext.retrieval_batch(200, 40, num_keys=8, num_values=5, generator=g)
    assert keys.shape == values.shape == (200, 39) and query.shape == answer.shape == (200,)
    hits = keys == query[:, None]  # (B, n)
    assert torch.equal(hits.sum(1), torch.ones(200, dtype=torch.long))  # exactly one item matches
    assert torch.equal(values[hits], answer)
    where = hits.float().argmax(1)
    assert where.min() == 0 and where.max() == 38  # the answer can sit anywhere


@pytest.mark.parametrize("scheme", ["RoPE", "ALiBi"])
def test_model_is_one_attention_read_at_the_query(scheme):
    s = ext.Setup(num_heads=2, d_model=16)
    torch.manual_seed(0)
    model = ext.RetrievalModel(scheme, s).double()
    g = torch.Generator().manual_seed(1)
    keys, values, query, _ = ext.retrieval_batch(3, 12, num_keys=s.num_keys, num_values=s.num_values, generator=g)
    yarn = ext.scaling_for("YaRN", 2, 6) if scheme == "RoPE" else None
    x_q = model.query_embed(query)[:, None]
    x = torch.cat([model.key_embed(keys) + model.value_embed(values), x_q], 1)  # (B, 12, d)
    q = model.q_proj(x_q).view(3, 1, 2, 8).transpose(1, 2)
    k = model.k_proj(x).view(3, 12, 2, 8).transpose(1, 2)
    v = model.v_proj(x).view(3, 12, 2, 8).transpose(1, 2)
    if scheme == "RoPE":  # rotate with the package's apply_rope, attend with torch's SDPA
        q = mc.apply_rope(q, torch.tensor([11]), scaling=yarn)
        k = mc.apply_rope(k, torch.arange(12), scaling=yarn)
        out = F.scaled_dot_product_attention(q, k, v)
    else:
        slopes = torch.tensor([2**-4, 2**-8], dtype=torch.float64)  # ALiBi's slopes for 2 heads
        bias = -slopes[:, None, None] * (11 - torch.arange(12, dtype=torch.float64))  # (h, 1, 12)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    expected = model.readout(x_q + model.o_proj(out.transpose(1, 2).flatten(2)))[:, 0]
    with torch.no_grad():
        assert torch.allclose(model(keys, values, query, scaling=yarn), expected, atol=1e-10)


def test_scaling_for_each_method():
    assert ext.scaling_for("RoPE", 4, 32) is None and ext.scaling_for("YaRN", 1, 32) is None
    assert ext.scaling_for("interpolation", 4, 32) == {"rope_type": "linear", "factor": 4.0}
    yarn = ext.scaling_for("YaRN", 2, 32)
    assert yarn["rope_type"] == "yarn" and yarn["original_max_position_embeddings"] == 32
    assert mc.rope_attention_factor(yarn) == pytest.approx(0.1 * math.log(2) + 1)


def test_interval_is_the_student_t_interval_of_the_mean():
    values = [0.6, 0.7, 0.8]
    mean, lo, hi = ext.interval(values)
    sd = (sum((v - 0.7) ** 2 for v in values) / 2) ** 0.5
    assert mean == pytest.approx(0.7) and hi - mean == pytest.approx(4.303 * sd / math.sqrt(3))
    assert lo == pytest.approx(0.7 - 4.303 * sd / math.sqrt(3))
    assert ext.interval([0.99, 1.0])[2] == 1.0  # clipped at 1
    assert ext.interval([0.4]) == (0.4, 0.4, 0.4)


def test_a_short_run_learns_the_task_and_tabulates_every_method():
    s = ext.Setup(steps=120, seeds=(0,), eval_factors=(1, 2), eval_batch=300)
    results = ext.run(s, progress=False)
    assert set(results) == {(m, f) for m in ext.METHODS for f in (1, 2)}
    assert results[("RoPE", 1)][0] > 3 / s.num_values  # well above chance after 120 steps
    assert results[("RoPE", 1)] == results[("YaRN", 1)] == results[("interpolation", 1)]  # factor 1
    text = ext.table(results, s)
    assert all(m in text for m in ext.METHODS) and "L = 64 (2x)" in text


def test_cli_prints_the_table(capsys):
    ext.main(["--seeds", "2", "--steps", "3", "--eval-batch", "20"])
    out = capsys.readouterr().out
    assert "2 runs" in out and "YaRN" in out and "[95% CI]" in out


@pytest.mark.parametrize(("length", "method"), [(9, "RoPE"), (24, "YaRN"), (17, "interpolation"), (40, "dynamic NTK")])
def test_local_order_model_is_one_causal_sdpa_layer(length, method):
    """The model against F.scaled_dot_product_attention (causal) with the package's rotations."""
    s = ext.LocalSetup(train_length=8, d_model=16, num_heads=2, vocab=6)
    torch.manual_seed(0)
    model = ext.LocalOrderModel(s).double()
    tokens = torch.randint(0, 6, (3, length), generator=torch.Generator().manual_seed(1))
    kw = ext.local_method(method, s, length)
    pos = torch.arange(length)

    def heads(t):  # (B, L, 16) -> (B, 2, L, 8)
        return t.view(t.shape[0], t.shape[1], 2, 8).transpose(1, 2)

    theta, scaling = kw.get("theta", 10000.0), kw.get("scaling")
    with torch.no_grad():
        x = model.embed(tokens)
        q = mc.apply_rope(heads(model.q_proj(x)), pos, theta=theta, scaling=scaling)
        k = mc.apply_rope(heads(model.k_proj(x)), pos, theta=theta, scaling=scaling)
        out = F.scaled_dot_product_attention(q, k, heads(model.v_proj(x)), is_causal=True)
        expected = model.readout(x + model.o_proj(out.transpose(1, 2).flatten(2)))
        assert torch.allclose(model(tokens, **kw), expected, atol=1e-10)
        if method != "RoPE":  # the method reaches the rotations
            assert not torch.allclose(model(tokens), expected, atol=1e-6)


def test_local_method_keywords():
    s = ext.LocalSetup(train_length=32, d_model=32, num_heads=2)
    assert ext.local_method("RoPE", s, 128) == {}
    assert ext.local_method("interpolation", s, 32) == {}  # at the trained length: plain RoPE
    assert ext.local_method("interpolation", s, 128) == {"scaling": {"rope_type": "linear", "factor": 4.0}}
    yarn = ext.local_method("YaRN", s, 64)["scaling"]
    assert yarn == {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32}
    assert ext.local_method("dynamic NTK", s, 32) == {"theta": 10000.0}
    assert ext.local_method("dynamic NTK", s, 128)["theta"] == pytest.approx(10000.0 * 4 ** (16 / 14))
    with pytest.raises(ValueError, match="method must be one of"):
        ext.local_method("ALiBi", s, 64)


@pytest.mark.parametrize(
    "args, match",
    [
        ((10000.0, 16, 0, 32), "positive integers"),
        ((10000.0, 16, 64, 32.0), "positive integers"),
        ((10000.0, 3, 64, 32), "head_dim"),
    ],
)
def test_dynamic_ntk_theta_bad_input_is_named(args, match):
    with pytest.raises(ValueError, match=match):
        ext.dynamic_ntk_theta(*args)


def test_local_accuracy_counts_the_token_one_back():
    """A stand-in model that outputs one-hot logits of the token k back scores 1 for k = 1 only."""
    s = ext.LocalSetup(train_length=8, vocab=5, eval_batch=20)

    class Back(torch.nn.Module):
        def __init__(self, k):
            super().__init__()
            self.k = k

        def forward(self, tokens, **kw):
            shifted = torch.roll(tokens, self.k, dims=1)  # (B, L): token k positions back (wraps)
            return F.one_hot(shifted, 5).double()

    assert ext.local_accuracy(Back(1), s, 2, "RoPE") == 1.0
    assert ext.local_accuracy(Back(0), s, 2, "RoPE") < 0.4  # the token itself: right only by repeats
    assert ext.local_accuracy(Back(2), s, 2, "RoPE") < 0.4


def test_a_short_local_run_learns_and_interpolation_loses_local_order():
    s = ext.LocalSetup(train_length=16, steps=100, seeds=(0,), eval_factors=(1, 4), eval_batch=50)
    results = ext.run_local(s, progress=False)
    assert set(results) == {(m, f) for m in ext.LOCAL_METHODS for f in (1, 4)}
    assert len({results[(m, 1)][0] for m in ext.LOCAL_METHODS}) == 1  # factor 1: all plain RoPE
    assert results[("RoPE", 1)][0] > 0.9  # learnt: chance is 1/16
    assert results[("interpolation", 4)][0] < results[("YaRN", 4)][0] - 0.3
    text = ext.table(results, s, ext.LOCAL_METHODS)
    assert text.splitlines()[0].split() == ["method", "L", "=", "16", "(1x)", "L", "=", "64", "(4x)"]
    assert [line[:14].strip() for line in text.splitlines()[1:]] == list(ext.LOCAL_METHODS)
