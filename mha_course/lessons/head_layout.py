"""Tools for looking inside the batched implementation (notebook 04): where every feature of
every token lands when a (B, L, d_model) tensor is split into heads — the right way and the
classic wrong reshape —, which PyTorch kernels a call actually runs, and a small timer.

The maps are computed by applying the reshapes themselves to a tensor of element indices, so
they show exactly what ``view``/``transpose`` do to memory, not a formula about them.
"""

from __future__ import annotations

from collections.abc import Callable

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.ticker import MaxNLocator

from .. import validation
from ..heads import split_heads

#: aten kernels that show how attention was computed (see :func:`kernels_called`)
ATTENTION_KERNELS = (
    "bmm",
    "baddbmm",
    "softmax",  # softmax(..., out=...) dispatches the composite op itself
    "_softmax",
    "_safe_softmax",
    "_native_multi_head_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
)


def wrong_split_heads(x, num_heads: int):
    """The classic bug: ``x.view(B, h, L, d_head)`` with no transpose. Same shape as
    :func:`~mha_course.split_heads`, but head i receives the i-th contiguous slice of memory —
    whole consecutive *tokens* cut into d_head-wide pieces — instead of feature columns."""
    validation.tensor("x", x, dims=3)
    B, L, D = x.shape
    d_head = validation.divisible(D, num_heads)
    return x.reshape(B, num_heads, L, d_head)  # (B, h, L, d_head), but the rows are not tokens


