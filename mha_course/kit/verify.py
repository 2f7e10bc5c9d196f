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
    from ..i18n import translate

    return f"✅ {translate('passed', 'status')}" if ok else f"❌ {translate('failed', 'status')}"


def proof_line(
    claim: str, got: torch.Tensor, expected: torch.Tensor, *, bound: float = 1e-6, exact: bool = False
) -> str:
    """``✅ passed · claim: max abs error < 1e-06`` when ``got`` and ``expected`` (same shape) agree
    within ``bound``, else ``❌ failed · claim: max abs error 2.50e-01 (bound 1e-06)``.

    The bound, not the exact rounding error, is printed on success. With ``exact=True`` (pure
    data movement: views, copies, weight transfers) the claim is bitwise equality instead.
    """
    from ..i18n import tr

    if got.shape != expected.shape:
        shapes = tr("shapes differ, {a} vs {b}", "proof", a=tuple(got.shape), b=tuple(expected.shape))
        return f"{mark(False)} · {claim}: {shapes}"
    if exact:
        if torch.equal(got, expected):
            return f"{mark(True)} · {claim}: {tr('bitwise identical', 'proof')}"
        error = (got.detach().double() - expected.detach().double()).abs().max().item()
        words = tr("not bitwise identical (max abs error {error})", "proof", error=f"{error:.2e}")
        return f"{mark(False)} · {claim}: {words}"
    error = (got.detach().double() - expected.detach().double()).abs().max().item() if got.numel() else 0.0
    if error < bound:  # False for NaN: a NaN never passes
        return f"{mark(True)} · {claim}: {tr('max abs error < {bound}', 'proof', bound=f'{bound:.0e}')}"
    words = tr("max abs error {error} (bound {bound})", "proof", error=f"{error:.2e}", bound=f"{bound:.0e}")
    return f"{mark(False)} · {claim}: {words}"
