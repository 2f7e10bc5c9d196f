"""Helpers of notebook 11 (positions and RoPE): the shift and order experiments run on every
position scheme, decoding with RoPE done right and with its classic bugs, loading a real
Llama-family checkpoint from the Hugging Face hub, and the figures (the explorer's ``draw_rope``).
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch

from .. import positions as P
from ..attention import scaled_dot_product_attention
from ..gqa import GroupedQueryAttention, KVCache, repeat_kv
from ..heads import merge_heads
from ..masks import causal_mask

SCHEMES = ("none", "learned", "sinusoidal", "ALiBi", "RoPE")
VOCAB = {"the": 0, "dog": 1, "bit": 2, "man": 3, "a": 4, "cat": 5, "saw": 6, "bird": 7}


class OneHead:
    """One attention head (d_model = head_dim = 16, random weights) that knows positions through
    one of :data:`SCHEMES`. ``weights(tokens, start)`` -> (L, L) attention weights of the tokens
    placed at positions start, start+1, …; ``outputs(tokens, start)`` -> (L, 16).

    ``causal``: a causal mask (query i sees keys j <= i). Default: on for ALiBi, which Press et al.
    (2022) define for causal language models (bias -m·(i - j) on the past, the future masked),
    off for the others (without positions and without the mask the head is then exactly
    permutation-equivariant). ALiBi with ``causal=False`` is the symmetric -m·|i - j|."""

    def __init__(self, scheme: str, *, causal: bool | None = None, d: int = 16, max_len: int = 128, seed: int = 0):
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
        g = torch.Generator().manual_seed(seed)
        self.scheme, self.d = scheme, d
        self.causal = scheme == "ALiBi" if causal is None else bool(causal)
        self.embed = torch.randn(len(VOCAB), d, generator=g, dtype=torch.float64)  # (V, d)
        self.w_q, self.w_k, self.w_v = (torch.randn(d, d, generator=g, dtype=torch.float64) / d**0.5 for _ in range(3))
        self.table = torch.randn(max_len, d, generator=g, dtype=torch.float64)  # learned absolute positions
        self.slope = float(P.alibi_slopes(8)[0])  # one ALiBi head (the steepest of eight: 1/2)

    def _scores_and_values(self, tokens, start: int):
        x = self.embed[[VOCAB[t] for t in tokens]]  # (L, d)
        L = x.shape[0]
        pos = torch.arange(start, start + L)  # (L,)
        if self.scheme == "learned":
            x = x + self.table[pos]
        elif self.scheme == "sinusoidal":
            x = x + P.sinusoidal_positions(start + L, self.d).double()[start:]
        q, k, v = x @ self.w_q, x @ self.w_k, x @ self.w_v  # (L, d) each
        if self.scheme == "RoPE":
            q, k = P.apply_rope(q, pos), P.apply_rope(k, pos)
        scores = q @ k.T / math.sqrt(self.d)  # (L, L)
        if self.scheme == "ALiBi":
            scores = scores - self.slope * (pos[:, None] - pos[None, :]).abs()  # -m·(i - j) on the past
        if self.causal:
            scores = scores.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
        return scores, v

    def weights(self, tokens, start: int = 0) -> torch.Tensor:
        scores, _ = self._scores_and_values(tokens, start)
        return scores.softmax(dim=-1)  # (L, L)

    def outputs(self, tokens, start: int = 0) -> torch.Tensor:
        scores, v = self._scores_and_values(tokens, start)
        return scores.softmax(dim=-1) @ v  # (L, d)


def shift_change(head: OneHead, tokens, shift: int) -> float:
    """Largest change of any attention weight when every token moves ``shift`` positions on."""
    return (head.weights(tokens, shift) - head.weights(tokens, 0)).abs().max().item()


def order_change(head: OneHead, sentence_a, sentence_b, word: str) -> float:
    """How differently ``word`` comes out of the head in two orderings of the same words
    (largest coordinate difference of its output vector; 0 = the head cannot tell them apart)."""
    out_a, out_b = head.outputs(sentence_a), head.outputs(sentence_b)
    return (out_a[sentence_a.index(word)] - out_b[sentence_b.index(word)]).abs().max().item()


def reversal_change(head: OneHead, sentence) -> float:
    """Largest difference between the outputs of the sentence and of its reversal, word by word
    (0 = the head cannot tell a sentence from its mirror image)."""
    out, rev = head.outputs(sentence), head.outputs(sentence[::-1])
    return (out - rev.flip(0)).abs().max().item()


def draw_experiments(shift_curves: dict, order_gaps: dict, *, tol: float = 1e-9):
    """Left: max weight change against the shift, one line per scheme; right: the order gap per
    scheme. Values below ``tol`` (rounding) are drawn as 0. Returns the Figure."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 3.8))
    for name, (shifts, changes) in shift_curves.items():
        ax1.plot(shifts, [c if c > tol else 0.0 for c in changes], "o-", ms=3, label=name)
    ax1.set(
        xlabel="shift k (every position + k)",
        ylabel="largest change of an attention weight",
        title="Shift every position by k",
    )
    ax1.legend(fontsize=8)
    names = list(order_gaps)
    ax2.bar(names, [g if g > tol else 0.0 for g in order_gaps.values()], color="tab:purple")
    ax2.set(ylabel="largest difference of the output for 'dog'", title="'the dog bit the man' vs 'the man bit the dog'")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# RoPE in cached decoding, right and wrong

