"""Notebook 02: the hand-set heads of the example sentence, its explorer figure, the per-head
multi-head-attention checker (the quiz is checked with all the others in test_quizzes.py)."""

import math

import matplotlib
import pytest
import torch
import torch.nn.functional as F

import mha_course as mc
from mha_course.check import per_head
from mha_course.lessons import hand_set_heads

matplotlib.use("Agg")

T = hand_set_heads.TOKENS


@torch.no_grad()
def torch_mha(w):
    """torch.nn.MultiheadAttention with the hand-set weights: an independent reference."""
    d, h = hand_set_heads.D_MODEL, hand_set_heads.NUM_HEADS
    ref = torch.nn.MultiheadAttention(d, h, bias=False, batch_first=True)
    # math convention x @ W_Q[i] (d_model, d_head) -> nn.Linear rows: W_Q[i].T stacked head by head
    blocks = [torch.cat([w[name][i].T for i in range(h)]) for name in ("w_q", "w_k", "w_v")]
    ref.in_proj_weight.copy_(torch.cat(blocks))
    ref.out_proj.weight.copy_(w["w_o"].T)
    return ref


def top(row):
    return T[int(row.argmax())], row.max().item()


def test_embeddings_carry_the_named_features():
    x = hand_set_heads.embeddings()
    assert x.shape == (len(T), len(hand_set_heads.FEATURES)) == (12, 12)

    def features(tok_index):
        return {hand_set_heads.FEATURES[j]: x[tok_index, j].item() for j in range(12) if x[tok_index, j] != 0}

    assert features(T.index("she")) == {"female": 1.0, "pronoun": 1.0, "subject": 1.0, "clause": -1.0}
    assert features(0) == {"Xiaoming": 1.0, "male": 1.0, "subject": 1.0, "clause": 1.0}
    assert features(T.index("it")) == {"thing": 1.0, "pronoun": 1.0, "clause": -1.0}
    assert features(2) == {"clause": 1.0}  # "the": a function word has only its clause
    assert x[:, hand_set_heads.FEATURES.index("clause")].tolist() == [1.0] * 6 + [-1.0] * 6


def test_by_hand_equals_torch_multihead_attention():
    x, w = hand_set_heads.embeddings(), hand_set_heads.head_weights()
    result = hand_set_heads.attention_by_hand(x, w)
    with torch.no_grad():
        out, weights = torch_mha(w)(x[None], x[None], x[None], average_attn_weights=False)
    torch.testing.assert_close(result["out"], out[0])
    torch.testing.assert_close(result["weights"], weights[0])
    assert result["concat"].shape == (12, 12) and result["heads"].shape == (3, 12, 4)
    torch.testing.assert_close(result["concat"] @ w["w_o"], result["out"])


def test_each_head_does_its_designed_job():
    weights = hand_set_heads.attention_by_hand(hand_set_heads.embeddings(), hand_set_heads.head_weights())["weights"]
    she, it = T.index("she"), T.index("it")
    # head 0: who is it?
    assert top(weights[0, she])[0] == "Xiaohong" and top(weights[0, she])[1] > 0.95
    assert top(weights[0, it])[0] == "book" and top(weights[0, it])[1] > 0.95
    for noun in ("Xiaoming", "book", "Xiaohong"):
        assert top(weights[0, T.index(noun)])[0] == noun  # a noun finds itself
    # head 1: what do I do? (a subject -> the verbs of its own clause)
    assert top(weights[1, 0])[0] == "handed" and top(weights[1, 0])[1] > 0.95
    wanted, read = weights[1, she, T.index("wanted")].item(), weights[1, she, T.index("read")].item()
    assert wanted == pytest.approx(read) and wanted + read > 0.99
    # head 2: acted on what?
    for verb in ("handed", "read"):
        assert top(weights[2, T.index(verb)])[0] == "book" and top(weights[2, T.index(verb)])[1] > 0.95
    # a query the head has no question for attends uniformly (softmax of equal scores)
    torch.testing.assert_close(weights[0, T.index("handed")], torch.full((12,), 1 / 12))


def test_score_of_a_match_is_strength_over_sqrt_d_head():
    x, w = hand_set_heads.embeddings(), hand_set_heads.head_weights(strength=8.0)
    q, k = x @ w["w_q"][0], x @ w["w_k"][0]
    she, xiaohong = T.index("she"), T.index("Xiaohong")
    assert (q[she] @ k[xiaohong]).item() == 8.0
    # with a weaker strength, the weight on the referent follows softmax(strength/2, 0, ..., 0)
    row = hand_set_heads.attention_by_hand(x, w)["weights"][0, she]
    e = math.exp(8.0 / 2)
    assert row[xiaohong].item() == pytest.approx(e / (e + 11), rel=1e-5)


