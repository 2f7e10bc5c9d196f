"""Notebook 07's model and training loop: the model against an independent re-implementation,
equal parameter counts, determinism, side effects, and two heads beating one."""

import pytest
import torch
import torch.nn.functional as F

import mha_course as mc
from mha_course.lessons import tiny_training
from mha_course.lessons.relation_task import TwoRelationTask

TASK = TwoRelationTask()


def expected_param_count(task, d):
    embeddings = task.num_keys * d + task.num_values * d + task.seq_len * d
    attention = 4 * d * d + 4 * d  # W_Q, W_K, W_V, W_O and their biases
    return embeddings + attention + 2 * d + d * task.num_classes + task.num_classes  # + LayerNorm + readout


@pytest.mark.parametrize("d_model", [16, 32])
def test_parameter_count_does_not_depend_on_the_number_of_heads(d_model):
    counts = {
        h: sum(p.numel() for p in tiny_training.TinyAttentionModel(TASK, h, d_model).parameters()) for h in (1, 2, 4, 8)
    }
    assert set(counts.values()) == {expected_param_count(TASK, d_model)}


@pytest.mark.parametrize("num_heads", [1, 2, 4])
def test_model_equals_a_reimplementation_with_torch_modules(num_heads):
    torch.manual_seed(0)
    model = tiny_training.TinyAttentionModel(TASK, num_heads).eval()
    batch = TASK.sample(6, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, weights = model(batch.keys, batch.values, need_weights=True)
        x = model.key_embed.weight[batch.keys] + model.value_embed.weight[batch.values] + model.pos_embed
        ref_attn = model.attn.to_torch()
        a, ref_weights = ref_attn(x, x, x, average_attn_weights=False)
        h = F.layer_norm(x + a, (x.shape[-1],), model.norm.weight, model.norm.bias)
        scored = torch.arange(TASK.book_size + TASK.offset, TASK.seq_len)
        ref_logits = h[:, scored] @ model.readout.weight.T + model.readout.bias
    torch.testing.assert_close(logits, ref_logits)
    torch.testing.assert_close(weights, ref_weights)
    assert logits.shape == (6, TASK.num_queries - TASK.offset, TASK.num_classes)
    fast, none = model(batch.keys, batch.values)  # need_weights=False: PyTorch's fused attention
    torch.testing.assert_close(fast, logits)
    assert none is None


def test_same_seed_gives_bit_identical_training():
    runs = [
        tiny_training.train(TASK, 2, seed=7, steps=15, eval_every=5, eval_size=50, progress=False) for _ in range(2)
    ]
    (m1, h1), (m2, h2) = runs
    assert h1 == h2 and len(h1.steps) == 3 and h1.steps == [5, 10, 15]
    for (name, p1), p2 in zip(m1.state_dict().items(), m2.state_dict().values(), strict=True):
        assert torch.equal(p1, p2), name
    _, h3 = tiny_training.train(TASK, 2, seed=8, steps=15, eval_every=5, eval_size=50, progress=False)
    assert h3.loss != h1.loss


def test_training_restores_threads_and_global_rng():
    threads = torch.get_num_threads()
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    tiny_training.train(TASK, 1, seed=0, steps=2, eval_size=10, progress=False)
    assert torch.get_num_threads() == threads
    assert torch.equal(torch.random.get_rng_state(), state)


def test_fixed_threads_restores_after_an_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError), tiny_training.fixed_threads(1):
        assert torch.get_num_threads() == 1
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before


def test_history_records_the_mean_loss_since_the_last_evaluation(monkeypatch):
    seen = []
    original = F.cross_entropy

    def spy(*args, **kwargs):
        loss = original(*args, **kwargs)
        seen.append(loss.item())
        return loss

    monkeypatch.setattr(tiny_training.F, "cross_entropy", spy)
    _, hist = tiny_training.train(TASK, 1, seed=0, steps=7, eval_every=3, eval_size=20, progress=False)
    assert hist.steps == [3, 6, 7]
    expected = [sum(seen[0:3]) / 3, sum(seen[3:6]) / 3, seen[6]]
    assert hist.loss == pytest.approx(expected)
    assert hist.final() == {"exact": hist.exact[-1], "lookup": hist.lookup[-1], "offset": hist.offset[-1]}


def test_evaluate_matches_the_task_metric_and_restores_the_mode():
    model = tiny_training.TinyAttentionModel(TASK, 2).train()
    batch = tiny_training.eval_batch(TASK, 30)
    acc = tiny_training.evaluate(model, batch)
    assert model.training
    with torch.no_grad():
        logits, _ = model.eval()(batch.keys, batch.values)
    assert acc == TASK.accuracy(logits.argmax(-1), batch.target)


def test_an_open_progress_bar_is_advanced_once_per_step():
    class Bar:
        n = 0

        def update(self, k):
            self.n += k

    bar = Bar()
    tiny_training.train(TASK, 1, seed=0, steps=4, eval_size=10, progress=bar)
    assert bar.n == 4


def test_two_heads_beat_one_head():
    """Same d_model, same parameter count, same seed and batches: after 120 steps the two-head model
    solves the task (both relations), the one-head model only one of them (exact ≈ 1/8)."""
    one = tiny_training.train(TASK, 1, seed=1, steps=120, eval_every=40, progress=False)[1].final()
    two = tiny_training.train(TASK, 2, seed=1, steps=120, eval_every=40, progress=False)[1].final()
    assert two["exact"] > 0.95
    assert one["exact"] < 0.3
    assert two["exact"] > one["exact"] + 0.5


def test_the_models_attention_is_the_course_module():
    model = tiny_training.TinyAttentionModel(TASK, 4)
    assert isinstance(model.attn, mc.MultiHeadAttention) and model.attn.d_head == 8
