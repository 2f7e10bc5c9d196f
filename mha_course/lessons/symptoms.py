"""Attention bugs on purpose: the models and tasks behind notebook 17's troubleshooting table.

* The **partner task**: a toy problem that a one-layer attention model solves in a few dozen
  steps. Tokens come in pairs (``A``/``a``, ``B``/``b``, ...); every token carries a colour
  (0–3). A sequence holds both members of 4 random pairs in random order, and the target at each
  position is the colour of that token's partner — so every query must find exactly one key.
  :class:`PartnerModel` (embeddings + ``block.Encoder`` + readout), :func:`train_partner`,
  :func:`partner_loss` and :func:`accuracy`.
* **Broken parts**: :class:`HandWrittenAttention` (the layer as it is often first written,
  with its two hazards), :func:`copy_head` (heads initialised identically),
  :class:`MaskBugDecoder` (a causal mask forgotten or inverted), :func:`with_attention`.
* :func:`draw` — the symptom explorer's figure: the diagnostics dashboard of a case.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import validation
from ..attention import attention_weights
from ..block import Encoder
from ..heads import merge_heads, split_heads
from ..masks import causal_mask
from ..multihead import MultiHeadAttention
from .diagnostics import Report, draw_report

NUM_PAIRS, PAIRS_PER_SEQ, NUM_COLORS = 8, 4, 4

# ---------------------------------------------------------------------------------------------
# the partner task
# ---------------------------------------------------------------------------------------------


def partner_batch(batch_size: int, *, generator: torch.Generator | None = None):
    """A batch of the partner task: ``tokens``, ``colors``, ``target``, each (B, L) int64, L = 8.

    Token 2j and 2j+1 are partners (labels ``A``/``a`` for j = 0); ``target[b, i]`` is the
    colour of the partner of ``tokens[b, i]``, which is somewhere else in the same sequence.
    """
    validation.positive_int("batch_size", batch_size)
    B, n = batch_size, PAIRS_PER_SEQ
    pairs = torch.rand(B, NUM_PAIRS, generator=generator).argsort(dim=1)[:, :n]  # (B, n) distinct pairs
    tokens = torch.cat([2 * pairs, 2 * pairs + 1], dim=1)  # (B, 2n): both members of each pair
    order = torch.rand(B, 2 * n, generator=generator).argsort(dim=1)
    tokens = tokens.gather(1, order)  # shuffled
    colors = torch.randint(NUM_COLORS, (B, 2 * n), generator=generator)
    where = (tokens[:, None, :] == (tokens ^ 1)[:, :, None]).long().argmax(dim=-1)  # (B, L) partner position
    return tokens, colors, colors.gather(1, where)


def token_labels(tokens: torch.Tensor, colors: torch.Tensor) -> list[str]:
    """Labels for one sequence: ``A2`` = the upper-case member of pair A, colour 2."""
    letters = [chr(65 + int(t) // 2) if int(t) % 2 == 0 else chr(97 + int(t) // 2) for t in tokens]
    return [f"{letter}{int(c)}" for letter, c in zip(letters, colors, strict=True)]


class PartnerModel(nn.Module):
    """Token + colour embeddings, an ``Encoder`` (1 pre-norm block by default), a linear readout.

    ``embed(tokens, colors)`` -> (B, L, d_model); ``forward(tokens, colors)`` -> logits
    (B, L, NUM_COLORS). Diagnose the attention part with ``report(model.encoder, model.embed(...))``.
    """

    def __init__(self, d_model: int = 32, num_heads: int = 2, *, num_layers: int = 1, qk_norm: bool = False):
        super().__init__()
        self.token = nn.Embedding(2 * NUM_PAIRS, d_model)
        self.color = nn.Embedding(NUM_COLORS, d_model)
        self.encoder = Encoder(num_layers, d_model, num_heads, 2 * d_model, norm_first=True)
        self.readout = nn.Linear(d_model, NUM_COLORS)
        if qk_norm:  # same random weights as without (built first, then copied), plus the two norms
            for layer in self.encoder.layers:
                layer.self_attn = QKNormAttention.from_attention(layer.self_attn)

    def embed(self, tokens: torch.Tensor, colors: torch.Tensor) -> torch.Tensor:
        return self.token(tokens) + self.color(colors)  # (B, L, d_model); no positions needed

    def forward(self, tokens: torch.Tensor, colors: torch.Tensor) -> torch.Tensor:
        return self.readout(self.encoder(self.embed(tokens, colors)))  # (B, L, NUM_COLORS)


class QKNormAttention(MultiHeadAttention):
    """``MultiHeadAttention`` with QK-norm: a LayerNorm over each head's query and key vectors
    (width d_head, shared by the heads) before the scores, so no growth of W_Q or W_K can make the
    scores q·k/√d_head larger than about √d_head (Dehghani et al. 2023, https://arxiv.org/abs/2302.05442;
    Wortsman et al. 2023, https://arxiv.org/abs/2309.14322). Notebook 15 builds the RMSNorm variant
    of today's decoders; this one is the notebook-17 control."""

    def __init__(self, d_model: int, num_heads: int, **kwargs):
        super().__init__(d_model, num_heads, **kwargs)
        self.q_norm = nn.LayerNorm(self.d_head)
        self.k_norm = nn.LayerNorm(self.d_head)

    @classmethod
    @torch.no_grad()
    def from_attention(cls, attn: MultiHeadAttention) -> QKNormAttention:
        """A QK-norm layer with ``attn``'s projections (the norms start as the identity map's
        LayerNorm: weight 1, bias 0)."""
        new = cls(attn.d_model, attn.num_heads, bias=attn.q_proj.bias is not None)
        new.to(attn.q_proj.weight)
        new.load_state_dict(attn.state_dict(), strict=False)
        return new

    def forward(self, query, key=None, value=None, *, mask=None, need_weights=True):
        key, value = validation.mha_inputs(self, query, key, value)
        B, Lq, Lk, h = query.shape[0], query.shape[1], key.shape[1], self.num_heads
        mask = validation.mha_mask(mask, B, h, Lq, Lk)
        q = self.q_norm(split_heads(self.q_proj(query), h))  # (B, h, Lq, d_head), each vector normalised
        k = self.k_norm(split_heads(self.k_proj(key), h))  # (B, h, Lk, d_head)
        v = split_heads(self.v_proj(value), h)
        weights = attention_weights(q, k, mask)  # (B, h, Lq, Lk), scaled by 1/√d_head
        return self.out_proj(merge_heads(weights @ v)), weights  # always returns the weights


def train_partner(
    model: PartnerModel, *, steps: int, lr: float, batch_size: int = 32, seed: int = 0, progress: bool = True
) -> list[float]:
    """Train ``model`` on fresh partner batches with Adam; returns the loss of every step.
    The batches come from a generator seeded with ``seed`` (the same data on every run)."""
    from ..kit.progress import progress_bar

    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in progress_bar(range(steps), desc=f"training (lr={lr:g})", disable=not progress):
        loss = partner_loss(model, *partner_batch(batch_size, generator=gen))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


def partner_loss(model: PartnerModel, tokens, colors, target) -> torch.Tensor:
    """Mean cross-entropy of the predicted partner colours, a scalar tensor (the training loss;
    ln 4 ≈ 1.386 for a model that guesses uniformly among the 4 colours)."""
    return F.cross_entropy(model(tokens, colors).flatten(0, 1), target.flatten())  # (B·L, colours) vs (B·L,)


@torch.no_grad()
def accuracy(model: PartnerModel, tokens, colors, target) -> float:
    """Fraction of positions whose partner colour the model predicts."""
    return (model(tokens, colors).argmax(dim=-1) == target).float().mean().item()


def learning_rate_control(
    lrs, *, seeds=(0, 1, 2), steps: int = 30, solved: float = 0.85, saturated: float = 0.05, generator_seed: int = 123
) -> dict:
    """Train the partner model with and without QK-norm at each learning rate, once per seed
    (``torch.manual_seed(seed)`` before each model: the two variants start from the same weights).

    Returns ``{(lr, qk_norm): {"solved": n, "saturated": n, "runs": len(seeds)}}``: how many runs
    reached accuracy ≥ ``solved`` on a fixed evaluation batch, and how many ended with a head whose
    normalised entropy is below ``saturated`` (a softmax that has gone one-hot). Counts against
    thresholds, not digits: training at these rates is chaotic in its last bits.
    """
    from .diagnostics import report

    tokens, colors, target = partner_batch(256, generator=torch.Generator().manual_seed(generator_seed))
    table = {}
    for lr in lrs:
        for qk_norm in (False, True):
            n_solved = n_saturated = 0
            for seed in seeds:
                torch.manual_seed(seed)
                model = PartnerModel(qk_norm=qk_norm)
                train_partner(model, steps=steps, lr=lr, progress=False)
                n_solved += accuracy(model, tokens, colors, target) >= solved
                entropy = report(model.encoder, model.embed(tokens, colors).detach()).entropy
                n_saturated += any(bool((e < saturated).any()) for e in entropy.values())
            table[lr, qk_norm] = {"solved": int(n_solved), "saturated": int(n_saturated), "runs": len(seeds)}
    return table


# ---------------------------------------------------------------------------------------------
# broken parts
# ---------------------------------------------------------------------------------------------


class HandWrittenAttention(MultiHeadAttention):
    """``mc.MultiHeadAttention``'s weights with attention written the way it often is at first::

        scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(dim=-1)

    Correct in float32 on ordinary inputs, with two hazards: the scores are scaled *after* the
    matmul, so a float16 matmul can overflow to inf first (inf - inf = NaN in the softmax); and a
    query whose keys are all masked gets softmax(-inf, ..., -inf) = 0/0 = NaN.
    (``mc.MultiHeadAttention`` scales q before the matmul and defines an empty row as output 0.)
    Same signature and return as ``MultiHeadAttention.forward``.
    """

    def forward(self, query, key=None, value=None, *, mask=None, need_weights=True):
        key = query if key is None else key
        value = key if value is None else value
        h = self.num_heads
        q = split_heads(self.q_proj(query), h)  # (B, h, Lq, d_head)
        k = split_heads(self.k_proj(key), h)  # (B, h, Lk, d_head)
        v = split_heads(self.v_proj(value), h)  # (B, h, Lk, d_head)
        scores = self.scores(q, k)  # (B, h, Lq, Lk), in q's dtype
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(dim=-1)  # (B, h, Lq, Lk)
        return self.out_proj(merge_heads(weights @ v)), weights  # (B, Lq, d_model)

    def scores(self, q, k):
        """q·k / √d_head: the matmul first, the division after."""
        return q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B, h, Lq, Lk)


