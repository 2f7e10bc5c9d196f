"""mha_course.lessons.head_budget and its checker, against PyTorch's own FLOP counter and real modules' numel()."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

import mha_course as mc  # noqa: E402
from mha_course.check.head_budget import attention_flops_split  # noqa: E402
from mha_course.lessons import head_budget


def _torch_counted(module, x, **kwargs):
    """(linear-layer FLOPs, batched-matmul FLOPs) as torch.utils.flop_counter counts them."""
    with FlopCounterMode(display=False) as counter:
        module(x, **kwargs)
    counts = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    linear = counts.get("aten.addmm", 0) + counts.get("aten.mm", 0)
    return linear, counts.get("aten.bmm", 0)


@pytest.mark.parametrize("B, L, d, h", [(1, 5, 16, 1), (2, 7, 24, 3), (3, 33, 64, 8), (1, 40, 12, 12)])
def test_flops_split_matches_torch_flop_counter_for_mha(B, L, d, h):
    x = torch.randn(B, L, d)
    expected = _torch_counted(mc.MultiHeadAttention(d, h), x)
    assert head_budget.flops_split(B, L, d, h) == expected
    assert expected == (8 * B * L * d * d, 4 * B * L * L * d)  # the closed forms, whatever h is


@pytest.mark.parametrize("d, h, h_kv, hd", [(64, 8, 2, None), (48, 4, 1, None), (40, 4, 2, 16)])
def test_flops_split_matches_torch_flop_counter_for_gqa(d, h, h_kv, hd):
    B, L = 2, 11
    with torch.device("meta"):  # shapes only: the counter needs no real numbers
        m = mc.GroupedQueryAttention(d, h, h_kv, head_dim=hd)
        x = torch.randn(B, L, d)
    assert head_budget.flops_split(B, L, d, h, h_kv, head_dim=hd) == _torch_counted(m, x)


def test_flops_split_adds_up_to_attention_flops():
    for args in [(1, 9, 32, 4), (2, 100, 96, 12)]:
        assert sum(head_budget.flops_split(*args)) == mc.attention_flops(*args)


def test_crossover_is_where_the_two_parts_are_equal():
    assert head_budget.crossover_seq_len(512, 8) == 1024 == head_budget.crossover_seq_len(512, 1)
    for d, h, h_kv in [(64, 8, 8), (64, 8, 2), (96, 4, 1)]:
        L = head_budget.crossover_seq_len(d, h, h_kv)
        assert L == int(L)
        proj, scores = head_budget.flops_split(1, int(L), d, h, h_kv)
        assert proj == scores
        proj, scores = head_budget.flops_split(1, int(L) + 1, d, h, h_kv)
        assert scores > proj


def test_meta_modules_have_the_published_shapes_and_no_storage():
    for cfg in mc.MODEL_CONFIGS.values():
        m = head_budget.meta_attention_module(cfg)
        params = list(m.parameters())
        assert all(p.is_meta for p in params)
        # an independent count from the layer shapes: q and o are h·hd wide, k and v h_kv·hd
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        weights = 2 * cfg.d_model * q + 2 * cfg.d_model * kv
        biases = {True: q + 2 * kv + cfg.d_model, False: 0, "qkv": q + 2 * kv}[cfg.attention_bias]
        assert head_budget.numel(m) == weights + biases, cfg.name


def test_qwen_meta_module_has_qkv_bias_but_no_output_bias():
    m = head_budget.meta_attention_module(mc.MODEL_CONFIGS["Qwen2.5-7B"])
    assert m.q_proj.bias is not None and m.k_proj.bias is not None and m.v_proj.bias is not None
    assert m.o_proj.bias is None
    assert isinstance(head_budget.meta_attention_module(mc.MODEL_CONFIGS["BERT base"]), nn.MultiheadAttention)


def test_model_rows_agree_with_numel_and_carry_sources():
    rows = head_budget.model_rows()
    assert [r["model"] for r in rows] == list(mc.MODEL_CONFIGS)
    assert all(r["numel_ok"] and r["numel (meta)"] == r["params/layer"] for r in rows)
    base = rows[0]
    assert base["model"] == "Transformer base" and base["attn modules"] == 18
    assert base["params/layer"] == 4 * 512 * 512 + 4 * 512
    assert base["params total"] == 18 * base["params/layer"]
    gemma = next(r for r in rows if r["model"] == "Gemma 2 9B")
    assert gemma["h·d_head"] == 4096 != gemma["d_model"]
    assert all("20" in r["source"] for r in rows)  # every source names its year


def test_format_table_aligns_columns():
    rows = [{"name": "a", "n": 1234567, "ok": True}, {"name": "long name", "n": 5, "ok": False}]
    lines = head_budget.format_table(rows, ["name", "n", "ok"]).splitlines()
    assert lines[0].split() == ["name", "n", "ok"]
    assert lines[2] == "a          1,234,567  ✓"
    assert lines[3] == "long name          5  ✗"


def test_head_dim_note_reads_the_trade_off():
    assert "One wide head" in head_budget.head_dim_note(512, 1)
    assert "rank ≤ 8" in head_budget.head_dim_note(8, 64)
    assert "64–128" in head_budget.head_dim_note(64, 8) and "64–128" in head_budget.head_dim_note(128, 4)
    assert "Few wide heads" in head_budget.head_dim_note(256, 2)


def test_draw_head_budget_shows_the_chosen_head_count():
    fig = head_budget.draw_head_budget(d_model=512, num_heads=16, seq_len=256)
    ax1, ax2 = fig.axes
    title = fig._suptitle.get_text()
    assert "h = 16 → d_head = 32" in title and "1,050,624 parameters" in title
    assert f"{mc.attention_flops(1, 256, 512, 16) / 1e9:.2f} GFLOPs" in title
    labels = [t.get_text() for t in ax1.get_xticklabels()]
    heights = [p.get_height() for p in ax1.patches]
    assert labels == ["1", "2", "4", "8", "16", "32", "64", "128"]
    assert heights == [4 * 512 * (512 // int(h)) for h in labels]
    red = [
        lab
        for lab, p in zip(labels, ax1.patches, strict=True)
        if p.get_facecolor()[:3] == matplotlib.colors.to_rgb("tab:red")
    ]
    assert red == ["16"]
    assert list(ax2.lines[0].get_ydata()) == [512 // int(h) for h in labels]
    fig.canvas.draw()
    legend = ax1.get_legend().get_window_extent()
    assert not any(legend.overlaps(p.get_window_extent()) for p in ax1.patches)  # the legend hides no bar
    plt.close(fig)
    with pytest.raises(ValueError, match="not divisible"):
        head_budget.draw_head_budget(d_model=512, num_heads=7)


def test_draw_flops_vs_length_plots_the_formulas():
    fig = head_budget.draw_flops_vs_length(d_model=64, batch=2)
    ax = fig.axes[0]
    proj, scores, total = ax.lines[:3]
    for L, p, s, t in zip(proj.get_xdata(), proj.get_ydata(), scores.get_ydata(), total.get_ydata(), strict=True):
        assert (p, s) == (8 * 2 * L * 64**2, 4 * 2 * L * L * 64) and t == p + s
    assert list(ax.lines[3].get_xdata()) == [128, 128]  # the crossover line at L = 2·d
    assert "d_model = 64" in ax.get_title()
    plt.close(fig)


def _reference(batch, seq_len, d_model, num_heads):
    return 8 * batch * seq_len * d_model**2, 4 * batch * seq_len**2 * d_model


def test_checker_accepts_a_correct_solution():
    assert attention_flops_split(_reference).passed
    per_head = lambda b, n, d, h: (  # noqa: E731 - a loop over heads is fine too
        sum(2 * b * n * d * (d // h) * 4 for _ in range(h)),
        sum(2 * 2 * b * n * n * (d // h) for _ in range(h)),
    )
    assert attention_flops_split(per_head).passed


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda b, n, d, h: _reference(b, n, d, h)[::-1], "swapped"),
        (lambda b, n, d, h: (4 * b * n * d * d, 2 * b * n * n * d), "multiply-adds"),
        (lambda b, n, d, h: (6 * b * n * d * d, 4 * b * n * n * d), "output projection"),
        (lambda b, n, d, h: (8 * b * n * d * d, 2 * b * n * n * d), "weights @ V"),
        (lambda b, n, d, h: (8 * b * n * d * d, 4 * b * n * n * d * h), "d_head = d/h"),
        (lambda b, n, d, h: (8 * b * n * d * d * h, 4 * b * n * n * d), "do not depend on h"),
        (lambda b, n, d, h: (8 * b * n * d * d, 4 * b * n * n * (d // h)), "one head"),
        (lambda b, n, d, h: (8 * b * n * d * d, 4 * b * n * d), "L²"),
        (lambda b, n, d, h: (8 * n * d * d, 4 * n * n * d), "batch"),
    ],
)
def test_checker_names_the_mistake(wrong, words):
    result = attention_flops_split(wrong)
    assert not result.passed and "likely mistake" in result.message and words in result.message


def test_checker_reports_floats_and_not_attempted():
    result = attention_flops_split(lambda b, n, d, h: tuple(float(x) for x in _reference(b, n, d, h)))
    assert not result.passed and "return an int" in result.message

    def todo(b, n, d, h):
        raise NotImplementedError

    assert attention_flops_split(todo).status == "not attempted"
