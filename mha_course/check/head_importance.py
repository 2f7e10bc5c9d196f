"""Checker for notebook 07's second exercise: a head's importance from the gradient of the loss
with respect to a gate on its output (Michel et al., 2019)."""

from __future__ import annotations

import functools

import torch

from ..attention import scaled_dot_product_attention
from ..heads import merge_heads, split_heads
from ..i18n import tr
from .framework import Case, CheckResult, mistakes, run_check, tensor_generator

__all__ = ["gradient_importance"]


class GatedLoss:
    """``loss_fn(gates) -> (B,)``: the squared error of each sequence of a fixed batch, through a
    random multi-head attention layer whose head i's output is multiplied by ``gates[b, i]``
    before W_O. ``silent`` heads have a zero block of W_O (their importance is exactly 0);
    ``loud`` heads have theirs multiplied by 5. The target is the layer's own output with head
    i gated at ``target_gates[i]`` (default 1), plus noise: a head whose target gate is above 1
    lowers every sequence's loss when its gate grows (a negative gradient).
    Autograd is on inside the call, whatever the caller's mode."""

    def __init__(self, g, B, h, *, d_head=3, L=4, silent=(), loud=(), target_gates=None):
        d = h * d_head
        self.B, self.h, self.silent, self.loud = B, h, tuple(silent), tuple(loud)
        self.x = torch.randn(B, L, d, generator=g, dtype=torch.float64)
        noise = torch.randn(B, L, d, generator=g, dtype=torch.float64)
        self.w_qkv = torch.randn(3, d, d, generator=g, dtype=torch.float64) / d**0.5
        w_o = torch.randn(d, d, generator=g, dtype=torch.float64) / d**0.5
        for i in self.silent:
            w_o[:, i * d_head : (i + 1) * d_head] = 0.0
        for i in self.loud:
            w_o[:, i * d_head : (i + 1) * d_head] *= 5.0
        self.w_o = w_o
        target_gates = torch.ones(h) if target_gates is None else torch.tensor(target_gates)
        self.target = self._layer(target_gates.to(torch.float64).expand(B, h)) + 0.5 * noise  # (B, L, d)

    def _layer(self, gates):
        q, k, v = (split_heads(self.x @ w.T, self.h) for w in self.w_qkv)  # (B, h, L, d_head)
        heads, _ = scaled_dot_product_attention(q, k, v)  # (B, h, L, d_head)
        heads = heads * gates.to(torch.float64)[:, :, None, None]  # gate ξ_{b,i} on head i
        return merge_heads(heads) @ self.w_o.T  # (B, L, d)

    def __call__(self, gates: torch.Tensor) -> torch.Tensor:
        if not isinstance(gates, torch.Tensor) or tuple(gates.shape) != (self.B, self.h):
            got = tuple(gates.shape) if isinstance(gates, torch.Tensor) else type(gates).__name__
            raise ValueError(f"loss_fn takes gates of shape (B, h) = ({self.B}, {self.h}), got {got}")
        with torch.enable_grad():
            return (self._layer(gates) - self.target).pow(2).mean(dim=(1, 2))  # (B,)

    def __repr__(self) -> str:
        notes = [f"head {i}: W_O block zero" for i in self.silent] + [f"head {i}: W_O block ×5" for i in self.loud]
        return f"<loss of a {self.h}-head layer on {self.B} sequences{'; ' if notes else ''}{'; '.join(notes)}>"


def _gradient(loss_fn, batch_size, num_heads, *, at=1.0, reduce="sum"):
    """(B, h): ∂ loss_b / ∂ξ_{b,i} at ξ = ``at`` (reduce="mean": of the batch's mean loss instead)."""
    gates = torch.full((batch_size, num_heads), at, dtype=torch.float64, requires_grad=True)
    with torch.enable_grad():
        losses = loss_fn(gates)
        total = losses.sum() if reduce == "sum" else losses.mean()
        (grad,) = torch.autograd.grad(total, gates)
    return grad


def _reference(loss_fn, batch_size, num_heads):
    return _gradient(loss_fn, batch_size, num_heads).abs().mean(dim=0)  # (h,): E_x |∂L(x)/∂ξ_h|


GRADIENT_IMPORTANCE_MISTAKES = mistakes(
    "gradient_importance",
    {
        "no absolute value": lambda f, B, h: _gradient(f, B, h).mean(dim=0),
        "absolute value after the mean": lambda f, B, h: _gradient(f, B, h).mean(dim=0).abs(),
        "gates at zero": lambda f, B, h: _gradient(f, B, h, at=0.0).abs().mean(dim=0),
        "gradient of the mean loss": lambda f, B, h: _gradient(f, B, h, reduce="mean").abs().mean(dim=0),
        "summed over sequences": lambda f, B, h: _gradient(f, B, h).abs().sum(dim=0),
    },
)


def _cases() -> list[Case]:
    g = tensor_generator()
    return [
        Case(
            (GatedLoss(g, 6, 3, silent=[1], target_gates=[1.0, 1.0, 1.8]), 6, 3),
            description="6 sequences, 3 heads, head 1 silent",
        ),
        Case(
            (GatedLoss(g, 5, 4, silent=[0, 3], loud=[2]), 5, 4),
            description="4 heads, heads 0 and 3 silent, head 2 loud",
        ),
        Case((GatedLoss(g, 3, 2, d_head=4, L=6), 3, 2), description="2 heads of width 4, 6 positions"),
        Case((GatedLoss(g, 1, 2), 1, 2), description="a single sequence"),
    ]


def _with_grad(fn):
    """The learner's function with autograd on (the check runner turns it off)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.enable_grad():
            return fn(*args, **kwargs)

    return wrapper if callable(fn) else fn


def gradient_importance(fn) -> CheckResult:
    """Check ``fn(loss_fn, batch_size, num_heads) -> (h,)``: each head's importance
    E_x |∂L(x)/∂ξ_h|, the mean over the batch's sequences of the absolute derivative of that
    sequence's loss with respect to a gate ξ_h on head h's output, at ξ = 1 (the model as it is).

    ``loss_fn(gates)`` takes gates of shape (batch_size, num_heads), one per sequence and head,
    and returns the (batch_size,) per-sequence losses. The cases' layers have heads whose block
    of W_O is zero (importance exactly 0) and heads whose block is five times larger.
    """
    return run_check(
        "gradient_importance",
        _with_grad(fn),
        _cases(),
        _reference,
        GRADIENT_IMPORTANCE_MISTAKES,
        arg_names=("loss_fn", "batch_size", "num_heads"),
        output_label=tr("importance", "label"),
    )