BUGS = {
    None: "correct: rotate at the absolute position, cache the rotated key",
    "position 0": "every new token rotated as position 0",
    "unrotated keys": "keys cached before rotation, never rotated",
    "rotated values": "V rotated as well",
    "one late": "every position one late, the prompt's too",
}


def rope_decode(layer: GroupedQueryAttention, x, prompt_len: int, *, theta: float = 10000.0, bug=None):
    """Decode x (B, L, d_model) through ``layer`` with RoPE, the prompt (first ``prompt_len``
    positions) in one call, then one position per step, with a KV cache; ``bug`` (a key of
    :data:`BUGS`) breaks it the way ports often do. Returns out (B, L, d_model) and the cache."""
    if bug not in BUGS:
        raise ValueError(f"bug must be one of {list(BUGS)}, got {bug!r}")
    B, L, _ = x.shape
    h, h_kv, hd = layer.num_heads, layer.num_kv_heads, layer.head_dim
    cache, outs = KVCache(), []
    with torch.no_grad():
        for start, end in [(0, prompt_len)] + [(t, t + 1) for t in range(prompt_len, L)]:
            xs = x[:, start:end]  # (B, n, d_model)
            q = layer.q_proj(xs).unflatten(-1, (h, hd)).transpose(1, 2)  # (B, h, n, hd)
            k = layer.k_proj(xs).unflatten(-1, (h_kv, hd)).transpose(1, 2)  # (B, h_kv, n, hd)
            v = layer.v_proj(xs).unflatten(-1, (h_kv, hd)).transpose(1, 2)
            q, k, v = rope_step(q, k, v, cache.length, theta=theta, bug=bug)
            k_all, v_all = cache.update(k, v)  # (B, h_kv, L_total, hd)
            mask = causal_mask(end - start, k_all.shape[2])  # bottom-right aligned
            out, _ = scaled_dot_product_attention(q, repeat_kv(k_all, layer.n_rep), repeat_kv(v_all, layer.n_rep), mask)
            outs.append(layer.o_proj(merge_heads(out)))  # (B, n, d_model)
    return torch.cat(outs, dim=1), cache


def rope_step(q, k, v, cache_length: int, *, theta: float = 10000.0, bug=None):
    """What one cached step feeds to attention and to the cache: q, k rotated at positions
    cache_length, cache_length + 1, …; v untouched (or one of the :data:`BUGS`)."""
    n = q.shape[-2]
    first = {"position 0": 0, "one late": cache_length + 1}.get(bug, cache_length)
    pos = torch.arange(first, first + n)  # (n,)
    q = P.apply_rope(q, pos, theta=theta)
    if bug != "unrotated keys":
        k = P.apply_rope(k, pos, theta=theta)
    if bug == "rotated values":
        v = P.apply_rope(v, pos, theta=theta)
    return q, k, v


# ---------------------------------------------------------------------------------------------
# a real checkpoint (online only: Colab or any machine with internet access)

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M"


def load_llama_checkpoint(source: str = SMOLLM2, *, local_files_only: bool = False):
    """Load a Llama-family checkpoint with ``transformers`` (hub id or local folder) and copy its
    weights into the course's :class:`~mha_course.decoder.LlamaDecoder`.
    Returns (course_model, hf_model, tokenizer). Downloads ~270 MB for SmolLM2-135M on first use."""
    from ..decoder import LlamaDecoder
    from .pretrained import quiet_transformers

    with quiet_transformers():
        import transformers

        tokenizer = transformers.AutoTokenizer.from_pretrained(source, local_files_only=local_files_only)
        model = transformers.AutoModelForCausalLM.from_pretrained(source, local_files_only=local_files_only)
    hf_model = model.float().eval()  # the hub copy may be bf16
    return LlamaDecoder.from_hf(hf_model), hf_model, tokenizer


def complete(model, tokenizer, prompt: str, max_new_tokens: int = 20) -> str:
    """Greedy continuation of ``prompt`` by the course's decoder (with its KV caches)."""
    from ..decoder import generate_greedy

    ids = tokenizer(prompt, return_tensors="pt").input_ids  # (1, L)
    out = generate_greedy(model, ids, max_new_tokens, eos_token_id=tokenizer.eos_token_id)
    return tokenizer.decode(out[0], skip_special_tokens=True)


