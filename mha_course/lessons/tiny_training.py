"""A tiny model and a readable, deterministic training loop for the two-relation task (notebook 07).

The model is one attention layer, nothing else that could mix positions::

    x = key_embed[keys] + value_embed[values] + pos_embed        (B, L, d_model)
    y = LayerNorm(x + MultiHeadAttention(x))                     residual, then post-norm
    logits = readout(y[:, scored])                               (B, S, num_values²)

Only the attention layer moves information between positions, so every relation the model
uses must be found by a head. ``mc.MultiHeadAttention`` has 4·d_model² + 4·d_model
parameters whatever ``num_heads`` is, so models with 1, 2 or 4 heads at the same d_model have
exactly the same number of parameters.

``train`` is plain PyTorch: fresh batches from a seeded generator, AdamW, cross-entropy; it
fixes the thread count while it runs (and restores it), so a seed gives bit-identical results
on one machine. It trains in float64 by default: training amplifies rounding differences, and
different CPUs round float32 matmuls and softmaxes differently in the last bit (AVX2 and AVX-512
kernels, say); in float64 those differences start 2²⁹ ≈ 5·10⁸ times smaller and stay far below
anything the notebook prints.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from ..kit.progress import progress_bar
from ..kit.run_cache import advance, cached_run
from ..multihead import MultiHeadAttention
from .relation_task import TwoRelationTask

#: threads used while training: one thread is deterministic and, for models this small, fastest
NUM_THREADS = 1
#: seed of the fixed evaluation set (different from every training seed's batch stream)
EVAL_SEED = 10_000


class TinyAttentionModel(nn.Module):
    """Embeddings → one multi-head attention layer (residual + LayerNorm) → linear readout.

    Args:
        task: the task (sizes of the vocabularies, sequence length, scored positions).
        num_heads: h; d_head = d_model // h.
        d_model: model width (the same for every h, so the parameter count does not change).
    """

    def __init__(self, task: TwoRelationTask, num_heads: int, d_model: int = 32):
        super().__init__()
        self.task = task
        self.key_embed = nn.Embedding(task.num_keys, d_model)
        self.value_embed = nn.Embedding(task.num_values, d_model)
        self.pos_embed = nn.Parameter(torch.randn(task.seq_len, d_model))  # learned, one per position
        self.attn = MultiHeadAttention(d_model, num_heads)
        self.norm = nn.LayerNorm(d_model)
        self.readout = nn.Linear(d_model, task.num_classes)
        self.register_buffer("scored", task.scored, persistent=False)

    def embed(self, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """(B, L) keys and values -> x (B, L, d_model): a record is the sum of its parts and its position."""
        return self.key_embed(keys) + self.value_embed(values) + self.pos_embed

    def forward(self, keys: torch.Tensor, values: torch.Tensor, *, need_weights: bool = False):
        """Logits (B, S, num_classes) at the scored positions, and the attention weights
        (B, h, L, L) when ``need_weights`` (else None)."""
        x = self.embed(keys, values)  # (B, L, d_model)
        if need_weights:  # for the attention maps: the query of every position
            a, weights = self.attn(x, need_weights=True)  # (B, L, d_model), (B, h, L, L)
            a = a[:, self.scored]  # (B, S, d_model)
        else:  # only the scored queries need an output: the same numbers, less work
            a, weights = self.attn(x[:, self.scored], x, x, need_weights=False)  # (B, S, d_model), None
        y = self.norm(x[:, self.scored] + a)  # residual, then LayerNorm
        return self.readout(y), weights  # (B, S, num_classes)


@dataclass
class History:
    """What ``train`` recorded: the step numbers of the evaluations, the training loss at those
    steps (mean over the steps since the previous evaluation) and the evaluation accuracies."""

    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    exact: list[float] = field(default_factory=list)
    lookup: list[float] = field(default_factory=list)
    offset: list[float] = field(default_factory=list)

    def final(self) -> dict[str, float]:
        """The last evaluation: {'exact', 'lookup', 'offset'}."""
        return {"exact": self.exact[-1], "lookup": self.lookup[-1], "offset": self.offset[-1]}


@contextmanager
def fixed_threads(n: int = NUM_THREADS):
    """Run the body with ``torch.set_num_threads(n)``, then restore the previous setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def eval_batch(task: TwoRelationTask, size: int = 1000):
    """The fixed evaluation set: ``size`` sequences drawn with seed :data:`EVAL_SEED`."""
    return task.sample(size, generator=torch.Generator().manual_seed(EVAL_SEED))


