"""Context extension on a laptop (notebook 11): a tiny retrieval model trained at one length,
evaluated at 1-4x that length with plain RoPE, position interpolation, YaRN, and with ALiBi.

The task. A sequence of ``length - 1`` items, each a (key, value) pair of tokens, then a query
naming one key; the answer is that key's value. The queried key occurs exactly once, anywhere::

    items   (k_0, v_0) (k_1, v_1) … (k_{n-1}, v_{n-1})   query k*    ->   v_j where k_j = k*

The model. One attention layer, the query's row only (it is the one that answers)::

    x = key_embed[k] + value_embed[v]   for the items,   x_q = query_embed[k*]     (B, L, d)
    q = W_Q x_q, k = W_K x, v = W_V x; RoPE on q (at position L - 1) and k (at 0 … L - 1),
    or ALiBi's bias on the scores; out = W_O · attention                           (B, d)
    logits = readout(x_q + out)                                                    (B, num_values)

Nothing but attention reaches the items, so the answer is only as good as the query's look-up
at distances it never saw in training. The RoPE model is trained once with plain RoPE and then
evaluated as it is, with position interpolation (``rope_type="linear"``, factor = eval/train
length) and with YaRN (factor the same, original context = the training length), without any
fine-tuning; the ALiBi model is trained with ALiBi. Training runs in float64 with one thread
(see :mod:`.tiny_training`): the printed accuracies are then the same on every CPU.

``python -m mha_course.lessons.rope_extension`` runs the full sweep (more training runs, longer
training).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import positions as P
from ..kit.progress import progress_bar
from .tiny_training import fixed_threads as single_thread

METHODS = ("RoPE", "interpolation", "YaRN", "ALiBi")
#: two-sided 97.5% quantiles of Student's t for n - 1 degrees of freedom (n = 2 … 10 seeds)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


@dataclass(frozen=True)
class Setup:
    """One experiment's configuration (the notebook's small run and the CLI's full sweep)."""

    train_length: int = 32
    eval_factors: tuple = (1, 2, 4)
    num_keys: int = 32
    num_values: int = 8
    d_model: int = 32
    num_heads: int = 2
    theta: float = 10000.0
    steps: int = 200
    batch: int = 32
    lr: float = 1e-2
    eval_batch: int = 500
    seeds: tuple = (0, 1, 2)


def retrieval_batch(batch: int, length: int, *, num_keys: int, num_values: int, generator) -> tuple:
    """One batch of the task: keys, values (B, length - 1) integers, query (B,), answer (B,).
    The queried key sits at a uniformly drawn position; every other item's key differs from it."""
    n = length - 1
    query = torch.randint(0, num_keys, (batch,), generator=generator)  # (B,)
    others = torch.randint(0, num_keys - 1, (batch, n), generator=generator)  # (B, n)
    keys = others + (others >= query[:, None]).long()  # (B, n) never equal to the query
    where = torch.randint(0, n, (batch,), generator=generator)  # (B,) the answer's position
    keys[torch.arange(batch), where] = query
    values = torch.randint(0, num_values, (batch, n), generator=generator)  # (B, n)
    return keys, values, query, values[torch.arange(batch), where]


class RetrievalModel(nn.Module):
    """Embeddings, one attention layer (``scheme`` "RoPE" or "ALiBi") read at the query, a readout.
    ``forward(keys, values, query, *, scaling=None)`` -> logits (B, num_values); ``scaling``: a
    RoPE context-extension dict (:func:`mha_course.positions.rope_frequencies`)."""

    def __init__(self, scheme: str, s: Setup):
        super().__init__()
        if scheme not in ("RoPE", "ALiBi"):
            raise ValueError(f"scheme must be 'RoPE' or 'ALiBi', got {scheme!r}")
        self.scheme, self.h, self.hd, self.theta = scheme, s.num_heads, s.d_model // s.num_heads, s.theta
        self.key_embed = nn.Embedding(s.num_keys, s.d_model)
        self.value_embed = nn.Embedding(s.num_values, s.d_model)
        self.query_embed = nn.Embedding(s.num_keys, s.d_model)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(s.d_model, s.d_model, bias=False) for _ in range(4)
        )
        self.readout = nn.Linear(s.d_model, s.num_values)

    def forward(self, keys, values, query, *, scaling=None) -> torch.Tensor:
        x_q = self.query_embed(query)[:, None]  # (B, 1, d)
        x = torch.cat([self.key_embed(keys) + self.value_embed(values), x_q], dim=1)  # (B, L, d)
        L = x.shape[1]
        q = self.q_proj(x_q).unflatten(-1, (self.h, self.hd)).transpose(1, 2)  # (B, h, 1, hd)
        k = self.k_proj(x).unflatten(-1, (self.h, self.hd)).transpose(1, 2)  # (B, h, L, hd)
        v = self.v_proj(x).unflatten(-1, (self.h, self.hd)).transpose(1, 2)  # (B, h, L, hd)
        bias = 0.0
        if self.scheme == "RoPE":
            q = P.apply_rope(q, torch.tensor([L - 1]), theta=self.theta, scaling=scaling)
            k = P.apply_rope(k, torch.arange(L), theta=self.theta, scaling=scaling)
        else:
            bias = P.alibi_bias(self.h, 1, L).to(x.dtype)  # (h, 1, L): the last row, nothing masked
        weights = (q @ k.transpose(-1, -2) / math.sqrt(self.hd) + bias).softmax(-1)  # (B, h, 1, L)
        out = self.o_proj((weights @ v).transpose(1, 2).flatten(2))  # (B, 1, d)
        return self.readout(x_q + out)[:, 0]  # (B, num_values)


