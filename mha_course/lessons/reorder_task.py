"""Notebook 05: a cross-attention trained on a toy reordering task (reverse the source).

The model is as small as the task allows. The source is a sequence of random tokens; the
encoder side is a token embedding plus a learned position embedding (no encoder layers); the
decoder side is one learned query vector per target position (the target *slots*); one
single-head cross-attention lets target slot t read the source; a linear readout predicts a
token. Trained so that slot t outputs source token ``order[t]`` (reversed by default), the
only way to succeed is to put the weight of slot t on source position ``order[t]``: the
alignment the trained weights show is what the task asks for, and :func:`alignment` measures it.

``attend`` is any function ``(target, source, source_lengths, w_q, w_k, w_v) -> (out,
weights)`` with the convention of :func:`cross_attention` (the exercise's signature); the
default is :func:`cross_attention` itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..attention import scaled_dot_product_attention
from ..masks import padding_mask

__all__ = ["cross_attention", "ReorderModel", "source_batch", "train", "alignment", "Alignment"]

VOCAB, LENGTH, D_MODEL, D_K = 10, 6, 16, 8


def cross_attention(target, source, source_lengths, w_q, w_k, w_v):
    """Single-head cross-attention: the target's queries read the source's keys and values.

    target (B, Lt, d_tgt); source (B, Ls, d_src); source_lengths (B,) int, sequence b has
    ``source_lengths[b]`` real tokens followed by padding; w_q (d_tgt, d_k), w_k (d_src, d_k),
    w_v (d_src, d_v) in math convention (``x @ w``). Returns out (B, Lt, d_v) and weights
    (B, Lt, Ls): softmax over the source of (Q Kᵀ / √d_k), padding keys weight exactly 0, no
    causal mask (the whole source is known).
    """
    q, k, v = target @ w_q, source @ w_k, source @ w_v  # (B, Lt, d_k), (B, Ls, d_k), (B, Ls, d_v)
    keep = padding_mask(source_lengths, source.shape[1])[:, 0]  # (B, 1, Ls): broadcast over queries
    return scaled_dot_product_attention(q, k, v, keep)  # (B, Lt, d_v), (B, Lt, Ls)


class ReorderModel(nn.Module):
    """Source tokens (B, Ls) -> logits (B, Lt, vocab) and cross-attention weights (B, Lt, Ls).

    Source side: token embedding + position embedding, (B, Ls, d_model). Target side: one
    learned query vector per slot, (Lt, d_model). Cross-attention weights in math convention:
    w_q, w_k (d_model, d_k), w_v (d_model, d_k).
    """

    def __init__(self, vocab: int = VOCAB, length: int = LENGTH, d_model: int = D_MODEL, d_k: int = D_K):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Parameter(torch.randn(length, d_model))  # (Ls, d_model)
        self.slots = nn.Parameter(torch.randn(length, d_model))  # (Lt, d_model)
        scale = 1 / math.sqrt(d_model)
        self.w_q, self.w_k, self.w_v = (nn.Parameter(torch.randn(d_model, d_k) * scale) for _ in range(3))
        self.readout = nn.Linear(d_k, vocab)

    def forward(self, src, attend=cross_attention):
        B, Ls = src.shape
        source = self.tokens(src) + self.positions[:Ls]  # (B, Ls, d_model)
        target = self.slots.expand(B, -1, -1)  # (B, Lt, d_model)
        lengths = torch.full((B,), Ls, dtype=torch.long)  # no padding in this task
        out, weights = attend(target, source, lengths, self.w_q, self.w_k, self.w_v)  # (B, Lt, d_k), (B, Lt, Ls)
        return self.readout(out), weights  # (B, Lt, vocab), (B, Lt, Ls)


def source_batch(batch: int, generator: torch.Generator, *, vocab: int = VOCAB, length: int = LENGTH):
    """Random source sequences, (batch, length) int64."""
    return torch.randint(vocab, (batch, length), generator=generator)


def reversed_order(length: int = LENGTH) -> torch.Tensor:
    """The reversal: target slot t reads source position length - 1 - t."""
    return torch.arange(length - 1, -1, -1)


def train(attend=cross_attention, *, steps: int = 120, batch: int = 32, seed: int = 0, order=None, lr: float = 0.05):
    """Train a :class:`ReorderModel` whose cross-attention is ``attend`` to output the source in
    ``order`` (default: reversed), with Adam. Runs on one CPU thread (tiny tensors: more threads
    only add overhead), a fraction of a second. Returns (model, losses), one loss per step."""
    order = reversed_order() if order is None else torch.as_tensor(order)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(attend, steps, batch, seed, order, lr)
    finally:
        torch.set_num_threads(threads)


def _train(attend, steps, batch, seed, order, lr):
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        torch.manual_seed(seed)
        model = ReorderModel(length=len(order))
        data = torch.Generator().manual_seed(seed + 1)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        losses = []
        for _ in range(steps):
            src = source_batch(batch, data, length=len(order))  # (B, Ls)
            logits, _ = model(src, attend)  # (B, Lt, vocab)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), src[:, order].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return model.eval(), losses


@dataclass(frozen=True)
class Alignment:
    """What a trained model learned, on fresh source sequences.

    ``aligned``: target slots whose largest average weight is on the source position they must
    copy (out of ``slots``); ``weight_on_target``: the average weight there (over slots and
    sequences); ``accuracy``: fraction of output tokens right; ``mean_weights`` (Lt, Ls).
    """

    aligned: int
    slots: int
    weight_on_target: float
    accuracy: float
    mean_weights: torch.Tensor


@torch.no_grad()
def alignment(model: ReorderModel, attend=cross_attention, *, order=None, batch: int = 256, seed: int = 99):
    """Measure the alignment a trained model learned (:class:`Alignment`)."""
    order = reversed_order(model.slots.shape[0]) if order is None else torch.as_tensor(order)
    src = source_batch(batch, torch.Generator().manual_seed(seed), length=len(order))  # (B, Ls)
    logits, weights = model(src, attend)  # (B, Lt, vocab), (B, Lt, Ls)
    mean = weights.mean(dim=0)  # (Lt, Ls)
    slots = torch.arange(len(order))
    return Alignment(
        aligned=int((mean.argmax(dim=-1) == order).sum()),
        slots=len(order),
        weight_on_target=float(mean[slots, order].mean()),
        accuracy=float((logits.argmax(dim=-1) == src[:, order]).float().mean()),
        mean_weights=mean,
    )
