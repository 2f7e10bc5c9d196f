"""mha_course.lessons.diagnostics and mha_course.lessons.symptoms: each diagnostic on a case where its symptom is
present and one where it is absent, against naive references."""

import math

import matplotlib
import pytest
import torch

import mha_course as mc
from mha_course.block import Encoder
from mha_course.lessons import diagnostics as dg
from mha_course.lessons import symptoms as sy

matplotlib.use("Agg")


def softmax_weights(*shape, scale=2.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g)).softmax(dim=-1)


# --- attention entropy -------------------------------------------------------------------------


def test_entropy_matches_a_loop_over_rows():
    w = softmax_weights(2, 3, 4, 5)
    expected = []
    for h in range(3):
        rows = [-sum(p * math.log(p) for p in w[b, h, i].tolist()) for b in range(2) for i in range(4)]
        expected.append(sum(rows) / len(rows))
    torch.testing.assert_close(dg.attention_entropy(w), torch.tensor(expected))


def test_entropy_flags_uniform_and_one_hot_heads():
    w = torch.zeros(1, 3, 4, 6)
    w[0, 0] = 1 / 6  # uniform: symptom "uniform weights" present
    w[0, 1, torch.arange(4), torch.tensor([0, 3, 5, 1])] = 1.0  # one-hot: saturated
    w[0, 2] = softmax_weights(4, 6)  # neither
    ent = dg.attention_entropy(w, normalize=True)
    assert ent[0].item() == pytest.approx(1.0) and ent[1].item() == 0.0
    assert 0.2 < ent[2].item() < 0.95
    assert dg.attention_entropy(w)[0].item() == pytest.approx(math.log(6))


def test_normalised_entropy_counts_only_allowed_keys_and_skips_empty_rows():
    allowed = mc.causal_mask(5)
    w = allowed.float() / allowed.sum(dim=-1, keepdim=True)  # uniform over the allowed keys
    w = torch.stack([w, w])[None]  # (1, 2, 5, 5)
    ent = dg.attention_entropy(w, normalize=True)
    # rows 1..4 are uniform over 2..5 keys (normalised entropy 1); row 0 has one key (entropy 0)
    torch.testing.assert_close(ent, torch.full((2,), 4 / 5))
    w[0, :, 2] = 0.0  # a fully masked row is skipped
    w[0, :, 3] = float("nan")  # so is a NaN row
    torch.testing.assert_close(dg.attention_entropy(w, normalize=True), torch.full((2,), 2 / 3))


# --- head similarity ---------------------------------------------------------------------------


def test_head_similarity_matches_total_variation_loop():
    w = softmax_weights(2, 3, 4, 5, seed=1)
    sim = dg.head_similarity(w)
    for i in range(3):
        for j in range(3):
            tv = [0.5 * (w[b, i, q] - w[b, j, q]).abs().sum().item() for b in range(2) for q in range(4)]
            assert sim[i, j].item() == pytest.approx(1 - sum(tv) / len(tv), abs=1e-6)


def test_head_similarity_flags_identical_heads_only():
    w = softmax_weights(2, 3, 4, 5)
    w[:, 2] = w[:, 0]  # present: heads 0 and 2 identical
    sim = dg.head_similarity(w)
    assert sim[0, 2].item() == pytest.approx(1.0)
    assert sim[0, 1].item() < 0.9 and sim[1, 2].item() < 0.9  # absent for the other pairs
    disjoint = torch.zeros(1, 2, 2, 2)
    disjoint[0, 0, :, 0] = 1.0
    disjoint[0, 1, :, 1] = 1.0
    assert dg.head_similarity(disjoint)[0, 1].item() == 0.0


# --- capture, NaN finder, leakage ----------------------------------------------------------------


# --- column concentration (attention collapse) ---------------------------------------------------


def test_column_concentration_matches_a_loop_over_sequences():
    w = softmax_weights(3, 2, 4, 5)
    expected = [
        sum(max(sum(w[b, h, i, j].item() for i in range(4)) / 4 for j in range(5)) for b in range(3)) / 3
        for h in range(2)
    ]
    torch.testing.assert_close(dg.column_concentration(w), torch.tensor(expected), atol=1e-6, rtol=0)