@torch.no_grad()
def evaluate(model: TinyAttentionModel, batch) -> dict[str, float]:
    """Accuracies of ``model`` on ``batch``: {'exact', 'lookup', 'offset'} (see ``task.accuracy``).
    Runs on :data:`NUM_THREADS` threads, like training (deterministic, and fast on a busy CPU)."""
    was_training = model.training
    with fixed_threads():
        logits, _ = model.eval()(batch.keys, batch.values)
    model.train(was_training)
    return model.task.accuracy(logits, batch.target)


@torch.no_grad()
def attention_weights(model: TinyAttentionModel, batch) -> torch.Tensor:
    """The model's attention weights on ``batch``: (B, h, L, L), on :data:`NUM_THREADS` threads."""
    with fixed_threads():
        return model(batch.keys, batch.values, need_weights=True)[1]


def _replay_bar(arguments: dict) -> None:
    """What ``train`` shows of a run whose stored result is reused: its bar, full (run_cache)."""
    progress, steps = arguments["progress"], arguments["steps"]
    if progress is True:
        with progress_bar(total=steps, desc=f"h={arguments['num_heads']}, seed {arguments['seed']}") as bar:
            bar.update(steps)
    else:
        advance(progress, steps)


@cached_run(ignore=("progress",), seeds_itself=True, replay=_replay_bar)
def train(
    task: TwoRelationTask,
    num_heads: int,
    *,
    seed: int = 0,
    steps: int = 150,
    batch_size: int = 128,
    lr: float = 1e-2,
    d_model: int = 32,
    eval_every: int = 10,
    eval_size: int = 500,
    dtype: torch.dtype = torch.float64,
    progress: bool | tqdm = True,
) -> tuple[TinyAttentionModel, History]:
    """Train a fresh :class:`TinyAttentionModel` and return it with its :class:`History`.

    ``seed`` fixes the initial weights and the stream of training batches; the evaluation set is
    the same for every seed (:func:`eval_batch`). ``dtype``: the parameters' dtype (the initial
    values are drawn in float32 and converted, so they are the same numbers in every dtype).
    ``progress``: True shows a ``tqdm.auto`` bar,
    False none, or pass an open bar to advance it (one bar for several runs).
    The same arguments give bit-identical weights and history on the same machine.
    """
    with fixed_threads(), torch.random.fork_rng(devices=[]):  # leaves the caller's RNG state alone
        torch.manual_seed(seed)
        model = TinyAttentionModel(task, num_heads, d_model).to(dtype)
        batches = torch.Generator().manual_seed(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        test = eval_batch(task, eval_size)
        history = History()
        own_bar = progress is True
        bar = progress_bar(total=steps, desc=f"h={num_heads}, seed {seed}") if own_bar else progress
        losses = []
        for step in range(1, steps + 1):
            batch = task.sample(batch_size, generator=batches)
            logits, _ = model(batch.keys, batch.values)  # (B, S, C)
            loss = F.cross_entropy(logits.flatten(0, 1), batch.target.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if step % eval_every == 0 or step == steps:
                acc = evaluate(model, test)
                history.steps.append(step)
                history.loss.append(sum(losses) / len(losses))
                for key in ("exact", "lookup", "offset"):
                    getattr(history, key).append(acc[key])
                losses = []
            if bar is not False:
                bar.update(1)
        if own_bar:
            bar.close()
    return model.eval(), history


def per_sequence_loss(model: TinyAttentionModel, batch) -> torch.Tensor:
    """(B,) cross-entropy of each sequence (mean over its scored queries), with autograd on."""
    with torch.enable_grad(), fixed_threads():
        logits, _ = model(batch.keys, batch.values)  # (B, S, C)
        loss = F.cross_entropy(logits.transpose(1, 2), batch.target, reduction="none")  # (B, S)
        return loss.mean(dim=1)  # (B,)


def train_many(
    task: TwoRelationTask, heads: list[int], seeds: list[int], **kwargs
) -> dict[tuple[int, int], tuple[TinyAttentionModel, History]]:
    """``train`` for every (num_heads, seed), under one progress bar; returns {(h, seed): (model, history)}."""
    steps = kwargs.get("steps", 150)
    runs = {}
    with progress_bar(total=len(heads) * len(seeds) * steps, desc="training") as bar:
        for h in heads:
            for seed in seeds:
                bar.set_postfix_str(f"h={h}, seed {seed}", refresh=False)
                runs[h, seed] = train(task, h, seed=seed, progress=bar, **kwargs)
    return runs
