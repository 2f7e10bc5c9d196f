"""Checker for repeat_kv, the head sharing of grouped-query attention."""

from __future__ import annotations

import torch

from .. import gqa as _gqa
from ..i18n import translate
from .framework import Case, CheckResult, Mistake, mistakes, run_check, tensor_generator

__all__ = ["repeat_kv"]


# English here (a mistake's diagnosis is made at import); the catalogue's "diagnosis repeat_kv …"
# entries translate them when a verdict is shown
_WRONG_DIM = {
    "batch": translate(
        "repeated along dim 0 (batch) instead of the head dim 1: the result is (B, h_kv·n_rep, L, d) — "
        "use repeat_interleave(x, n_rep, dim=1)",
        "diagnosis repeat_kv dim 0",
        lang="en",
    ),
    "positions": translate(
        "repeated along dim 2 (positions) instead of the head dim 1: the result is (B, h_kv·n_rep, L, d) — "
        "use repeat_interleave(x, n_rep, dim=1)",
        "diagnosis repeat_kv dim 2",
        lang="en",
    ),
    "features": translate(
        "repeated along dim 3 (features) instead of the head dim 1: the result is (B, h_kv·n_rep, L, d) — "
        "use repeat_interleave(x, n_rep, dim=1)",
        "diagnosis repeat_kv dim 3",
        lang="en",
    ),
}
REPEAT_KV_MISTAKES = mistakes(
    "repeat_kv",
    {
        "repeat": lambda x, n: x.repeat(1, n, 1, 1),
    },
) + [
    *(
        Mistake(f"dim {dim}", lambda x, n, dim=dim: x.repeat_interleave(n, dim=dim), _WRONG_DIM[what])
        for dim, what in ((0, "batch"), (2, "positions"), (3, "features"))
    ),
    *(
        Mistake(
            f"repeat dim {dim}",
            lambda x, n, dim=dim: x.repeat(*[n if i == dim else 1 for i in range(4)]),
            _WRONG_DIM[what],
        )
        for dim, what in ((0, "batch"), (2, "positions"), (3, "features"))
    ),
]


def repeat_kv(fn) -> CheckResult:
    """Check ``fn(x, n_rep)``: (B, h_kv, L, d) -> (B, h_kv·n_rep, L, d), so that query head i
    reads KV head i // n_rep (each KV head repeated n_rep times in a row, like
    ``torch.repeat_interleave(x, n_rep, dim=1)``)."""
    g = tensor_generator()
    shapes = [  # (B, h_kv, L, d, n_rep)
        (2, 2, 5, 3, 3, "2 KV heads × 3"),
        (1, 4, 3, 2, 2, "4 KV heads × 2"),
        (2, 1, 4, 4, 4, "one KV head (MQA)"),
        (1, 3, 2, 5, 1, "n_rep = 1 (MHA)"),
    ]
    cases = [Case((torch.randn(B, h, L, d, generator=g), n), description=t) for B, h, L, d, n, t in shapes]
    return run_check(
        "repeat_kv", fn, cases, _gqa.repeat_kv, REPEAT_KV_MISTAKES, arg_names=("x", "n_rep"), output_label="output"
    )
