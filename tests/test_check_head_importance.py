"""Exercise 7.2's checker: three correct approaches pass, each listed mistake is diagnosed by
name, and the known heads of its cases have the importance they were built to have."""

import pytest
import torch

import mha_course as mc
from mha_course.check import head_importance as hi


def backward_on_the_sum(loss_fn, batch_size, num_heads):
    gates = torch.ones(batch_size, num_heads, requires_grad=True)
    loss_fn(gates).sum().backward()
    return gates.grad.abs().mean(dim=0)


def one_sequence_at_a_time(loss_fn, batch_size, num_heads):
    rows = []
    for b in range(batch_size):
        gates = torch.ones(batch_size, num_heads, requires_grad=True)
        (grad,) = torch.autograd.grad(loss_fn(gates)[b], gates)
        rows.append(grad[b].abs())
    return torch.stack(rows).mean(dim=0)


def jacobian(loss_fn, batch_size, num_heads):
    jac = torch.func.jacrev(loss_fn)(torch.ones(batch_size, num_heads))  # (B, B, h)
    return jac.diagonal(dim1=0, dim2=1).T.abs().mean(dim=0)


@pytest.mark.parametrize("fn", [backward_on_the_sum, one_sequence_at_a_time, jacobian])
def test_correct_variants_pass(fn):
    result = mc.check.gradient_importance(fn)
    assert result.passed, result


@pytest.mark.parametrize("mistake", hi.GRADIENT_IMPORTANCE_MISTAKES, ids=lambda m: m.name)
def test_each_mistake_is_diagnosed(mistake):
    result = mc.check.gradient_importance(mistake.fn)
    assert result.status == "failed"
    assert mistake.diagnosis in result.message, result


def test_not_attempted():
    def todo(loss_fn, batch_size, num_heads):
        raise NotImplementedError

    assert mc.check.gradient_importance(todo).status == "not attempted"


def test_cases_have_the_known_important_heads():
    """Independent of the reference: finite differences on each sequence's own gate."""
    for case in hi._cases():
        loss_fn, B, h = case.args
        eps = 1e-6
        importance = torch.zeros(h, dtype=torch.float64)
        for b in range(B):
            for i in range(h):
                up, down = torch.ones(B, h, dtype=torch.float64), torch.ones(B, h, dtype=torch.float64)
                up[b, i] += eps
                down[b, i] -= eps
                with torch.no_grad():
                    slope = (loss_fn(up)[b] - loss_fn(down)[b]) / (2 * eps)
                importance[i] += slope.abs() / B
        torch.testing.assert_close(importance, hi._reference(*case.args), atol=1e-6, rtol=1e-5)
        for i in loss_fn.silent:
            assert importance[i] == 0.0
        assert importance.max() > 0.01


def test_loss_fn_names_a_wrong_gate_shape():
    loss_fn, B, h = hi._cases()[0].args
    with pytest.raises(ValueError, match=r"gates of shape \(B, h\) = \(6, 3\), got \(3,\)"):
        loss_fn(torch.ones(h))


def test_the_packages_score_equals_the_checkers_reference():
    """head_ablation.gate_gradient_importance (what notebook 07 uses after the exercise) = the reference."""
    from mha_course.lessons import head_ablation

    for case in hi._cases():
        torch.testing.assert_close(head_ablation.gate_gradient_importance(*case.args), hi._reference(*case.args))
    assert mc.check.gradient_importance(head_ablation.gate_gradient_importance).passed