def source_map(seq_len: int, num_heads: int, d_head: int, *, wrong: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each element of the split tensor came from, for one sequence of ``seq_len`` tokens.

    Returns ``(token, feature)``, two int64 tensors of shape (h, L, d_head): element
    ``[i, p, j]`` of head i at position p, column j, is feature ``feature[i, p, j]`` of token
    ``token[i, p, j]`` of the input (L, h*d_head). With ``wrong=False`` (``split_heads``) every
    head has token p at position p; with ``wrong=True`` (``view(B, h, L, d_head)``) it does not.
    """
    for name, value in (("seq_len", seq_len), ("num_heads", num_heads), ("d_head", d_head)):
        validation.positive_int(name, value)
    d_model = num_heads * d_head
    index = torch.arange(seq_len * d_model).view(1, seq_len, d_model)  # element ids in memory order
    heads = (wrong_split_heads if wrong else split_heads)(index, num_heads)[0]  # (h, L, d_head)
    return heads // d_model, heads % d_model


def head_of_element(seq_len: int, num_heads: int, d_head: int, *, wrong: bool = False) -> torch.Tensor:
    """(L, h*d_head) int64: the head that element [token, feature] of the input is sent to."""
    token, feature = source_map(seq_len, num_heads, d_head, wrong=wrong)
    owner = torch.empty(seq_len, num_heads * d_head, dtype=torch.long)
    head = torch.arange(num_heads).view(-1, 1, 1).expand_as(token)
    owner[token.reshape(-1), feature.reshape(-1)] = head.reshape(-1)
    return owner


def draw_layout(seq_len: int = 6, num_heads: int = 2, d_head: int = 3):
    """Figure: right split (left column) vs ``view(B, h, L, d_head)`` (right column).

    Top row: the input (L tokens × d_model features) coloured by the head each element goes to.
    Bottom row: the split tensor laid out as h blocks of (L positions × d_head), each cell
    showing which token it holds (colour) and, when small, ``token.feature`` as text.
    """
    d_model = num_heads * d_head
    fig, axes = plt.subplots(2, 2, figsize=(11, 4.2 + 0.45 * seq_len), layout="constrained")
    head_cmap = ListedColormap(
        plt.get_cmap("tab10").colors[: max(num_heads, 1)]
        if num_heads <= 10
        else plt.get_cmap("tab20").colors[:num_heads]
    )
    head_norm = BoundaryNorm(torch.arange(num_heads + 1).float().sub(0.5).tolist(), head_cmap.N)
    small = seq_len * d_model <= 96
    for col, wrong in enumerate((False, True)):
        name = "WRONG: view(B, h, L, d_head)" if wrong else "right: view(B, L, h, d_head).transpose(1, 2)"
        owner = head_of_element(seq_len, num_heads, d_head, wrong=wrong)
        ax = axes[0, col]
        im = ax.imshow(owner.numpy(), cmap=head_cmap, norm=head_norm, aspect="auto")
        ax.set_title(f"input (L={seq_len}, d_model={d_model}) coloured by head\n{name}")
        ax.set_xlabel("feature of the input")
        ax.set_ylabel("token")
        ax.set_yticks(range(seq_len))
        if small:
            for t in range(seq_len):
                for f in range(d_model):
                    ax.text(f, t, f"h{owner[t, f].item()}", ha="center", va="center", fontsize=7, color="white")
        fig.colorbar(im, ax=ax, ticks=range(num_heads), label="head", fraction=0.05)

        token, feature = source_map(seq_len, num_heads, d_head, wrong=wrong)
        grid = token.permute(1, 0, 2).reshape(seq_len, d_model)  # heads side by side: (L, h*d_head)
        ax = axes[1, col]
        im = ax.imshow(grid.numpy(), cmap="viridis", vmin=0, vmax=max(seq_len - 1, 1), aspect="auto")
        ax.set_title(f"{name.split(':')[0]}: the (h, L, d_head) result, head blocks side by side")
        ax.set_xlabel("head block · column j of d_head")
        ax.set_ylabel("position p inside the head")
        ax.set_yticks(range(seq_len))
        ax.set_xticks([i * d_head + (d_head - 1) / 2 for i in range(num_heads)])
        ax.set_xticklabels([f"head {i}" for i in range(num_heads)])
        for i in range(1, num_heads):
            ax.axvline(i * d_head - 0.5, color="white", lw=2)
        if small:
            feats = feature.permute(1, 0, 2).reshape(seq_len, d_model)
            for p in range(seq_len):
                for c in range(d_model):
                    ax.text(
                        c,
                        p,
                        f"{grid[p, c].item()}.{feats[p, c].item()}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if grid[p, c] < seq_len / 2 else "black",
                    )
        fig.colorbar(im, ax=ax, label="source token", fraction=0.05, ticks=MaxNLocator(integer=True))
    fig.suptitle(
        f"Which token and feature lands in which head (L={seq_len}, h={num_heads}, d_head={d_head}); "
        "text = token.feature"
    )
    return fig


def kernels_called(fn: Callable[[], object], *, keep: tuple[str, ...] | None = ATTENTION_KERNELS) -> list[str]:
    """Run ``fn()`` and return the names of the aten kernels it dispatched, in order (only
    those in ``keep``; all of them with ``keep=None``). Tells which implementation PyTorch chose,
    e.g. one fused ``_scaled_dot_product_flash_attention_for_cpu`` vs ``bmm, _softmax, bmm``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    names: list[str] = []

    class _Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with _Log():
        fn()
    return [n for n in names if keep is None or n in keep]


def kernels_inside(fn: Callable[[], object], *, keep: tuple[str, ...] | None = ATTENTION_KERNELS) -> list[str]:
    """Like :func:`kernels_called`, but also the kernels that run *inside* other kernels, as
    PyTorch's profiler records them: ``_native_multi_head_attention`` is one call at the
    dispatcher, and this shows what it runs (e.g. ``bmm, _softmax, bmm``)."""
    from ..kit.memory import quiet_c_stderr

    cpu = [torch.profiler.ProfilerActivity.CPU]
    with quiet_c_stderr(), torch.profiler.profile(activities=cpu, acc_events=True) as prof:  # see kit.memory
        fn()
    names = [e.name.removeprefix("aten::") for e in prof.events() if e.name.startswith("aten::")]
    return [n for n in names if keep is None or n in keep]


#: the float64-reference bounds of :func:`dtype_errors`, with about 10x margin over this course's
#: measurements (outputs of size about 0.5): what a test comparing two implementations should use
DTYPE_BOUNDS = {torch.float64: 1e-14, torch.float32: 1e-6, torch.float16: 3e-3, torch.bfloat16: 3e-2}


def reference_attention_float64(mha, x) -> torch.Tensor:
    """Self-attention of ``mha`` (a mha_course.MultiHeadAttention) on ``x`` (B, L, d_model),
    computed in float64 from the formula, one head at a time, independently of the module's forward."""
    x = x.double()
    h, d_head = mha.num_heads, mha.d_head
    proj = {n: (getattr(mha, f"{n}_proj").weight.double(), getattr(mha, f"{n}_proj").bias) for n in "qkv"}
    heads = []
    for i in range(h):
        rows = slice(i * d_head, (i + 1) * d_head)
        q, k, v = (
            x @ w[rows].T + (0 if b is None else b.double()[rows]) for w, b in proj.values()
        )  # (B, L, d_head) each
        weights = torch.softmax(q @ k.transpose(1, 2) / d_head**0.5, dim=-1)  # (B, L, L)
        heads.append(weights @ v)  # (B, L, d_head)
    out_w, out_b = mha.out_proj.weight.double(), mha.out_proj.bias
    return torch.cat(heads, dim=-1) @ out_w.T + (0 if out_b is None else out_b.double())  # (B, L, d_model)


@torch.no_grad()
def dtype_errors(mha, x, dtypes=tuple(DTYPE_BOUNDS)) -> dict[torch.dtype, dict[str, float]]:
    """Max abs error against :func:`reference_attention_float64` of the course's
    MultiHeadAttention and of nn.MultiheadAttention (same weights), each run in every dtype:
    {dtype: {"course": error, "torch": error}}."""
    reference = reference_attention_float64(mha, x)
    torch_mha = mha.to_torch().eval()
    errors = {}
    for dtype in dtypes:
        xd = x.to(dtype)
        ours = mha.to(dtype)(xd, need_weights=False)[0]
        theirs = torch_mha.to(dtype)(xd, xd, xd, need_weights=False)[0]
        errors[dtype] = {
            n: (o.double() - reference).abs().max().item() for n, o in (("course", ours), ("torch", theirs))
        }
    mha.to(x.dtype)
    torch_mha.to(x.dtype)
    return errors


def cpu_caches() -> str:
    """This machine's CPU caches as one line, e.g. "L1d 48 KiB, L2 2 MiB, L3 32 MiB (per core or
    shared, as Linux reports them for CPU 0)", read from /sys; "unknown" where /sys does not say."""
    from pathlib import Path

    parts = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((index / name).read_text().strip() for name in ("level", "type", "size"))
        except OSError:
            continue
        if kind == "Instruction":
            continue
        label = f"L{level}" + ("d" if kind == "Data" else "")
        kib = int(size[:-1]) * (1024 if size.endswith("M") else 1) if size[-1] in "KM" else int(size) // 1024
        parts.append(f"{label} {kib // 1024} MiB" if kib >= 1024 and kib % 1024 == 0 else f"{label} {kib} KiB")
    return ", ".join(parts) if parts else "unknown"