def test_column_concentration_flags_collapse_not_sharp_lookups():
    L = 6
    w = torch.zeros(2, 3, L, L)
    w[:, 0] = 1 / L  # uniform
    w[:, 1] = torch.eye(L)  # one-hot, a different key for every query (a lookup)
    w[0, 2, :, 3] = 1.0  # collapse: every query on key 3 in sequence 0 ...
    w[1, 2, :, 0] = 1.0  # ... and on key 0 in sequence 1
    torch.testing.assert_close(dg.column_concentration(w), torch.tensor([1 / L, 1 / L, 1.0]))


def test_capture_attention_returns_each_layers_weights():
    torch.manual_seed(0)
    enc = Encoder(2, 16, 4, 32).eval()
    x = torch.randn(2, 5, 16)
    weights = dg.capture_attention(enc, x)
    assert list(weights) == ["layers.0.self_attn", "layers.1.self_attn"]
    with torch.no_grad():
        _, expected = enc.layers[0].self_attn(x)  # post-norm: layer 0's attention sees x itself
    torch.testing.assert_close(weights["layers.0.self_attn"], expected)


def test_find_nonfinite_absent_on_a_healthy_model():
    torch.manual_seed(0)
    enc = Encoder(2, 16, 2, 32).eval()
    result = dg.find_nonfinite(enc, torch.randn(2, 5, 16))
    assert not result.found and result.first is None
    assert result.trace and all(frac == 0 for _, frac in result.trace)


def test_find_nonfinite_names_the_module_that_made_it():
    torch.manual_seed(0)
    enc = Encoder(2, 16, 2, 32).eval()
    with torch.no_grad():
        enc.layers[1].linear1.weight[0, 0] = float("nan")
    result = dg.find_nonfinite(enc, torch.randn(2, 5, 16))
    assert result.first == "layers.1.linear1" and result.kind == "NaN"
    names = [n for n, _ in result.trace]
    assert all(f == 0 for n, f in result.trace[: names.index("layers.1.linear1")])
    assert result.trace[-1] == ("(model)", 1.0)  # linear2 and norm2 spread it to every feature


def test_find_nonfinite_names_the_parent_when_its_own_code_made_it():
    torch.manual_seed(0)
    dec = sy.with_attention(Encoder(2, 16, 2, 32, causal=True, norm_first=True).eval(), sy.HandWrittenAttention)
    left_pad = torch.tensor([[True] * 5, [False] * 2 + [True] * 3])[:, None, None, :]  # row 0 of seq 2 sees nothing
    result = dg.find_nonfinite(dec, torch.randn(2, 5, 16), mask=left_pad)
    assert result.first == "layers.0.self_attn (its own code, before out_proj)" and result.kind == "NaN"
    assert result.trace[-1][1] == 0.5  # layer 2 spreads it to every position of sequence 2
    # absent: the course's attention defines an empty row as output 0
    fixed = sy.with_attention(dec, mc.MultiHeadAttention)
    assert not dg.find_nonfinite(fixed, torch.randn(2, 5, 16), mask=left_pad).found


def test_find_nonfinite_reports_a_bad_input():
    x = torch.randn(1, 3, 16)
    x[0, 1, 2] = float("nan")
    assert dg.find_nonfinite(Encoder(1, 16, 2, 32).eval(), x).first == "input"


@pytest.mark.parametrize("bug", ["forgotten", "inverted"])
def test_causal_leakage_present_for_mask_bugs_absent_for_the_right_mask(bug):
    x = torch.randn(2, 6, 16)
    torch.manual_seed(0)
    good = sy.MaskBugDecoder(2, 16, 2, 32, norm_first=True).eval()
    torch.manual_seed(0)
    bad = sy.MaskBugDecoder(2, 16, 2, 32, norm_first=True, bug=bug).eval()
    leak, matrix = dg.causal_leakage(good, x)
    assert leak == 0.0 and matrix.shape == (6, 6)
    assert torch.equal(matrix.triu(diagonal=1), torch.zeros(6, 6)) and (matrix.diagonal() > 0).all()
    bad_leak, bad_matrix = dg.causal_leakage(bad, x)
    assert bad_leak > 0.01 and bad_matrix.triu(diagonal=1).max().item() == bad_leak


# --- the report --------------------------------------------------------------------------------


def test_report_on_a_healthy_model_finds_nothing():
    torch.manual_seed(0)
    dec = Encoder(2, 16, 2, 32, causal=True, norm_first=True)
    rep = dg.report(dec, torch.randn(2, 6, 16), causal=True, trained=False)
    assert rep.healthy and rep.leakage == 0.0
    assert "✅ passed · no problem found" in repr(rep) and "0 (exactly)" in repr(rep)
    assert dec.training  # report restores the mode


