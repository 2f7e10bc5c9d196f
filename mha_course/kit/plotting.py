"""Figures the notebooks share: attention heatmaps with token labels, titles and colour bars."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

#: the Chinese of the figures: a subset of Noto Sans CJK SC (SIL Open Font License 1.1, see
#: fonts/LICENSE.txt) to exactly the characters the figures use, made by
#: ``python -m authoring translate --font PATH``
CJK_FONT = "fonts/cjk-subset.otf"


def use_cjk_font() -> str | None:
    """Draw figures in the course's language: register the shipped CJK font as the fallback after
    DejaVu Sans (so Chinese shows on a machine without a CJK font) and translate each title, axis
    label, legend entry and annotation as it is set (mha_course.i18n.figure_text). Returns the
    font's family name (None when the font is not there)."""
    from importlib import resources

    import matplotlib
    from matplotlib import font_manager
    from matplotlib.text import Text

    from .. import i18n

    name = None
    path = resources.files("mha_course.kit").joinpath("fonts").joinpath(CJK_FONT.split("/")[-1])
    if path.is_file():
        font_manager.fontManager.addfont(str(path))
        name = font_manager.FontProperties(fname=str(path)).get_name()
        matplotlib.rcParams["font.family"] = ["DejaVu Sans", name]
    if not getattr(Text.set_text, "_mha_course", False):
        original = Text.set_text

        def set_text(self, s):
            if isinstance(s, str):
                s = i18n.figure_text(s)
            return original(self, s)

        set_text._mha_course = True
        Text.set_text = set_text
    return name


def heatmap(
    matrix,
    *,
    row_labels=None,
    col_labels=None,
    title: str,
    xlabel: str = "key position",
    ylabel: str = "query position",
    ax=None,
    annotate: bool | None = None,
    cmap: str = "viridis",
    vmin=None,
    vmax=None,
    colorbar: bool = True,
    fmt: str = "{:.2f}",
):
    """Draw a 2-D matrix (e.g. attention weights (Lq, Lk)) as a labelled heatmap; returns the Axes.

    ``annotate`` writes each value in its cell (default: when the matrix is at most 8×8).
    """
    m = (
        matrix.detach().float().cpu()
        if isinstance(matrix, torch.Tensor)
        else torch.as_tensor(matrix, dtype=torch.float32)
    )
    if m.dim() != 2:
        raise ValueError(f"matrix must be 2-D, got shape {tuple(m.shape)}")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.5 * m.shape[1] + 2.5, 0.45 * m.shape[0] + 1.8))
    im = ax.imshow(m.numpy(), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    for labels, set_ticks, set_labels, n, rot in (
        (col_labels, ax.set_xticks, ax.set_xticklabels, m.shape[1], 45),
        (row_labels, ax.set_yticks, ax.set_yticklabels, m.shape[0], 0),
    ):
        if labels is not None:
            if len(labels) != n:
                raise ValueError(f"got {len(labels)} labels for an axis of size {n}")
            set_ticks(range(n))
            set_labels(labels, rotation=rot, ha="right" if rot else "right")
    if annotate is None:
        annotate = m.shape[0] <= 8 and m.shape[1] <= 8
    if annotate:
        mid = (m.max() + m.min()) / 2
        for i in range(m.shape[0]):
            for j in range(m.shape[1]):
                ax.text(
                    j,
                    i,
                    fmt.format(m[i, j].item()),
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="black" if m[i, j] > mid else "white",
                )
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return ax


def show(fig) -> None:
    """Display a figure once (as a PNG) and close it, so no figure repr text is left behind."""
    from IPython.display import display

    display(fig)
    plt.close(fig)
