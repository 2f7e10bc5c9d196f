"""Notebook 11's helpers: the experiments say what the schemes are known to do, the decoding bugs
break what they should, the hub path is called as documented (recorded, never downloaded), and
the explorer's figure is drawn as described."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import mha_course as mc  # noqa: E402
from mha_course.lessons import positions_lab as lab  # noqa: E402

transformers = pytest.importorskip("transformers")
A, B = "the dog bit the man".split(), "the man bit the dog".split()


@pytest.mark.parametrize(
    "scheme, shift_invariant, tells_order",
    [
        ("none", True, False),
        ("learned", False, True),
        ("sinusoidal", False, True),
        ("ALiBi", True, True),
        ("RoPE", True, True),
    ],
)
def test_shift_and_order_experiments(scheme, shift_invariant, tells_order):
    head = lab.OneHead(scheme)
    changes = [lab.shift_change(head, A, k) for k in (1, 7, 40)]
    assert (max(changes) < 1e-6) == shift_invariant
    assert (lab.order_change(head, A, B, "dog") > 1e-3) == tells_order


def test_alibi_without_its_causal_mask_cannot_tell_a_sentence_from_its_reversal():
    """The symmetric -m·|i - j| keeps every distance under reversal; the causal ALiBi of Press et al.
    (and RoPE, whose q·k depends on the signed offset) tell the mirror image apart."""
    assert lab.reversal_change(lab.OneHead("ALiBi", causal=False), A) < 1e-12
    assert lab.reversal_change(lab.OneHead("ALiBi"), A) > 0.1 and lab.OneHead("ALiBi").causal
    assert lab.reversal_change(lab.OneHead("RoPE"), A) > 0.1
    assert lab.reversal_change(lab.OneHead("none"), A) < 1e-12
    # a causal mask alone already tells order (no position scheme at all: "NoPE")
    assert lab.order_change(lab.OneHead("none", causal=True), A, B, "dog") > 0.1


def test_without_positions_the_head_is_exactly_permutation_equivariant():
    head = lab.OneHead("none")
    perm = [0, 4, 2, 3, 1]
    assert torch.allclose(head.outputs(B), head.outputs(A)[perm], atol=1e-12)


def test_rope_decode_equals_the_layer_and_the_bugs_break_it():
    torch.manual_seed(0)
    layer = mc.GroupedQueryAttention(64, 8, 2).double()
    x = torch.randn(2, 10, 64, dtype=torch.float64)
    full, _ = layer(x, is_causal=True, rope=mc.RotaryEmbedding(8))
    out, cache = lab.rope_decode(layer, x, 4)
    assert (out - full).abs().max() < 1e-12 and cache.length == 10
    late, late_cache = lab.rope_decode(layer, x, 4, bug="one late")
    assert (late - full).abs().max() < 1e-5  # every position one late: the same offsets (float32 angles)
    reference_keys = mc.apply_rope(layer.k_proj(x).unflatten(-1, (2, 8)).transpose(1, 2), torch.arange(10))
    assert (cache.keys - reference_keys).abs().max() < 1e-12
    assert (late_cache.keys - reference_keys).abs().max() > 1e-2  # ... but not the keys a full pass caches
    for bug in [b for b in lab.BUGS if b and b != "one late"]:
        broken, _ = lab.rope_decode(layer, x, 4, bug=bug)
        assert (broken - full).abs().max() > 1e-3, bug
        assert (broken[:, :1] - full[:, :1]).abs().max() < 1e-12 or bug in ("unrotated keys", "rotated values")
    with pytest.raises(ValueError, match="bug must be one of"):
        lab.rope_decode(layer, x, 4, bug="nope")


def test_load_llama_checkpoint_calls_the_hub_as_documented(monkeypatch):
    torch.manual_seed(0)
    tiny = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=50,
            hidden_size=18,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=3,
            num_key_value_heads=1,
            tie_word_embeddings=True,
        )
    ).eval()
    calls = []

    class FakeTokenizer:
        eos_token_id = 0

        def __call__(self, text, return_tensors):
            return type("Enc", (), {"input_ids": torch.tensor([[len(w) % 50 for w in text.split()]])})()

        def decode(self, ids, skip_special_tokens):
            return " ".join(str(i) for i in ids.tolist())

    def tokenizer(source, **kwargs):
        calls.append(("tokenizer", source, kwargs.get("local_files_only")))
        return FakeTokenizer()

    def model(source, **kwargs):
        calls.append(("model", source, kwargs.get("local_files_only")))
        return tiny

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tokenizer)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model)
    ours, hf, tok = lab.load_llama_checkpoint()
    assert calls == [
        ("tokenizer", "HuggingFaceTB/SmolLM2-135M", False),
        ("model", "HuggingFaceTB/SmolLM2-135M", False),
    ]
    assert hf is tiny and ours.config.num_kv_heads == 1 and ours.lm_head.weight is ours.embed_tokens.weight
    text = lab.complete(ours, tok, "a bb ccc", max_new_tokens=4)
    ids = torch.tensor([[1, 2, 3]])
    expected = hf.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=0, pad_token_id=0)
    assert text == " ".join(str(i) for i in expected[0].tolist())


def test_mean_scores_decay_only_when_q_equals_k():
    """Independent random q, k: the mean score is 0 at every distance (each term's mean is 0);
    q = k: it follows the expected curve Σ 2·cos(distance·ω_i) / head_dim."""
    d = [0, 1, 10, 100, 1000]
    independent = lab.mean_scores(64, 10000.0, d, same=False, samples=4000)
    assert independent.abs().max() < 0.01
    same = lab.mean_scores(64, 10000.0, d, same=True, samples=4000)
    expected = lab.relative_scores(64, 10000.0, 1000)[d]
    assert (same - expected).abs().max() < 0.03 and same[-1] < 0.4 < same[0] - 0.5


def test_relative_scores_decay_and_pair_terms():
    s = lab.relative_scores(64, 10000.0, 200)
    assert s[0] == pytest.approx(1.0) and s[1:].max() < 1.0 and s[150:].mean() < s[:20].mean()
    pair = lab.relative_scores(8, 100.0, 5, pair=1)
    assert torch.allclose(pair, torch.cos(torch.arange(6.0, dtype=torch.float64) * 100.0 ** (-2 / 8)))


def test_draw_rope_shows_the_chosen_pair_and_offset():
    fig = lab.draw_rope(pair=2, offset=12, head_dim=16, theta=100.0)
    ax1, ax2 = fig.axes
    assert "pair 2" in ax1.get_title() and "θ = 100" in ax2.get_title()
    assert ax2.lines[-1].get_xdata()[0] == 12  # the offset marker
    assert ax1.get_xlabel() and ax2.get_xlabel() and ax2.get_ylabel()
    plt.close(fig)
    with pytest.raises(ValueError, match="pair must be in"):
        lab.draw_rope(pair=8, head_dim=16)


def test_the_theta_slider_changes_the_curves():
    """The explorer's θ control: a larger base keeps the q = k score high for longer."""
    small, large = (lab.draw_rope(pair=1, offset=5, head_dim=16, theta=t) for t in (100.0, 1e6))
    q_k_small, q_k_large = (f.axes[1].lines[0].get_ydata() for f in (small, large))
    assert q_k_large[200:].mean() > q_k_small[200:].mean() + 0.2
    assert "θ = 1,000,000" in large.axes[1].get_title()
    plt.close(small)
    plt.close(large)


def test_draw_experiments():
    fig = lab.draw_experiments({"RoPE": ([0, 1], [0.0, 1e-12])}, {"RoPE": 0.2, "none": 0.0})
    assert len(fig.axes) == 2 and all(ax.get_title() for ax in fig.axes)
    assert list(fig.axes[0].lines[0].get_ydata()) == [0.0, 0.0]  # rounding drawn as 0
    plt.close(fig)
