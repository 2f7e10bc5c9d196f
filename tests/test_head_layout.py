"""mha_course.lessons.head_layout: the layout maps against closed-form index arithmetic, the kernel log
against what PyTorch documents, and the timer."""

import time

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

import mha_course as mc  # noqa: E402
from mha_course.kit import timing
from mha_course.lessons import head_layout

SHAPES = [(1, 1, 1), (4, 2, 2), (6, 2, 3), (5, 3, 4), (7, 4, 1), (3, 6, 2)]


@pytest.mark.parametrize("L, h, d_head", SHAPES)
def test_source_map_right_split_keeps_tokens_and_takes_column_blocks(L, h, d_head):
    token, feature = head_layout.source_map(L, h, d_head)
    for i in range(h):
        for p in range(L):
            assert token[i, p].tolist() == [p] * d_head
            assert feature[i, p].tolist() == list(range(i * d_head, (i + 1) * d_head))


@pytest.mark.parametrize("L, h, d_head", SHAPES)
def test_source_map_wrong_view_deals_out_memory_in_order(L, h, d_head):
    token, feature = head_layout.source_map(L, h, d_head, wrong=True)
    d_model = h * d_head
    for i in range(h):
        for p in range(L):
            flat = (i * L + p) * d_head  # the row starts at this element of the row-major (L, d_model) input
            assert token[i, p].tolist() == [flat // d_model] * d_head
            assert feature[i, p].tolist() == [flat % d_model + j for j in range(d_head)]


@pytest.mark.parametrize("L, h, d_head", SHAPES)
def test_head_of_element(L, h, d_head):
    right = head_layout.head_of_element(L, h, d_head)
    wrong = head_layout.head_of_element(L, h, d_head, wrong=True)
    d_model = h * d_head
    t = torch.arange(L).view(-1, 1).expand(L, d_model)
    f = torch.arange(d_model).view(1, -1).expand(L, d_model)
    assert torch.equal(right, f // d_head)
    assert torch.equal(wrong, (t * d_model + f) // (L * d_head))


def test_wrong_split_is_a_different_function_only_when_it_must_be():
    x = torch.randn(2, 6, 8)
    assert torch.equal(head_layout.wrong_split_heads(x, 4), x.view(2, 4, 6, 2))
    assert not torch.equal(head_layout.wrong_split_heads(x, 4), mc.split_heads(x, 4))
    # one head or one token: nothing to mix up, both agree
    assert torch.equal(head_layout.wrong_split_heads(x, 1), mc.split_heads(x, 1))
    x1 = torch.randn(2, 1, 8)
    assert torch.equal(head_layout.wrong_split_heads(x1, 4), mc.split_heads(x1, 4))
    with pytest.raises(ValueError, match="divisible"):
        head_layout.wrong_split_heads(x, 3)


def test_draw_layout_shows_both_maps():
    fig = head_layout.draw_layout(seq_len=4, num_heads=2, d_head=2)
    try:
        axes = [ax for ax in fig.axes if ax.get_images()]
        assert len(axes) == 4
        assert "L=4, h=2, d_head=2" in fig._suptitle.get_text()
        top_right, top_wrong = axes[0].get_images()[0].get_array(), axes[1].get_images()[0].get_array()  # row-major
        # right split: column blocks; wrong view: token bands
        assert top_right.tolist() == [[0, 0, 1, 1]] * 4
        assert top_wrong.tolist() == [[0, 0, 0, 0]] * 2 + [[1, 1, 1, 1]] * 2
        bottom_wrong = axes[3].get_images()[0].get_array()
        assert bottom_wrong.tolist() == [[0, 0, 2, 2], [0, 0, 2, 2], [1, 1, 3, 3], [1, 1, 3, 3]]
        assert "WRONG" in axes[1].get_title() and "right" in axes[0].get_title()
        assert all(ax.get_xlabel() and ax.get_ylabel() and ax.get_title() for ax in axes)
    finally:
        plt.close(fig)


def test_draw_layout_large_has_no_text_and_many_heads():
    fig = head_layout.draw_layout(seq_len=12, num_heads=12, d_head=4)
    try:
        assert all(not ax.texts for ax in fig.axes)
    finally:
        plt.close(fig)


def test_kernels_called_sees_the_implementation_pytorch_chose():
    q = k = v = torch.randn(1, 2, 8, 4)
    fused = head_layout.kernels_called(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
    explicit = head_layout.kernels_called(lambda: mc.scaled_dot_product_attention(q, k, v))
    assert len(fused) == 1 and "attention" in fused[0]
    assert explicit[0] == explicit[-1] == "bmm" and "softmax" in " ".join(explicit)  # _softmax or softmax.out
    assert "attention" not in " ".join(explicit)
    assert "add" in head_layout.kernels_called(lambda: q + k, keep=None)


def test_kernels_called_shows_nn_multihead_fast_path():
    m = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 3, 8)
    with torch.no_grad():
        fast = head_layout.kernels_called(lambda: m(x, x, x, need_weights=False))
    slow = head_layout.kernels_called(lambda: m(x, x, x, need_weights=True))  # grad enabled: no fast path
    assert fast == ["_native_multi_head_attention"]
    assert "_native_multi_head_attention" not in slow and "_softmax" in slow


def test_median_times_is_a_median_of_round_robin_calls():
    calls = []
    durations = iter([0.0, 0.03, 0.001, 0.001])  # warm-up, then three timed calls

    def slow():
        calls.append("slow")
        time.sleep(next(durations))

    def fast():
        calls.append("fast")

    times = timing.median_times({"slow": slow, "fast": fast}, repeats=3, warmup=1)
    assert calls == ["slow", "fast"] * 4  # one warm-up round, then three timed rounds, interleaved
    assert 0.0009 < times["slow"] < 0.02  # median of (0.03, 0.001, 0.001) ignores the outlier
    assert times["fast"] < times["slow"]
    with pytest.raises(ValueError):
        timing.median_times({"f": fast}, repeats=0)


def test_median_times_sets_and_restores_threads():
    before = torch.get_num_threads()
    seen = []
    timing.median_times({"f": lambda: seen.append(torch.get_num_threads())}, repeats=2, num_threads=1)
    assert seen == [1, 1, 1] and torch.get_num_threads() == before

    def boom():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        timing.median_times({"f": boom}, num_threads=1)
    assert torch.get_num_threads() == before


def test_cpu_caches_reads_sys_or_says_unknown():
    from mha_course.lessons.head_layout import cpu_caches

    line = cpu_caches()
    assert line == "unknown" or line.startswith("L1")
    assert "Instruction" not in line


@torch.no_grad()
def test_kernels_inside_sees_what_the_fast_path_runs():
    from mha_course.lessons import head_layout as hl

    m = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    assert hl.kernels_called(lambda: m(x, x, x, need_weights=False)) == ["_native_multi_head_attention"]
    assert hl.kernels_inside(lambda: m(x, x, x, need_weights=False)) == [
        "_native_multi_head_attention",
        "bmm",
        "_softmax",
        "bmm",
    ]
    y = x.clone()
    assert hl.kernels_inside(lambda: m(x, y, y, need_weights=False)) == ["_scaled_dot_product_flash_attention_for_cpu"]


@torch.no_grad()
def test_float64_reference_and_dtype_errors_stay_under_the_bounds():
    from mha_course.lessons import head_layout as hl

    torch.manual_seed(0)
    m = mc.MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 9, 32)
    reference = hl.reference_attention_float64(m, x)
    theirs = m.to_torch().double()(x.double(), x.double(), x.double(), need_weights=False)[0]
    torch.testing.assert_close(reference, theirs, atol=1e-12, rtol=1e-12)  # an independent float64 check
    errors = hl.dtype_errors(m, x)
    assert list(errors) == list(hl.DTYPE_BOUNDS)
    for dtype, by_impl in errors.items():
        assert by_impl["course"] < hl.DTYPE_BOUNDS[dtype] and by_impl["torch"] < hl.DTYPE_BOUNDS[dtype], dtype
    assert errors[torch.bfloat16]["course"] > errors[torch.float32]["course"] > errors[torch.float64]["course"]
    assert m.q_proj.weight.dtype == torch.float32  # the module is left in its own dtype
