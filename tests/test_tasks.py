"""The two-relation task of notebook 07: labels checked by an independent loop, the metric, errors."""

import pytest
import torch

from mha_course.lessons.relation_task import KEY_NAMES, TwoRelationTask

TASKS = [
    TwoRelationTask(),
    TwoRelationTask(num_keys=5, num_values=3, book_size=5, num_queries=4, offset=2),
    TwoRelationTask(num_keys=10, num_values=12, book_size=4, num_queries=2, offset=1),
]


def answers_by_loop(task, keys, values):
    """The answers of one sequence, found the slow way: scan the book for the query's key."""
    out = []
    for t in range(task.book_size + task.offset, task.seq_len):
        matches = [j for j in range(task.book_size) if keys[j] == keys[t]]
        assert len(matches) == 1, "exactly one book record holds the query's key"
        j = matches[0]
        out.append((j, values[j], t - task.offset, values[t - task.offset]))
    return out


@pytest.mark.parametrize("task", TASKS, ids=str)
def test_labels_match_an_independent_loop(task):
    batch = task.sample(64, generator=torch.Generator().manual_seed(0))
    S = task.num_queries - task.offset
    assert batch.keys.shape == batch.values.shape == (64, task.seq_len)
    assert batch.target.shape == batch.lookup_pos.shape == (64, S) and batch.offset_pos.shape == (S,)
    for b in range(64):
        keys, values = batch.keys[b].tolist(), batch.values[b].tolist()
        for i, (j, lookup, o, offset_value) in enumerate(answers_by_loop(task, keys, values)):
            assert batch.target[b, i].item() == lookup * task.num_values + offset_value
            assert batch.lookup_pos[b, i].item() == j
            assert batch.offset_pos[i].item() == o


@pytest.mark.parametrize("task", TASKS, ids=str)
def test_sequences_have_the_documented_structure(task):
    batch = task.sample(200, generator=torch.Generator().manual_seed(1))
    M = task.book_size
    for keys, values in zip(batch.keys.tolist(), batch.values.tolist(), strict=True):
        book, queries = keys[:M], keys[M:]
        assert len(set(book)) == M, "book keys are distinct"
        assert len(set(queries)) == len(queries) and set(queries) <= set(book), "queries: distinct book keys"
        assert all(0 <= k < task.num_keys for k in keys) and all(0 <= v < task.num_values for v in values)
    # the two answers never share a position: the lookup one is in the book, the offset one a query
    assert (batch.lookup_pos < M).all() and (batch.offset_pos >= M).all()


def test_the_two_parts_are_uniform_and_independent():
    task = TwoRelationTask()
    target = task.sample(20_000, generator=torch.Generator().manual_seed(2)).target.flatten()  # 100k answers
    lookup, offset_value = task.decode(target)
    joint = torch.zeros(8, 8)
    joint.index_put_((lookup, offset_value), torch.ones(len(target)), accumulate=True)
    joint /= len(target)
    assert (joint - 1 / 64).abs().max() < 0.003  # every (lookup, offset) pair about equally likely
    product = joint.sum(1, keepdim=True) * joint.sum(0, keepdim=True)
    assert (joint - product).abs().max() < 0.003  # knowing one part says nothing about the other


def test_sample_is_deterministic_and_leaves_the_global_rng_alone():
    task = TwoRelationTask()
    state = torch.random.get_rng_state()
    a = task.sample(8, generator=torch.Generator().manual_seed(5))
    b = task.sample(8, generator=torch.Generator().manual_seed(5))
    c = task.sample(8, generator=torch.Generator().manual_seed(6))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a.keys, c.keys)


def test_decode_inverts_the_class_encoding():
    task = TwoRelationTask(num_values=5, num_keys=5, book_size=5, num_queries=3)
    classes = torch.arange(task.num_classes)
    lookup, offset_value = task.decode(classes)
    assert lookup.tolist() == [c // 5 for c in range(25)] and offset_value.tolist() == [c % 5 for c in range(25)]


def test_accuracy_counts_exact_and_per_part_matches():
    task = TwoRelationTask()
    target = torch.tensor([[3 * 8 + 4, 0 * 8 + 7], [5 * 8 + 5, 2 * 8 + 1]])  # (B=2, S=2)
    pred = torch.tensor([[3 * 8 + 4, 1 * 8 + 7], [5 * 8 + 0, 6 * 8 + 2]])
    # position by position: both right | lookup wrong | offset wrong | both wrong
    assert task.accuracy(pred, target) == {"exact": 0.25, "lookup": 0.5, "offset": 0.5}
    logits = torch.nn.functional.one_hot(pred, task.num_classes).float() * 3.0 - 1.0  # argmax = pred
    assert task.accuracy(logits, target) == {"exact": 0.25, "lookup": 0.5, "offset": 0.5}
    assert task.accuracy(target, target) == {"exact": 1.0, "lookup": 1.0, "offset": 1.0}


def test_accuracy_rejects_a_shape_mismatch():
    task = TwoRelationTask()
    with pytest.raises(ValueError, match="pred has shape"):
        task.accuracy(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long))


def test_labels_name_the_records():
    task = TwoRelationTask()
    assert task.labels(torch.tensor([2, 0, 7]), torch.tensor([5, 2, 0])) == ["C5", "A2", "H0"]
    assert KEY_NAMES[:8] == "ABCDEFGH"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"book_size": 9}, "book_size=9 needs as many distinct keys"),
        ({"num_queries": 7}, "num_queries=7 > book_size=6"),
        ({"offset": 6}, "offset=6 must be < num_queries=6"),
        ({"num_values": 0}, "num_values must be a positive int"),
        ({"offset": 1.5}, "offset must be a positive int"),
        ({"num_keys": 30, "book_size": 6}, "num_keys=30 > 26"),
    ],
)
def test_bad_sizes_raise_a_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TwoRelationTask(**kwargs)
