"""The address book of notebook 01, its explorer figure and its query-design checker."""

import math

import matplotlib
import pytest
import torch
import torch.nn.functional as F

import mha_course as mc
from mha_course.lessons import address_book

matplotlib.use("Agg")


def softmax_ref(xs):
    """Softmax of a list of floats with math.exp (independent of torch)."""
    e = [math.exp(x) for x in xs]
    return [v / sum(e) for v in e]


def test_address_book_layout():
    keys, values = address_book.address_book()
    assert keys.shape == (3, len(address_book.KEY_FEATURES)) and values.shape == (3, len(address_book.VALUE_NAMES))
    zs, ls, addr, phone = range(4)
    # each record's key names its person and its attribute, and nothing else
    for rec, (person, attr) in enumerate([(zs, addr), (zs, phone), (ls, addr)]):
        expected = torch.zeros(4)
        expected[[person, attr]] = 1.0
        assert torch.equal(keys[rec], expected), address_book.RECORDS[rec]
    assert torch.equal(values, torch.eye(3))
    keys[0, 0] = 99.0  # a learner mutating the tensors does not change the book
    assert address_book.address_book()[0][0, 0] == 1.0


def test_combined_query_reproduces_the_source_weights():
    steps = address_book.lookup(address_book.query(zhang_san=3, address=1, phone=1))
    assert steps.scores.tolist() == [4.0, 4.0, 1.0]
    assert steps.scaled.tolist() == [2.0, 2.0, 0.5]
    expected = softmax_ref([2.0, 2.0, 0.5])
    assert [f"{w:.3f}" for w in steps.weights.tolist()] == ["0.450", "0.450", "0.100"]
    torch.testing.assert_close(steps.weights, torch.tensor(expected))
    torch.testing.assert_close(steps.output, torch.tensor(expected))  # one-hot values: output = weights


def test_unscaled_lookup_uses_raw_scores():
    steps = address_book.lookup(address_book.query(zhang_san=3, address=1, phone=1), scaled=False)
    torch.testing.assert_close(steps.weights, torch.tensor(softmax_ref([4.0, 4.0, 1.0])))


@pytest.mark.parametrize("scaled", [True, False])
def test_lookup_matches_torch_sdpa_on_random_queries(scaled):
    g = torch.Generator().manual_seed(0)
    q = 3 * torch.randn(5, 7, 4, generator=g)
    keys, values = address_book.address_book()
    expected = F.scaled_dot_product_attention(
        q, keys.expand(5, 3, 4), values.expand(5, 3, 3), scale=None if scaled else 1.0
    )
    torch.testing.assert_close(address_book.lookup(q, scaled=scaled).output, expected)


def test_masked_lookup_matches_torch_and_handles_a_fully_masked_query():
    keys, values = address_book.address_book()
    only_zhang_san = torch.tensor([True, True, False])
    q = address_book.query(address=6)
    steps = address_book.lookup(q, mask=only_zhang_san)
    expected = F.scaled_dot_product_attention(q[None], keys, values, attn_mask=only_zhang_san[None])[0]
    torch.testing.assert_close(steps.output, expected)
    torch.testing.assert_close(steps.weights, torch.tensor([*softmax_ref([3.0, 0.0]), 0.0]))
    nothing = address_book.lookup(q, mask=torch.zeros(3, dtype=torch.bool))
    assert torch.equal(nothing.weights, torch.zeros(3)) and torch.equal(nothing.output, torch.zeros(3))


def test_table_prints_labels_and_values():
    text = address_book.table(torch.tensor([[0.45, 0.45, 0.1]]), ["weights"], address_book.RECORDS)
    header, row = text.splitlines()
    assert all(r in header for r in address_book.RECORDS)
    assert row.split()[1:] == ["0.450", "0.450", "0.100"]


def test_draw_lookup_shows_the_query_weights_and_output():
    fig = address_book.draw_lookup(zhang_san=3, li_si=0, address=1, phone=1)
    try:
        ax_q, ax_w, ax_out = fig.axes
        assert "q = [3, 0, 1, 1]" in fig._suptitle.get_text()
        assert [p.get_height() for p in ax_q.patches] == [3.0, 0.0, 1.0, 1.0]
        heights = [p.get_height() for p in ax_w.patches]
        assert heights == pytest.approx(softmax_ref([2.0, 2.0, 0.5]), abs=1e-6)
        assert [t.get_text() for t in ax_w.get_xticklabels()] == list(address_book.RECORDS)
        assert [t.get_text() for t in ax_out.get_xticklabels()] == list(address_book.VALUE_NAMES)
        assert [p.get_height() for p in ax_out.patches] == pytest.approx(heights, abs=1e-6)
    finally:
        matplotlib.pyplot.close(fig)


def test_draw_lookup_without_scaling_is_sharper():
    fig = address_book.draw_lookup(zhang_san=6, address=6, phone=0, scaled=False)
    try:
        heights = [p.get_height() for p in fig.axes[1].patches]
        assert heights == pytest.approx(softmax_ref([12.0, 6.0, 6.0]), abs=1e-6)
        assert "unscaled" in fig._suptitle.get_text()
    finally:
        matplotlib.pyplot.close(fig)


