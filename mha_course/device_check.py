"""Does the course's attention compute the same as PyTorch's on this machine's accelerator?

    python -m mha_course.device_check            the best available device (CUDA, Apple MPS, else CPU)
    python -m mha_course.device_check --device cpu

The course never needs an accelerator; learners who have one (Colab's GPU runtime, a CUDA laptop,
Apple silicon) can check here that every module computes where its inputs are, in the dtypes that
device runs, and equals PyTorch's own modules there. One line per comparison: the largest
difference and the bound it must stay under for that dtype.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from .attention import scaled_dot_product_attention
from .fast import FastMultiHeadAttention
from .gqa import GroupedQueryAttention, repeat_kv
from .kit.setup import device as best_device
from .kit.verify import mark
from .kv_cache import KVCache
from .masks import causal_mask, padding_mask
from .multihead import MultiHeadAttention

#: the largest difference from PyTorch's result a correct implementation shows, per dtype
BOUNDS = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 5e-3}


def dtypes_for(device: torch.device) -> list[torch.dtype]:
    """The dtypes worth checking on ``device`` (float64 only where it is supported)."""
    if device.type == "cuda":
        return [torch.float32, torch.float64, torch.bfloat16, torch.float16]
    if device.type == "mps":
        return [torch.float32, torch.float16]
    return [torch.float32, torch.float64, torch.bfloat16]


def comparisons(device: torch.device, dtype: torch.dtype, *, seed: int = 0):
    """(name, course result, PyTorch's result) for each check, computed on ``device`` in ``dtype``."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    B, L, d, h, h_kv = 2, 7, 32, 4, 2
    q, k, v = randn(B, h, L, d // h), randn(B, h, L, d // h), randn(B, h, L, d // h)
    mask = causal_mask(L, device=device)
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    yield "scaled_dot_product_attention = F.sdpa (causal)", out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    torch.manual_seed(seed)
    theirs = torch.nn.MultiheadAttention(d, h, batch_first=True).to(device=device, dtype=dtype).eval()
    ours = MultiHeadAttention.from_torch(theirs)
    x = randn(B, L, d)
    pad = padding_mask(torch.tensor([L, L - 3], device=device), L)  # (B, 1, 1, L)
    ref, ref_w = theirs(x, x, x, key_padding_mask=~pad[:, 0, 0], average_attn_weights=False)
    got, got_w = ours(x, mask=pad)
    yield "MultiHeadAttention = nn.MultiheadAttention (padding)", got, ref
    yield "MultiHeadAttention weights = nn.MultiheadAttention's", got_w, ref_w
    got, _ = ours(x, mask=pad, need_weights=False)
    yield "MultiHeadAttention SDPA path = nn.MultiheadAttention", got, ref
    with torch.no_grad():  # the fast variant's in-place path
        got, got_w = FastMultiHeadAttention.from_module(ours).eval()(x, mask=pad)
    both, ref_both = torch.cat([got.flatten(), got_w.flatten()]), torch.cat([ref.flatten(), ref_w.flatten()])
    yield "FastMultiHeadAttention = nn.MultiheadAttention (out, weights)", both, ref_both

    gqa = GroupedQueryAttention(d, h, h_kv).to(device=device, dtype=dtype)
    full, _ = gqa(x, is_causal=True)
    qh = gqa.q_proj(x).view(B, L, h, d // h).transpose(1, 2)
    kh = gqa.k_proj(x).view(B, L, h_kv, d // h).transpose(1, 2)
    vh = gqa.v_proj(x).view(B, L, h_kv, d // h).transpose(1, 2)
    sdpa = F.scaled_dot_product_attention(qh, repeat_kv(kh, h // h_kv), repeat_kv(vh, h // h_kv), is_causal=True)
    yield "GroupedQueryAttention = F.sdpa on repeated K/V", full, gqa.o_proj(sdpa.transpose(1, 2).reshape(B, L, d))
    cache, steps = KVCache(), []
    for t in range(L):
        step, _ = gqa(x[:, t : t + 1], cache=cache, is_causal=True)
        steps.append(step)
    yield "cached decoding = full causal pass", torch.cat(steps, dim=1), full


def report(device: torch.device | str | None = None) -> tuple[list[str], bool]:
    """The report's lines and whether every comparison stayed within its bound."""
    device = best_device() if device is None else torch.device(device)
    lines = [f"device: {device} (torch {torch.__version__})"]
    if device.type == "cuda":
        lines[0] += f", {torch.cuda.get_device_name(device)}"
    if device.type == "cpu":
        lines.append("no accelerator found: checking on the CPU")
    ok = True
    for dtype in dtypes_for(device):
        bound = BOUNDS[dtype]
        for name, got, expected in comparisons(device, dtype):
            err = (got.double() - expected.double()).abs().max().item()
            passed = err <= bound and got.device.type == device.type
            ok &= passed
            lines.append(f"{mark(passed)} · {str(dtype).removeprefix('torch.'):8} {name}: {err:.1e} (≤ {bound:.0e})")
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mha_course.device_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", help="cpu, cuda, cuda:1, mps (default: the best available)")
    args = parser.parse_args(argv)
    lines, ok = report(args.device)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