class NoScaleAttention(HandWrittenAttention):
    """:class:`HandWrittenAttention` with the 1/√d_head forgotten — the scores are q·k, about √d_head
    times too large: the softmax saturates (one-hot rows), and in float16 the scores overflow sooner."""

    def scores(self, q, k):
        return q @ k.transpose(-2, -1)  # (B, h, Lq, Lk): no division


def with_attention(model: nn.Module, cls: type[MultiHeadAttention]) -> nn.Module:
    """A deep copy of ``model`` whose every ``MultiHeadAttention`` (or subclass) is replaced by
    ``cls`` holding the same weights: the same model with a different attention computation."""
    new = copy.deepcopy(model)
    for name, module in list(new.named_modules()):
        if isinstance(module, MultiHeadAttention) and type(module) is not cls:
            swapped = cls(
                module.d_model,
                module.num_heads,
                bias=module.q_proj.bias is not None,
                kdim=module.kdim,
                vdim=module.vdim,
                dropout=module.dropout,
            )
            swapped.load_state_dict(module.state_dict())
            swapped.to(module.q_proj.weight).train(module.training)
            parent_name, _, attr = name.rpartition(".")
            setattr(new.get_submodule(parent_name) if parent_name else new, attr, swapped)
    return new


@torch.no_grad()
def copy_head(attn: MultiHeadAttention, src: int = 0) -> MultiHeadAttention:
    """Initialise every head of ``attn`` identically, in place: head ``src``'s rows of W_Q, W_K,
    W_V (and biases) and its column block of W_O are copied to all heads — what a buggy init
    that builds one head and repeats it does. Returns ``attn``."""
    d, h = attn.d_head, attn.num_heads
    if not 0 <= src < h:
        raise ValueError(f"src must be a head index in [0, {h - 1}], got {src}")
    rows = slice(src * d, (src + 1) * d)
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
        proj.weight.copy_(proj.weight[rows].repeat(h, 1))  # (h*d_head, d_model)
        if proj.bias is not None:
            proj.bias.copy_(proj.bias[rows].repeat(h))
    attn.out_proj.weight.copy_(attn.out_proj.weight[:, rows].repeat(1, h))  # (d_model, h*d_head)
    return attn