def test_report_flags_uniform_only_for_a_model_said_to_be_trained():
    torch.manual_seed(0)
    enc = Encoder(1, 16, 2, 32, norm_first=True)
    x = torch.randn(4, 8, 16)
    assert any("uniform attention" in f for f in dg.report(enc, x).findings)
    assert dg.report(enc, x, trained=False).healthy


def test_report_flags_copied_heads_and_one_hot_attention():
    torch.manual_seed(0)
    model = sy.PartnerModel()
    tokens, colors, _ = sy.partner_batch(16, generator=torch.Generator().manual_seed(0))
    x = model.embed(tokens, colors).detach()
    assert not any("identical" in f for f in dg.report(model.encoder, x, trained=False).findings)
    sy.copy_head(model.encoder.layers[0].self_attn)
    rep = dg.report(model.encoder, x, trained=False)
    assert rep.findings == ["identical heads (similarity >= 0.99): layers.0.self_attn heads 0 and 1"]
    with torch.no_grad():
        model.encoder.layers[0].self_attn.q_proj.weight.mul_(1000)  # huge scores: saturated softmax
    assert any("one-hot attention" in f for f in dg.report(model.encoder, x, trained=False).findings)


def test_report_flags_nan_and_skips_leakage():
    torch.manual_seed(0)
    enc = Encoder(2, 32, 2, 64).eval().half()
    x = (200 * torch.randn(2, 8, 32)).half()
    broken = dg.report(sy.with_attention(enc, sy.HandWrittenAttention), x, causal=True, trained=False)
    assert broken.nonfinite.first == "layers.0.self_attn (its own code, before out_proj)"
    assert broken.leakage is None and "not measured" in repr(broken)
    assert not dg.report(enc, x, trained=False).nonfinite.found  # scaling q before the matmul: finite


def test_draw_report_and_symptom_explorer_figures():
    torch.manual_seed(0)
    dec = sy.MaskBugDecoder(1, 16, 2, 32, norm_first=True, bug="inverted")
    rep = dg.report(dec, torch.randn(1, 5, 16), causal=True, trained=False)
    fig = dg.draw_report(rep, title="inverted")
    titles = [ax.get_title() for ax in fig.axes]
    assert fig._suptitle.get_text() == "inverted"
    assert "attention entropy per head" in titles and any(t.startswith("causal leakage: ") for t in titles)
    entropy_ax = next(ax for ax in fig.axes if ax.get_title() == "attention entropy per head")
    fig.canvas.draw()
    legend = entropy_ax.get_legend().get_window_extent()
    assert not any(legend.overlaps(bar.get_window_extent()) for bar in entropy_ax.patches)  # legend clear of bars
    fig2 = sy.draw({("mask inverted", "broken"): rep}, "mask inverted", "broken")
    assert fig2._suptitle.get_text() == "mask inverted — broken"
    with pytest.raises(ValueError, match="no report"):
        sy.draw({}, "mask inverted", "fixed")
    matplotlib.pyplot.close("all")


def test_draw_dependency_shows_the_matrix_with_position_labels():
    matrix = torch.rand(4, 4, generator=torch.Generator().manual_seed(0)).tril()
    ax = dg.draw_dependency(matrix, title="leak 0", vmax=0.5)
    torch.testing.assert_close(torch.as_tensor(ax.images[0].get_array()), matrix)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2", "3"]
    assert ax.get_title() == "leak 0" and ax.images[0].get_clim() == (0, 0.5)
    assert ax.images[0].colorbar.ax.get_ylabel() == "max change of output i"
    matplotlib.pyplot.close("all")


# --- the symptom models ------------------------------------------------------------------------


def test_partner_batch_targets_are_the_partners_colours():
    tokens, colors, target = sy.partner_batch(5, generator=torch.Generator().manual_seed(3))
    for b in range(5):
        for i in range(tokens.shape[1]):
            j = tokens[b].tolist().index(tokens[b, i].item() ^ 1)
            assert j != i and target[b, i] == colors[b, j]
    assert sy.token_labels(torch.tensor([0, 1, 5]), torch.tensor([2, 0, 3])) == ["A2", "a0", "c3"]