def train(scheme: str, s: Setup, seed: int, *, progress=None) -> RetrievalModel:
    """Train one model at ``s.train_length`` (float64, one thread, Adam, fresh batches)."""
    with single_thread():
        torch.manual_seed(seed)
        model = RetrievalModel(scheme, s).double()
        opt = torch.optim.Adam(model.parameters(), lr=s.lr)
        g = torch.Generator().manual_seed(1000 + seed)
        for _ in range(s.steps):
            keys, values, query, answer = retrieval_batch(
                s.batch, s.train_length, num_keys=s.num_keys, num_values=s.num_values, generator=g
            )
            loss = F.cross_entropy(model(keys, values, query), answer)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if progress is not None:
                progress.update(1)
    return model.eval()


def scaling_for(method: str, factor: float, train_length: int):
    """The rope_scaling dict of a method at a given length factor (None: plain RoPE or ALiBi)."""
    if method in ("RoPE", "ALiBi") or factor == 1:
        return None
    if method == "interpolation":
        return {"rope_type": "linear", "factor": float(factor)}
    return {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": train_length}


@torch.no_grad()
def accuracy(model: RetrievalModel, s: Setup, length: int, scaling=None, *, seed: int = 12345) -> float:
    """Share of ``s.eval_batch`` fresh sequences of ``length`` answered right."""
    g = torch.Generator().manual_seed(seed + length)
    keys, values, query, answer = retrieval_batch(
        s.eval_batch, length, num_keys=s.num_keys, num_values=s.num_values, generator=g
    )
    with single_thread():
        return (model(keys, values, query, scaling=scaling).argmax(-1) == answer).double().mean().item()


def run(s: Setup = Setup(), *, progress: bool = True) -> dict:
    """Train one RoPE and one ALiBi model per seed (one training run each); evaluate every
    method at every length. Returns {(method, factor): [accuracy per run]}."""
    results = {(m, f): [] for m in METHODS for f in s.eval_factors}
    bar = progress_bar(total=2 * s.steps * len(s.seeds), desc="training", disable=not progress)
    for seed in s.seeds:
        models = {scheme: train(scheme, s, seed, progress=bar) for scheme in ("RoPE", "ALiBi")}
        for m in METHODS:
            for f in s.eval_factors:
                model = models["ALiBi" if m == "ALiBi" else "RoPE"]
                scaling = scaling_for(m, f, s.train_length)
                results[(m, f)].append(accuracy(model, s, s.train_length * f, scaling))
    bar.close()
    return results


def interval(values) -> tuple[float, float, float]:
    """Mean and the 95% Student-t interval of the mean over training runs, clipped to [0, 1]."""
    x = torch.tensor(values, dtype=torch.float64)
    mean = x.mean().item()
    if len(x) < 2:
        return mean, mean, mean
    half = T975[len(x) - 1] * x.std().item() / math.sqrt(len(x))
    return mean, max(mean - half, 0.0), min(mean + half, 1.0)


def table(results: dict, s: Setup) -> str:
    """The results as text: one row per method, one column per eval length, mean [95% interval]."""
    head = f"{'method':<14}" + "".join(f"{f'L = {s.train_length * f} ({f}x)':>22}" for f in s.eval_factors)
    rows = [head]
    for m in METHODS:
        cells = []
        for f in s.eval_factors:
            mean, lo, hi = interval(results[(m, f)])
            cells.append(f"{mean:.2f} [{lo:.2f}, {hi:.2f}]".rjust(22))
        rows.append(f"{m:<14}" + "".join(cells))
    return "\n".join(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Retrieval accuracy beyond the training length, per method.")
    parser.add_argument("--seeds", type=int, default=10, help="training runs per scheme (default 10)")
    parser.add_argument("--steps", type=int, default=400, help="training steps per model (default 400)")
    parser.add_argument("--eval-batch", type=int, default=2000, help="test sequences per length (default 2000)")
    args = parser.parse_args(argv)
    s = Setup(steps=args.steps, seeds=tuple(range(args.seeds)), eval_batch=args.eval_batch)
    results = run(s)
    print(f"trained at L = {s.train_length}, {args.steps} steps, {args.seeds} runs; accuracy, mean [95% CI]")
    print(table(results, s))


if __name__ == "__main__":
    main()
