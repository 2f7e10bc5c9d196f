"""Notebook 07's head ablation, attention mass, pruning, figures and the ablate_heads checker."""

import matplotlib
import pytest
import torch
import torch.nn.functional as F

import mha_course as mc
from mha_course.check import specialize
from mha_course.lessons import head_ablation

matplotlib.use("Agg")


def heads_by_hand(attn, x):
    """Each head's output (B, h, L, d_head), computed head by head with torch's SDPA."""
    d, h = attn.d_head, attn.num_heads
    outs = []
    for i in range(h):
        rows = slice(i * d, (i + 1) * d)  # head i's rows of each nn.Linear weight
        q, k, v = (F.linear(x, p.weight[rows], p.bias[rows]) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        outs.append(F.scaled_dot_product_attention(q, k, v))
    return torch.stack(outs, dim=1)


def without(attn, x, removed):
    """Layer output with the heads in ``removed`` left out of the sum over heads (independent reference)."""
    heads = heads_by_hand(attn, x)
    d = attn.d_head
    out = attn.out_proj.bias.expand(*x.shape[:2], -1).clone()
    for i in range(attn.num_heads):
        if i not in removed:
            out += heads[:, i] @ attn.out_proj.weight[:, i * d : (i + 1) * d].T
    return out


@pytest.fixture
def attn_and_x():
    torch.manual_seed(0)
    return mc.MultiHeadAttention(12, 3).eval(), torch.randn(2, 5, 12)


def test_column_mask_zeroes_each_removed_heads_block():
    mask = head_ablation.column_mask(3, 2, [0, 2])
    assert mask.tolist() == [0, 0, 1, 1, 0, 0]
    assert head_ablation.column_mask(2, 3, []).tolist() == [1.0] * 6
    with pytest.raises(ValueError, match="head 3 does not exist"):
        head_ablation.column_mask(3, 2, [3])


@pytest.mark.parametrize("removed", [[], [0], [1], [2], [0, 2], [0, 1, 2]])
def test_ablated_equals_leaving_the_heads_out_of_the_sum(attn_and_x, removed):
    attn, x = attn_and_x
    with torch.no_grad(), head_ablation.ablated(attn, removed):
        got, _ = attn(x)
        got_fast, _ = attn(x, need_weights=False)
    with torch.no_grad():
        expected = without(attn, x, removed)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_fast, expected)


def test_ablated_removes_its_hook_on_exit_even_after_an_error(attn_and_x):
    attn, x = attn_and_x
    with torch.no_grad():
        full, _ = attn(x)
        with pytest.raises(RuntimeError), head_ablation.ablated(attn, [1]):
            raise RuntimeError("boom")
        after, _ = attn(x)
    assert torch.equal(full, after)
    assert not attn.out_proj._forward_pre_hooks


def test_attention_mass_on_known_weights():
    B, h, L = 2, 3, 5
    query_pos = torch.tensor([3, 4])
    target = torch.tensor([[0, 1], [2, 0]])  # (B, S)
    w = torch.full((B, h, L, L), 1 / L)  # head 1, 2: uniform
    w[:, 0] = 0
    for b in range(B):
        for s, t in enumerate(query_pos.tolist()):
            w[b, 0, t, target[b, s]] = 1.0  # head 0: always on the target
    w[:, 2, 3] = 0
    w[:, 2, 3, 4] = 1.0  # head 2, query 3: all on position 4 (not the target)
    mass = head_ablation.attention_mass(w, target, query_pos)
    torch.testing.assert_close(mass, torch.tensor([1.0, 1 / L, 0.5 / L]))
    same_for_all = head_ablation.attention_mass(w, torch.tensor([0, 0]), query_pos)  # (S,) target broadcast
    assert same_for_all.shape == (3,)


def test_head_importance_and_pruning_curve_use_the_ablated_outputs(attn_and_x):
    attn, x = attn_and_x

    def score():
        with torch.no_grad():
            return attn(x)[0].square().sum().item()

    with torch.no_grad():
        full = without(attn, x, []).square().sum().item()
        alone = [full - without(attn, x, [i]).square().sum().item() for i in range(3)]
        curve = [without(attn, x, [2, 0][:k]).square().sum().item() for k in range(3)]
    assert head_ablation.head_importance(attn, score) == pytest.approx(alone, rel=1e-4)
    assert head_ablation.pruning_curve(attn, score, [2, 0]) == pytest.approx(curve, rel=1e-4)
    assert not attn.out_proj._forward_pre_hooks