# ---------------------------------------------------------------------------------------------
# the explorer


def relative_scores(head_dim: int, theta: float, max_distance: int, *, pair: int | None = None) -> torch.Tensor:
    """RoPE's score q·k for q = k = a vector of ones, against the distance m - n = 0…max_distance
    (the long-range decay of Su et al. 2021, §3.4.3), divided by head_dim so that 1 = no decay;
    also the expected score of q = k with random N(0, 1) coordinates. With ``pair``, only that
    pair's term cos((m - n) ω_pair)."""
    dist = torch.arange(max_distance + 1, dtype=torch.float64)  # (D,)
    angles = dist[:, None] * P.rope_frequencies(head_dim, theta).double()  # (D, head_dim/2)
    if pair is not None:
        return angles[:, pair].cos()
    return angles.cos().mean(dim=-1)  # (D,): Σ over pairs of 2·cos / head_dim


def mean_scores(head_dim: int, theta: float, distances, *, same: bool, samples: int = 2000, seed: int = 0):
    """Mean RoPE score q_m · k_n / head_dim over ``samples`` random N(0, 1) vectors, at each
    distance m - n in ``distances``: k = q (``same``) or k drawn independently of q. (D,) float64."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(samples, head_dim, generator=g, dtype=torch.float64)  # (S, d)
    k = q if same else torch.randn(samples, head_dim, generator=g, dtype=torch.float64)
    distances = torch.as_tensor(distances)
    q_rot = P.apply_rope(q[:, None, :].expand(-1, len(distances), -1), distances, theta=theta)  # (S, D, d)
    return (q_rot * k[:, None, :]).sum(-1).mean(0) / head_dim  # (D,): key at n = 0


def draw_rope(pair: int = 0, offset: int = 3, *, head_dim: int = 64, theta: float = 10000.0, max_distance: int = 1024):
    """The explorer's figure. Left: pair ``pair`` of a query at position ``offset`` and of a key at
    position 0, drawn in that pair's plane (the key unrotated, the query turned by offset · ω_pair).
    Right: the score against the distance for q = k (all pairs, and the chosen pair alone) and the
    mean over independent random q, k; the chosen offset marked. Returns the Figure."""
    freqs = P.rope_frequencies(head_dim, theta).double()
    if not 0 <= pair < head_dim // 2:
        raise ValueError(f"pair must be in 0..{head_dim // 2 - 1}, got {pair}")
    angle = offset * freqs[pair].item()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1, 2]})
    circle = torch.linspace(0, 2 * math.pi, 200)
    ax1.plot(circle.cos(), circle.sin(), color="0.8", lw=1)
    ax1.annotate("", (1, 0), (0, 0), arrowprops={"arrowstyle": "->", "color": "tab:blue", "lw": 2})
    ax1.annotate(
        "", (math.cos(angle), math.sin(angle)), (0, 0), arrowprops={"arrowstyle": "->", "color": "tab:red", "lw": 2}
    )
    ax1.text(1.05, -0.12, "key, position 0", color="tab:blue", fontsize=8)
    ax1.text(
        1.05 * math.cos(angle), 1.05 * math.sin(angle) + 0.08, f"query, position {offset}", color="tab:red", fontsize=8
    )
    ax1.set(
        xlim=(-1.5, 2.4),
        ylim=(-1.4, 1.4),
        aspect="equal",
        xlabel=f"coordinate {pair} (pair {pair})",
        ylabel=f"coordinate {pair + head_dim // 2}",
        title=f"pair {pair}: ω = {freqs[pair].item():.3g} rad/position, turned {math.degrees(angle) % 360:.0f}°",
    )
    dist = torch.arange(max_distance + 1)
    ax2.plot(dist, relative_scores(head_dim, theta, max_distance), color="black", label="q = k (expected score)")
    grid = torch.unique(torch.logspace(0, math.log10(max_distance), 60).round().long())  # (≤ 60,)
    ax2.plot(
        grid,
        mean_scores(head_dim, theta, grid, same=False, samples=500),
        color="tab:green",
        lw=1,
        label="independent random q, k (mean of 500)",
    )
    ax2.plot(
        dist,
        relative_scores(head_dim, theta, max_distance, pair=pair),
        color="tab:red",
        alpha=0.6,
        lw=1,
        label=f"pair {pair} alone: cos(distance·ω)",
    )
    ax2.axvline(offset, color="tab:red", ls="--", lw=1)
    ax2.set(
        xscale="symlog",
        xlim=(0, max_distance),
        ylim=(-1.05, 1.05),
        xlabel="distance between query and key (positions, log scale)",
        ylabel="score / head_dim",
        title=f"RoPE score against distance (head_dim {head_dim}, θ = {theta:,.0f})",
    )
    ax2.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig
