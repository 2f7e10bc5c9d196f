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

A second task needs local order, which the retrieval task (key and value fused into one item)
cannot test: random tokens, and at every position the answer is the token one position back
(:class:`LocalOrderModel`, one causal RoPE layer, :func:`run_local`). It is evaluated the same way,
with plain RoPE, interpolation, dynamic NTK (:func:`dynamic_ntk_theta`) and YaRN.

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
from ..kit.run_cache import advance, cached_run
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


@cached_run(ignore=("progress",), seeds_itself=True, replay=lambda a: advance(a["progress"], a["s"].steps))
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


# --- A task that needs local order: name the token one position back ----------------------------
#
# A sequence of random tokens; at every position t >= 1 the answer is the token at t - 1:
#
#     x_0 x_1 x_2 … x_{L-1}   ->   at t: x_{t-1}
#
# One causal RoPE attention layer must put its weight on offset 1 and not on 0 (the token itself,
# also in the residual) or 2: neighbouring positions must stay distinguishable. Only the fast
# pairs tell offsets 0, 1 and 2 apart, which is what interpolation slows and YaRN keeps.

LOCAL_METHODS = ("RoPE", "interpolation", "dynamic NTK", "YaRN")


@dataclass(frozen=True)
class LocalSetup:
    """The local-order experiment's configuration (trained at ``train_length`` tokens)."""

    train_length: int = 32
    eval_factors: tuple = (1, 2, 4)
    vocab: int = 16
    d_model: int = 32
    num_heads: int = 2
    theta: float = 10000.0
    steps: int = 100
    batch: int = 16
    lr: float = 1e-2
    eval_batch: int = 100
    seeds: tuple = (0, 1, 2)


def dynamic_ntk_theta(theta: float, head_dim: int, length: int, original_length: int, factor: float = 1.0) -> float:
    """Dynamic NTK scaling (transformers' ``rope_type="dynamic"``): plain RoPE with the base
    theta · (factor · length / original_length − factor + 1)^(d/(d−2)) once ``length`` exceeds
    ``original_length`` (theta itself up to it)."""
    if not (isinstance(length, int) and isinstance(original_length, int) and original_length > 0 and length > 0):
        raise ValueError(
            f"length and original_length must be positive integers, got length={length!r}, "
            f"original_length={original_length!r}"
        )
    if head_dim <= 2 or head_dim % 2:
        raise ValueError(f"head_dim must be even and > 2, got {head_dim!r}")
    if length <= original_length:
        return float(theta)
    return float(theta * (factor * length / original_length - (factor - 1)) ** (head_dim / (head_dim - 2)))


class LocalOrderModel(nn.Module):
    """Token embeddings, one causal RoPE attention layer with a residual, a readout at every
    position. ``forward(tokens, *, scaling=None, theta=None)`` -> logits (B, L, vocab);
    ``scaling``: a rope_scaling dict, ``theta``: the base for this call (dynamic NTK)."""

    def __init__(self, s: LocalSetup):
        super().__init__()
        self.h, self.hd, self.theta = s.num_heads, s.d_model // s.num_heads, s.theta
        self.embed = nn.Embedding(s.vocab, s.d_model)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(s.d_model, s.d_model, bias=False) for _ in range(4)
        )
        self.readout = nn.Linear(s.d_model, s.vocab)

    def forward(self, tokens, *, scaling=None, theta=None) -> torch.Tensor:
        theta = self.theta if theta is None else theta
        x = self.embed(tokens)  # (B, L, d)
        L = x.shape[1]
        pos = torch.arange(L)  # (L,)
        q, k, v = (
            proj(x).unflatten(-1, (self.h, self.hd)).transpose(1, 2) for proj in (self.q_proj, self.k_proj, self.v_proj)
        )  # each (B, h, L, hd)
        q = P.apply_rope(q, pos, theta=theta, scaling=scaling)
        k = P.apply_rope(k, pos, theta=theta, scaling=scaling)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.hd)  # (B, h, L, L)
        scores = scores.masked_fill(pos[None, :] > pos[:, None], float("-inf"))  # causal
        out = self.o_proj((scores.softmax(-1) @ v).transpose(1, 2).flatten(2))  # (B, L, d)
        return self.readout(x + out)  # (B, L, vocab)


def _local_loss_terms(model, tokens, **kw):
    logits = model(tokens, **kw)[:, 1:]  # (B, L-1, vocab): positions 1 … L-1
    return logits, tokens[:, :-1]  # the answers: one position back


@cached_run(ignore=("progress",), seeds_itself=True, replay=lambda a: advance(a["progress"], a["s"].steps))
def train_local(s: LocalSetup, seed: int, *, progress=None) -> LocalOrderModel:
    """Train one model at ``s.train_length`` with plain RoPE (float64, one thread, Adam)."""
    with single_thread():
        torch.manual_seed(seed)
        model = LocalOrderModel(s).double()
        opt = torch.optim.Adam(model.parameters(), lr=s.lr)
        g = torch.Generator().manual_seed(2000 + seed)
        for _ in range(s.steps):
            tokens = torch.randint(0, s.vocab, (s.batch, s.train_length), generator=g)
            logits, answer = _local_loss_terms(model, tokens)
            loss = F.cross_entropy(logits.flatten(0, 1), answer.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            if progress is not None:
                progress.update(1)
    return model.eval()


def local_method(method: str, s: LocalSetup, length: int) -> dict:
    """The keyword arguments of LocalOrderModel.forward for ``method`` at ``length`` tokens."""
    if method not in LOCAL_METHODS:
        raise ValueError(f"method must be one of {LOCAL_METHODS}, got {method!r}")
    if method == "dynamic NTK":
        return {"theta": dynamic_ntk_theta(s.theta, s.d_model // s.num_heads, length, s.train_length)}
    if method == "RoPE" or length <= s.train_length:
        return {}
    return {"scaling": scaling_for(method, length / s.train_length, s.train_length)}


@torch.no_grad()
def local_accuracy(model: LocalOrderModel, s: LocalSetup, factor: int, method: str, *, seed: int = 54321) -> float:
    """Share of positions 1 … L-1 (L = factor · s.train_length) of ``s.eval_batch`` fresh
    sequences whose token one back the model names, run with ``method`` (one of LOCAL_METHODS)."""
    length = s.train_length * factor
    g = torch.Generator().manual_seed(seed + length)
    tokens = torch.randint(0, s.vocab, (s.eval_batch, length), generator=g)
    with single_thread():
        logits, answer = _local_loss_terms(model, tokens, **local_method(method, s, length))
        return (logits.argmax(-1) == answer).double().mean().item()


def run_local(s: LocalSetup = LocalSetup(), *, progress: bool = True) -> dict:
    """Train one RoPE model per seed; evaluate every method of LOCAL_METHODS at every length.
    Returns {(method, factor): [accuracy per run]}."""
    results = {(m, f): [] for m in LOCAL_METHODS for f in s.eval_factors}
    bar = progress_bar(total=s.steps * len(s.seeds), desc="training", disable=not progress)
    for seed in s.seeds:
        model = train_local(s, seed, progress=bar)
        for m in LOCAL_METHODS:
            for f in s.eval_factors:
                results[(m, f)].append(local_accuracy(model, s, f, m))
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


def table(results: dict, s: Setup, methods: tuple = METHODS) -> str:
    """The results as text: one row per method (``methods``: METHODS or LOCAL_METHODS), one column
    per eval length, mean [95% interval]."""
    head = f"{'method':<14}" + "".join(f"{f'L = {s.train_length * f} ({f}x)':>22}" for f in s.eval_factors)
    rows = [head]
    for m in methods:
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
