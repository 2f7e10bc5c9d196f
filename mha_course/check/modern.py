"""Checkers for notebook 15's modern attention layers: Gemma 2's soft-capped scores (scale, cap,
mask, in that order) and Qwen3-Next's gated output (each head times the sigmoid of its own gate,
before the output projection)."""

from __future__ import annotations

import torch

from .framework import Case, CheckResult, mistakes, run_check, tensor_generator

__all__ = ["softcap_scores", "gated_output"]


# ---------------------------------------------------------------------------------------------
# soft-capped scores


def _raw(q, k):
    return q @ k.transpose(-2, -1)  # (B, h, Lq, Lk)


def _cap(s, c):
    return c * torch.tanh(s / c)


def _blocked(s, mask):
    return s.masked_fill(~mask, float("-inf"))


def _softcap_reference(q, k, mask, softcap, scale):
    return _blocked(_cap(_raw(q, k) * scale, softcap), mask)


SOFTCAP_SCORES_MISTAKES = mistakes(
    "softcap_scores",
    {
        "cap after mask": lambda q, k, mask, c, scale: _cap(_blocked(_raw(q, k) * scale, mask), c),
        "scale after cap": lambda q, k, mask, c, scale: _blocked(_cap(_raw(q, k), c) * scale, mask),
        "tanh not divided": lambda q, k, mask, c, scale: _blocked(c * torch.tanh(_raw(q, k) * scale), mask),
        "hard clamp": lambda q, k, mask, c, scale: _blocked((_raw(q, k) * scale).clamp(-c, c), mask),
        "no cap": lambda q, k, mask, c, scale: _blocked(_raw(q, k) * scale, mask),
        "zero at blocked keys": lambda q, k, mask, c, scale: _cap(_raw(q, k) * scale, c).masked_fill(~mask, 0.0),
    },
)


def softcap_scores(fn) -> CheckResult:
    """Check ``fn(q, k, mask, softcap, scale) -> scores``: q (B, h, Lq, d), k (B, h, Lk, d), mask bool
    broadcastable to (B, h, Lq, Lk) (True = may attend); the scores (B, h, Lq, Lk) Gemma 2 hands to
    its softmax: softcap · tanh(q·k · scale / softcap), then −inf at every blocked key."""
    g = tensor_generator()

    def qk(B, h, Lq, Lk, d, spread):
        return spread * torch.randn(B, h, Lq, d, generator=g), spread * torch.randn(B, h, Lk, d, generator=g)

    def causal(Lq, Lk):
        return torch.ones(Lq, Lk, dtype=torch.bool).tril(diagonal=Lk - Lq)

    specs = [  # (q, k, mask, softcap, scale, description)
        (*qk(1, 2, 4, 4, 8, 3.0), causal(4, 4), 2.0, 8**-0.5, "causal, cap 2, scale 1/√8"),
        (*qk(2, 1, 3, 5, 4, 4.0), torch.ones(3, 5, dtype=torch.bool), 3.0, 0.5, "no key blocked, scale 0.5"),
        (*qk(1, 3, 2, 6, 16, 2.0), causal(2, 6), 50.0, 24**-0.5, "Gemma 2's cap 50, scale 24^-1/2"),
        (*qk(2, 2, 5, 5, 8, 6.0), causal(5, 5), 1.5, 8**-0.5, "large scores, a tight cap"),
        (
            *qk(1, 1, 3, 4, 4, 2.0),
            torch.tensor([[True, False, True, True]]).expand(3, 4),
            4.0,
            1.0,
            "a padded key blocked for every query",
        ),
    ]
    cases = [Case((q, k, m, c, s), description=text) for q, k, m, c, s, text in specs]
    return run_check(
        "softcap_scores",
        fn,
        cases,
        _softcap_reference,
        SOFTCAP_SCORES_MISTAKES,
        arg_names=("q", "k", "mask", "softcap", "scale"),
        output_label="scores",
    )


# ---------------------------------------------------------------------------------------------
# the gated output


def _gate_of(q_and_gate, h, d):
    B, L, _ = q_and_gate.shape
    return q_and_gate.view(B, L, h, 2 * d)[..., d:]  # (B, L, h, d)


def _merge(head_outputs):
    B, h, L, d = head_outputs.shape
    return head_outputs.transpose(1, 2).reshape(B, L, h * d)  # (B, L, h*d)


def _gated_reference(head_outputs, q_and_gate, o_proj_weight):
    B, h, L, d = head_outputs.shape
    gate = torch.sigmoid(_gate_of(q_and_gate, h, d)).reshape(B, L, h * d)
    return (_merge(head_outputs) * gate) @ o_proj_weight.T


def _with_gate(gate_fn):
    """A wrong gate (B, L, h*d) from (q_and_gate, h, d), applied where the right one goes."""

    def wrong(head_outputs, q_and_gate, o_proj_weight):
        B, h, L, d = head_outputs.shape
        return (_merge(head_outputs) * gate_fn(q_and_gate, h, d)) @ o_proj_weight.T

    return wrong


def _after_o_proj(head_outputs, q_and_gate, o_proj_weight):
    B, h, L, d = head_outputs.shape
    gate = torch.sigmoid(_gate_of(q_and_gate, h, d)).reshape(B, L, h * d)
    return (_merge(head_outputs) @ o_proj_weight.T) * gate  # needs d_model = h*d


GATED_OUTPUT_MISTAKES = mistakes(
    "gated_output",
    {
        "sigmoid missing": _with_gate(lambda qg, h, d: _gate_of(qg, h, d).reshape(*qg.shape[:2], h * d)),
        "query half used": _with_gate(
            lambda qg, h, d: torch.sigmoid(qg.view(*qg.shape[:2], h, 2 * d)[..., :d]).reshape(*qg.shape[:2], h * d)
        ),
        "gate as second half": _with_gate(lambda qg, h, d: torch.sigmoid(qg[..., h * d :])),
        "one gate for all heads": _with_gate(
            lambda qg, h, d: (
                torch.sigmoid(_gate_of(qg, h, d)[:, :, :1]).expand(-1, -1, h, -1).reshape(*qg.shape[:2], h * d)
            )
        ),
        "gate after o_proj": _after_o_proj,
    },
)


def gated_output(fn) -> CheckResult:
    """Check ``fn(head_outputs, q_and_gate, o_proj_weight) -> out``: head_outputs (B, h, L, d),
    q_and_gate (B, L, h·2·d) with each head's slice [query | gate] (Qwen3-Next's q_proj),
    o_proj_weight (d_model, h·d); out (B, L, d_model) = o_proj(merged heads · sigmoid(gate))."""
    g = tensor_generator()

    def case(B, h, L, d, d_model, text):
        heads = torch.randn(B, h, L, d, generator=g)
        q_and_gate = 2 * torch.randn(B, L, h * 2 * d, generator=g)
        weight = torch.randn(d_model, h * d, generator=g) / (h * d) ** 0.5
        return Case((heads, q_and_gate, weight), description=text)

    cases = [
        case(1, 2, 3, 4, 8, "2 heads of 4, d_model 8"),
        case(2, 3, 4, 2, 6, "3 heads of 2, batch 2"),
        case(1, 4, 5, 4, 16, "4 heads of 4"),
        case(2, 2, 1, 8, 16, "one position (decoding)"),
    ]
    return run_check(
        "gated_output",
        fn,
        cases,
        _gated_reference,
        GATED_OUTPUT_MISTAKES,
        arg_names=("head_outputs", "q_and_gate", "o_proj_weight"),
        output_label="out",
    )
