"""Notebook 00's demonstration checker: correct variants pass, each listed slip is named."""

import pytest
import torch

from mha_course.check.demo import NORMALIZE_ROWS_MISTAKES, normalize_rows


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x / x.sum(dim=-1, keepdim=True),
        lambda x: x / x.sum(1)[:, None],
        lambda x: torch.stack([row / row.sum() for row in x]),
        lambda x: torch.nn.functional.normalize(x, p=1, dim=-1),
    ],
)
def test_correct_variants_pass(fn):
    assert normalize_rows(fn).passed


def test_each_mistake_is_diagnosed_by_name():
    for mistake in NORMALIZE_ROWS_MISTAKES:
        result = normalize_rows(mistake.fn)
        assert not result.passed and mistake.diagnosis in result.message, mistake.name


def test_not_attempted_and_wrong_type():
    def todo(x):
        raise NotImplementedError

    assert normalize_rows(todo).status == "not attempted"
    assert not normalize_rows(lambda x: x.tolist()).passed
