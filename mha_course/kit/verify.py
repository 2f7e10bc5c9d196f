"""The one-line verdicts with which the notebooks prove two computations equal.

Every "proven equal" statement in the course prints through :func:`proof_line`, so that the
committed outputs do not depend on the CPU they were produced on: the exact rounding error of a
float computation differs between machines (and BLAS builds), the bound it stays under does not.
Each verdict's glyph carries its word ("✅ passed", "❌ failed"), so a machine without an emoji
font still shows it; :func:`mark` gives the pair for a notebook's own checks.
"""

from __future__ import annotations

import torch

__all__ = ["mark", "proof_line"]


def mark(ok: bool) -> str:
    """``"✅ passed"`` if ``ok`` else ``"❌ failed"``: a verdict glyph with its word."""
    return "✅ passed" if ok else "❌ failed"


def proof_line(
    claim: str, got: torch.Tensor, expected: torch.Tensor, *, bound: float = 1e-6, exact: bool = False
) -> str:
    """``✅ passed · claim: max abs error < 1e-06`` when ``got`` and ``expected`` (same shape) agree
    within ``bound``, else ``❌ failed · claim: max abs error 2.50e-01 (bound 1e-06)``.

    The bound, not the exact rounding error, is printed on success. With ``exact=True`` (pure
    data movement: views, copies, weight transfers) the claim is bitwise equality instead.
    """
    if got.shape != expected.shape:
        return f"{mark(False)} · {claim}: shapes differ, {tuple(got.shape)} vs {tuple(expected.shape)}"
    if exact:
        if torch.equal(got, expected):
            return f"{mark(True)} · {claim}: bitwise identical"
        error = (got.detach().double() - expected.detach().double()).abs().max().item()
        return f"{mark(False)} · {claim}: not bitwise identical (max abs error {error:.2e})"
    error = (got.detach().double() - expected.detach().double()).abs().max().item() if got.numel() else 0.0
    if error < bound:  # False for NaN: a NaN never passes
        return f"{mark(True)} · {claim}: max abs error < {bound:.0e}"
    return f"{mark(False)} · {claim}: max abs error {error:.2e} (bound {bound:.0e})"