def test_partner_loss_and_accuracy_match_a_loop_over_positions():
    torch.manual_seed(0)
    model = sy.PartnerModel().eval()
    tokens, colors, target = sy.partner_batch(3, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        logits = model(tokens, colors)  # (B, L, colours)
        nll, hits = [], []
        for b in range(3):
            for i in range(tokens.shape[1]):
                row = logits[b, i].tolist()
                log_z = math.log(sum(math.exp(v) for v in row))
                nll.append(log_z - row[target[b, i]])
                hits.append(max(range(len(row)), key=row.__getitem__) == target[b, i])
        assert sy.partner_loss(model, tokens, colors, target).item() == pytest.approx(sum(nll) / len(nll), rel=1e-5)
    assert sy.accuracy(model, tokens, colors, target) == pytest.approx(sum(hits) / len(hits))


def test_training_turns_uniform_attention_into_a_lookup():
    torch.manual_seed(0)
    model = sy.PartnerModel()
    batch = sy.partner_batch(64, generator=torch.Generator().manual_seed(9))
    x = model.embed(*batch[:2]).detach()
    before = dg.attention_entropy(dg.capture_attention(model.encoder, x)["layers.0.self_attn"], normalize=True)
    sy.train_partner(model, steps=30, lr=2e-2, progress=False)
    x = model.embed(*batch[:2]).detach()
    after = dg.attention_entropy(dg.capture_attention(model.encoder, x)["layers.0.self_attn"], normalize=True)
    assert (before > 0.95).all() and (after < 0.5).all()
    assert sy.accuracy(model, *batch) > 0.9


def test_copied_heads_get_identical_gradients():
    torch.manual_seed(0)
    model = sy.PartnerModel()
    attn = sy.copy_head(model.encoder.layers[0].self_attn)
    d = attn.d_head
    tokens, colors, target = sy.partner_batch(8, generator=torch.Generator().manual_seed(0))
    torch.nn.functional.cross_entropy(model(tokens, colors).flatten(0, 1), target.flatten()).backward()
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
        torch.testing.assert_close(proj.weight.grad[:d], proj.weight.grad[d:])
    with pytest.raises(ValueError, match="src"):
        sy.copy_head(attn, src=2)


def test_hand_written_attention_is_correct_away_from_its_hazards():
    torch.manual_seed(0)
    mha = mc.MultiHeadAttention(16, 4)
    hand = sy.with_attention(torch.nn.Sequential(mha), sy.HandWrittenAttention)[0]
    assert type(hand) is sy.HandWrittenAttention
    x = torch.randn(2, 5, 16)
    mask = mc.padding_mask([5, 3], 5)
    with torch.no_grad():
        for got, expected in zip(hand(x, mask=mask), mha(x, mask=mask), strict=True):
            torch.testing.assert_close(got, expected)


def test_no_scale_attention_scores_are_sqrt_d_head_times_larger():
    torch.manual_seed(0)
    scaled, unscaled = sy.HandWrittenAttention(16, 2), sy.NoScaleAttention(16, 2)
    unscaled.load_state_dict(scaled.state_dict())
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        q = mc.split_heads(scaled.q_proj(x), 2)
        k = mc.split_heads(scaled.k_proj(x), 2)
        torch.testing.assert_close(unscaled.scores(q, k), scaled.scores(q, k) * math.sqrt(8))
        reference = torch.softmax(q @ k.transpose(-2, -1), dim=-1)  # the unscaled softmax, by hand
        torch.testing.assert_close(unscaled(x)[1], reference)


def test_mask_bug_decoder_without_bug_equals_the_causal_encoder():
    torch.manual_seed(0)
    dec = sy.MaskBugDecoder(2, 16, 2, 32, norm_first=True).eval()
    enc = Encoder(2, 16, 2, 32, norm_first=True, causal=True).eval()
    enc.load_state_dict(dec.state_dict())
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        torch.testing.assert_close(dec(x), enc(x))
    with pytest.raises(ValueError, match="bug"):
        sy.MaskBugDecoder(1, 16, 2, 32, bug="typo")


# --- the exercise checker ----------------------------------------------------------------------


def _entropy_loop(weights):
    B, h, Lq, _ = weights.shape
    out = torch.zeros(h)
    for head in range(h):
        rows = [weights[b, head, i] for b in range(B) for i in range(Lq)]
        out[head] = sum(-sum(p * math.log(p) for p in row.tolist() if p > 0) for row in rows) / len(rows)
    return out


@pytest.mark.parametrize(
    "fn",
    [
        lambda w: -torch.special.xlogy(w, w).sum(-1).mean((0, 2)),
        lambda w: torch.special.entr(w).sum(-1).mean(dim=(0, 2)),
        lambda w: -torch.where(w > 0, w * w.log(), 0.0).sum(-1).mean((0, 2)),
        _entropy_loop,
        lambda w: dg.attention_entropy(w),
    ],
)
def test_entropy_checker_accepts_correct_implementations(fn):
    result = mc.check.attention_entropy(fn)
    assert result.passed, result


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda w: -(w * w.log()).sum(-1).mean((0, 2)), "0·log 0"),
        (lambda w: -torch.special.xlogy(w, w).sum(-1).mean((0, 2)) / math.log(2), "bits"),
        (lambda w: torch.special.xlogy(w, w).sum(-1).mean((0, 2)), "minus sign"),
        (lambda w: -torch.special.xlogy(w, w).sum(-2).mean((0, 2)), "dim −2"),
        (lambda w: -torch.special.xlogy(w, w).sum(-1).mean(2), "batch dim"),
        (lambda w: -torch.special.xlogy(w, w).sum(-1).mean(), "over the heads"),
        (lambda w: dg.attention_entropy(w, normalize=True), "ln Lk"),
    ],
)
def test_entropy_checker_names_the_mistake(fn, words):
    result = mc.check.attention_entropy(fn)
    assert not result.passed and "likely mistake" in result.message and words in result.message, result