def test_draw_ablation_shows_the_accuracies_of_the_removed_heads():
    calls = []

    def accuracy(removed):
        calls.append(removed)
        return {"exact": 0.25, "lookup": 0.5, "offset": 1.0 - 0.1 * len(removed)}

    fig = head_ablation.draw_ablation(accuracy, 4, removed=(2, 0))
    ax = fig.axes[0]
    assert calls == [[0, 2]]
    assert [p.get_height() for p in ax.patches] == pytest.approx([0.25, 0.5, 0.8])
    assert ax.get_title() == "Accuracy with heads removed: [0, 2]; kept: [1, 3]"
    assert head_ablation.draw_ablation(accuracy, 4).axes[0].get_title() == "Accuracy with all heads"
    matplotlib.pyplot.close("all")


def test_draw_head_maps_one_panel_per_head_with_the_targets_outlined():
    h, L = 2, 6
    weights = torch.softmax(torch.randn(h, L, L, generator=torch.Generator().manual_seed(0)), dim=-1)
    rows, lookup_pos, offset_pos = torch.tensor([4, 5]), torch.tensor([0, 2]), torch.tensor([3, 4])
    fig = head_ablation.draw_head_maps(weights, list("ABCDEF"), rows, lookup_pos, offset_pos, title="maps")
    panels = [ax for ax in fig.axes if ax.get_title().startswith("head")]
    assert len(panels) == h
    for i, ax in enumerate(panels):
        on_lookup = (weights[i, 4, 0] + weights[i, 5, 2]).item() / 2
        assert ax.get_title().startswith(f"head {i}: on lookup {on_lookup:.2f}")
        image = ax.images[0].get_array()
        assert image.shape == (2, L) and abs(image[1, 3] - weights[i, 5, 3].item()) < 1e-6
        outlines = {(p.get_x() + 0.5, p.get_y() + 0.5, p.get_edgecolor()[:3]) for p in ax.patches}
        red, orange = matplotlib.colors.to_rgb("red"), matplotlib.colors.to_rgb("orange")
        assert outlines == {(0, 0, red), (2, 1, red), (3, 0, orange), (4, 1, orange)}
    matplotlib.pyplot.close("all")


# --- the exercise checker ---------------------------------------------------------------------------


def solution(head_outputs, w_o, b_o, heads):
    kept = head_outputs.clone()
    kept[:, heads] = 0.0
    return mc.merge_heads(kept) @ w_o.T + b_o


def loop_solution(head_outputs, w_o, b_o, heads):
    B, h, L, d = head_outputs.shape
    out = b_o.expand(B, L, -1).clone()
    for i in range(h):
        if i not in heads:
            out = out + head_outputs[:, i] @ w_o[:, i * d : (i + 1) * d].T
    return out


@pytest.mark.parametrize("fn", [solution, loop_solution])
def test_checker_accepts_correct_implementations(fn):
    result = mc.check.ablate_heads(fn)
    assert result.passed, result.message


def test_checker_reference_agrees_with_ablating_a_real_layer(attn_and_x):
    attn, x = attn_and_x
    with torch.no_grad():
        heads = heads_by_hand(attn, x)
        got = specialize._reference(heads, attn.out_proj.weight, attn.out_proj.bias, [1])
        torch.testing.assert_close(got, without(attn, x, [1]))


@pytest.mark.parametrize(
    "how, words",
    [
        ("inverted", "`heads` lists the heads to remove"),
        ("no bias", "the bias b_o is missing"),
        ("rescaled", "you rescaled the kept heads"),
        ("no transpose", "reshape without transpose"),
        ("interleaved", "interleaved feature by feature"),
        ("strided", "every h-th column"),
        ("after W_O", "zeroed output features after W_O"),
        ("no .T", "concat @ w_o.T"),
    ],
)
def test_checker_names_each_known_mistake(how, words):
    result = mc.check.ablate_heads(lambda *a: specialize._variant(*a, how=how))
    assert not result.passed
    assert "likely mistake" in result.message and words in result.message, result.message


def test_checker_reports_not_attempted():
    def todo(head_outputs, w_o, b_o, heads):
        raise NotImplementedError("Exercise")

    result = mc.check.ablate_heads(todo)
    assert result.status == "not attempted"


def test_checker_reports_bad_functions_instead_of_raising_and_is_deterministic():
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    for wrong, words in [
        (lambda *a: None, "should be a torch.Tensor"),
        (lambda *a: torch.zeros(1, 2, 3, 4, 5), "has shape"),
        (lambda: 0, "raised TypeError"),
        (None, "expected your function"),
    ]:
        result = mc.check.ablate_heads(wrong)
        assert not result.passed and words in result.message, result.message
    assert torch.equal(before, torch.random.get_rng_state())
    assert repr(mc.check.ablate_heads(solution)) == repr(mc.check.ablate_heads(solution))