def test_draw_bars_groups_one_bar_per_series_and_keeps_the_legend_off_the_bars():
    series = {"combined": [0.45, 0.45, 0.1], "address": [0.909, 0.045, 0.045], "phone": [0.047, 0.95, 0.002]}
    fig = address_book.draw_bars(series, address_book.VALUE_NAMES, title="t", xlabel="answer slot", ylabel="amount")
    try:
        (ax,) = fig.axes
        heights = [p.get_height() for p in ax.patches]
        assert heights == pytest.approx([v for values in series.values() for v in values])
        centres = [p.get_x() + p.get_width() / 2 for p in ax.patches]
        assert centres[3:6] == pytest.approx([0, 1, 2])  # the middle series is centred on its label
        assert [t.get_text() for t in ax.get_xticklabels()] == list(address_book.VALUE_NAMES)
        assert [t.get_text() for t in ax.get_legend().get_texts()] == list(series)
        assert {t.get_text() for t in ax.texts} >= {"0.450", "0.950"}  # values written on the bars
        fig.canvas.draw()
        legend, axes_box = ax.get_legend().get_window_extent(), ax.get_window_extent()
        assert legend.x0 > axes_box.x1  # outside the axes: it cannot cover a bar or a label
        assert max(heights) < ax.get_ylim()[1]
    finally:
        matplotlib.pyplot.close(fig)


# --- the checker mc.check.address_book_query -------------------------------------------------

FEATURE = {"Zhang San": 0, "Li Si": 1, "address": 2, "phone": 3}


def make_query(magnitude):
    def fn(person, attribute):
        q = torch.zeros(4)
        q[FEATURE[person]] = magnitude
        q[FEATURE[attribute]] = magnitude
        return q

    return fn


def test_check_accepts_correct_queries_of_any_form_within_the_limit():
    def signed(person, attribute):  # also says what it does NOT want
        q = -6 * torch.ones(4)
        q[FEATURE[person]] = 6
        q[FEATURE[attribute]] = 6
        return q

    assert mc.check.address_book_query(signed).passed

    def against_rivals(person, attribute):  # negative only on the features of the two rival records
        q = torch.zeros(4)
        q[FEATURE[person]] = q[FEATURE[attribute]] = 6.0
        q[1 - FEATURE[person]] = -6.0  # the other person
        q[5 - FEATURE[attribute]] = -5.0  # the other attribute
        return q

    result = mc.check.address_book_query(against_rivals)
    assert result.passed, result


def test_check_rejects_a_louder_query_beyond_the_limit():
    # [12, 0, 12, 0] finds its record with weight 0.995, but only by being louder than section 3's
    result = mc.check.address_book_query(make_query(12.0))
    assert not result.passed and "entry of size 12" in result.message and "between -6 and 6" in result.message


def test_check_diagnoses_a_timid_query():
    result = mc.check.address_book_query(make_query(6.0))  # weight 0.909 on the right record
    assert not result.passed and "more decisive" in result.message and "0.909" in result.message


def test_draw_steps_shows_the_four_steps_as_labelled_bars():
    steps = address_book.lookup(address_book.query(zhang_san=6, address=6))
    fig = address_book.draw_steps(steps, title="t")
    try:
        assert [ax.get_title() for ax in fig.axes][2] == "3. softmax weights"
        heights = [p.get_height() for p in fig.axes[2].patches]
        assert heights == pytest.approx(softmax_ref([6.0, 3.0, 3.0]), abs=1e-6)
        assert all(ax.get_ylim()[0] == 0 for ax in fig.axes)
    finally:
        matplotlib.pyplot.close(fig)


def test_check_diagnoses_swapped_features_and_missing_person():
    def swapped(person, attribute):
        q = torch.zeros(4)
        q[1 - FEATURE[person]] = 6  # Zhang San <-> Li Si
        q[FEATURE[attribute]] = 6
        return q

    result = mc.check.address_book_query(swapped)
    assert not result.passed and "instead of 'Zhang San · address'" in result.message

    def attribute_only(person, attribute):
        q = torch.zeros(4)
        q[FEATURE[attribute]] = 6
        return q

    result = mc.check.address_book_query(attribute_only)
    assert not result.passed and "cannot tell" in result.message


def test_check_reports_not_attempted_wrong_type_and_errors_without_raising():
    def todo(person, attribute):
        raise NotImplementedError

    assert mc.check.address_book_query(todo).status == "not attempted"
    result = mc.check.address_book_query(lambda p, a: [6.0, 0.0, 6.0, 0.0])
    assert not result.passed and "torch.Tensor" in result.message
    result = mc.check.address_book_query(lambda p, a: torch.zeros(3))
    assert not result.passed and "shape (3,)" in result.message
    result = mc.check.address_book_query(lambda p, a: torch.tensor([6, 0, 6, 0]))
    assert not result.passed and "floating-point" in result.message
    result = mc.check.address_book_query(lambda p, a: FEATURE["nobody"])
    assert not result.passed and "KeyError" in result.message