def test_entropy_checker_not_attempted():
    def todo(w):
        raise NotImplementedError("Exercise 17.1")

    assert mc.check.attention_entropy(todo).status == "not attempted"


# --- the QK-norm control -------------------------------------------------------------------------


def test_qk_norm_attention_matches_layer_norm_then_sdpa():
    torch.manual_seed(0)
    attn = sy.QKNormAttention(16, 4)
    with torch.no_grad():  # non-trivial norm parameters, so a missing or misplaced norm shows
        for norm in (attn.q_norm, attn.k_norm):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    x, mask = torch.randn(3, 5, 16), torch.rand(3, 1, 5, 5) > 0.3
    mask[..., 0] = True
    out, w = attn(x, mask=mask)

    def heads(t):  # (B, L, 16) -> (B, 4, L, 4), the layout written out by hand
        return t.view(3, 5, 4, 4).transpose(1, 2)

    q = torch.nn.functional.layer_norm(heads(attn.q_proj(x)), (4,), attn.q_norm.weight, attn.q_norm.bias)
    k = torch.nn.functional.layer_norm(heads(attn.k_proj(x)), (4,), attn.k_norm.weight, attn.k_norm.bias)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, heads(attn.v_proj(x)), attn_mask=mask)
    torch.testing.assert_close(out, attn.out_proj(ref.transpose(1, 2).reshape(3, 5, 16)))
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 4, 5))


def test_qk_norm_bounds_the_scores_whatever_the_weights():
    torch.manual_seed(0)
    plain = mc.MultiHeadAttention(16, 2)
    with torch.no_grad():
        plain.q_proj.weight.mul_(1000)
        plain.k_proj.weight.mul_(1000)
    normed = sy.QKNormAttention.from_attention(plain)
    torch.testing.assert_close(normed.v_proj.weight, plain.v_proj.weight)
    x = torch.randn(2, 6, 16)
    _, w_plain = plain(x)
    _, w_normed = normed(x)
    # LayerNorm'd vectors have length √d_head = √8, so |q·k|/√8 ≤ √8 and no weight can exceed e^(2√8)/(e^(2√8)+5)
    bound = math.exp(2 * math.sqrt(8)) / (math.exp(2 * math.sqrt(8)) + 5)
    assert w_plain.max() > 0.999 and w_normed.max() <= bound + 1e-6


def test_partner_model_with_qk_norm_starts_from_the_same_weights():
    torch.manual_seed(3)
    plain = sy.PartnerModel()
    torch.manual_seed(3)
    normed = sy.PartnerModel(qk_norm=True)
    assert isinstance(normed.encoder.layers[0].self_attn, sy.QKNormAttention)
    for name, p in plain.named_parameters():
        torch.testing.assert_close(dict(normed.named_parameters())[name], p)


def test_learning_rate_control_counts_runs():
    table = sy.learning_rate_control((2e-2,), seeds=(0,), steps=30)
    assert set(table) == {(2e-2, False), (2e-2, True)}
    assert table[2e-2, False]["solved"] == 1 and table[2e-2, False]["runs"] == 1  # lr = 0.02 trains (§2.1)
    assert table[2e-2, True]["solved"] == 1 and table[2e-2, True]["saturated"] == 0