def test_w_o_routes_each_head_and_mixes_two():
    w = hand_set_heads.head_weights()
    out = hand_set_heads.attention_by_hand(hand_set_heads.embeddings(), w)["out"]
    col = {name: j for j, name in enumerate(hand_set_heads.OUT_FEATURES)}
    she, read = T.index("she"), T.index("read")
    assert out[she, col["refers to Xiaohong"]] > 0.95
    assert out[she, col["does wanted"]] == pytest.approx(out[she, col["does read"]].item())
    assert out[read, col["acts on book"]] > 0.95
    # "involves ·" reads head 0 and head 2: it is the sum of "refers to ·" and "acts on ·"
    for who in ("Xiaoming", "Xiaohong", "book"):
        torch.testing.assert_close(
            out[:, col[f"involves {who}"]], out[:, col[f"refers to {who}"]] + out[:, col[f"acts on {who}"]]
        )


def test_looped_module_matches_torch_on_random_input():
    w = hand_set_heads.head_weights()
    m = hand_set_heads.looped_module(w)
    x = torch.randn(2, 9, 12, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, ours_w = m(x)
        theirs, theirs_w = torch_mha(w)(x, x, x, average_attn_weights=False)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(ours_w, theirs_w)


def test_describe_is_read_off_the_matrices():
    text = hand_set_heads.describe()
    assert "q = [12·male, 12·female, 12·thing, 0]" in text
    assert "k = [handed + wanted + read, clause, 0, 0]" in text
    w = hand_set_heads.head_weights(strength=5.0)
    w["w_k"][2, hand_set_heads.FEATURES.index("pronoun"), 0] = -1.0
    changed = hand_set_heads.describe(w)
    assert "q = [5·handed + 5·read, 0, 0, 0]" in changed
    assert "k = [book - pronoun, 0, 0, 0]" in changed


def test_draw_head_shows_the_row_of_the_query():
    x, w = hand_set_heads.embeddings(), hand_set_heads.head_weights()
    q, k = x @ w["w_q"][1], x @ w["w_k"][1]
    expected = F.softmax(q @ k.T / 2.0, dim=-1)  # head 1, d_head = 4
    she = T.index("she")
    fig = hand_set_heads.draw_head(head=1, query=she)
    try:
        ax_map, ax_row, _ = fig.axes  # heatmap, the bar chart, the colour bar (added last)
        heights = [p.get_height() for p in ax_row.patches]
        assert heights == pytest.approx(expected[she].tolist(), abs=1e-6)
        assert "she" in fig._suptitle.get_text() and "head 1" in ax_map.get_title()
        assert ax_row.get_title().startswith("row of 'she'")
        assert [t.get_text() for t in ax_row.get_xticklabels()] == hand_set_heads.token_labels()
    finally:
        matplotlib.pyplot.close(fig)


@pytest.mark.parametrize("kwargs", [{"head": 3}, {"head": -1}, {"query": 12}, {"query": -1}])
def test_draw_head_rejects_bad_input(kwargs):
    with pytest.raises(ValueError, match="head|query"):
        hand_set_heads.draw_head(**kwargs)


# --- the checker mc.check.multi_head_attention_per_head -------------------------------------------


def loop_solution(x, w_q, w_k, w_v, w_o):
    heads = []
    for i in range(w_q.shape[0]):
        q, k, v = x @ w_q[i], x @ w_k[i], x @ w_v[i]
        heads.append(F.scaled_dot_product_attention(q, k, v))
    return torch.cat(heads, dim=-1) @ w_o


def stacked_solution(x, w_q, w_k, w_v, w_o):
    q, k, v = (torch.einsum("bld,hde->bhle", x, w) for w in (w_q, w_k, w_v))
    out = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1) @ v  # (B, h, L, d_head)
    return out.transpose(1, 2).flatten(2) @ w_o


@pytest.mark.parametrize("fn", [loop_solution, stacked_solution])
def test_checker_accepts_correct_implementations(fn):
    result = mc.check.multi_head_attention_per_head(fn)
    assert result.passed, result


@pytest.mark.parametrize("mistake", per_head.MULTI_HEAD_ATTENTION_PER_HEAD_MISTAKES, ids=lambda m: m.name)
def test_checker_names_each_mistake(mistake):
    result = mc.check.multi_head_attention_per_head(mistake.fn)
    assert not result.passed
    assert mistake.diagnosis in result.message


def test_checker_reports_not_attempted_and_never_raises():
    def todo(*args):
        raise NotImplementedError

    assert mc.check.multi_head_attention_per_head(todo).status == "not attempted"
    result = mc.check.multi_head_attention_per_head(lambda *args: "an answer")
    assert not result.passed and "torch.Tensor" in result.message
    broken = mc.check.multi_head_attention_per_head(lambda x, *w: x @ torch.zeros(3, 3))
    assert not broken.passed and "raised" in broken.message


def test_checker_reference_is_the_sentence_computation():
    """The checker's reference and the notebook's by-hand computation agree on the sentence."""
    x, w = hand_set_heads.embeddings(), hand_set_heads.head_weights()
    got = per_head._reference(x[None], w["w_q"], w["w_k"], w["w_v"], w["w_o"])[0]
    torch.testing.assert_close(got, hand_set_heads.attention_by_hand(x, w)["out"])