class MaskBugDecoder(Encoder):
    """A causal (GPT-style) stack with a switch for the two classic mask bugs.

    ``bug=None``: every block gets ``mc.causal_mask(L)`` (True = may attend) — correct.
    ``bug="forgotten"``: the mask is built but never passed to the blocks.
    ``bug="inverted"``: the mask is written in PyTorch's convention for ``nn.Transformer``
    (``triu(diagonal=1)``, True = *blocked*) and given to an API where True = may attend.
    ``forward(x) -> x``: (B, L, d_model) -> (B, L, d_model).
    """

    BUGS = (None, "forgotten", "inverted")

    def __init__(self, *args, bug: str | None = None, **kwargs):
        if bug not in self.BUGS:
            raise ValueError(f"bug must be one of {self.BUGS}, got {bug!r}")
        super().__init__(*args, **kwargs)
        self.bug = bug

    def forward(self, x: torch.Tensor, *, mask=None) -> torch.Tensor:
        L = x.shape[1]
        if self.bug == "inverted":
            mask = torch.ones(L, L, dtype=torch.bool, device=x.device).triu(diagonal=1)  # True = blocked
        else:
            mask = causal_mask(L, device=x.device)  # (L, L), True = may attend
        for layer in self.layers:
            x = layer(x) if self.bug == "forgotten" else layer(x, mask=mask)  # (B, L, d_model)
        return self.norm(x)


# ---------------------------------------------------------------------------------------------
# the symptom explorer
# ---------------------------------------------------------------------------------------------


def draw(reports: dict[tuple[str, str], Report], symptom: str, version: str = "broken"):
    """The diagnostics dashboard (``diagnostics.draw_report``) of one case of the notebook's
    troubleshooting table: ``reports[(symptom, version)]``, version "broken" or "fixed"."""
    if (symptom, version) not in reports:
        known = sorted({s for s, _ in reports})
        raise ValueError(f"no report for ({symptom!r}, {version!r}); symptoms: {known}, versions: broken, fixed")
    return draw_report(reports[symptom, version], title=f"{symptom} — {version}")
