"""Notebook 12 (beyond GQA): cache-size tables, the receptive field of stacked windows, the tiny
model for the window-and-sinks experiment, and the explorer's figure.

Per-token cache sizes of the schemes the notebook compares (one layer, elements):
MHA / GQA / MQA: 2 · h_kv · head_dim;  MLA: kv_lora_rank + qk_rope_head_dim;
window + sinks: like its base scheme, but for at most num_sinks + window tokens.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from .. import validation
from ..block import Encoder
from ..cache_schemes import sink_window_mask
from ..configs import LATENT_MODEL_CONFIGS, MODEL_CONFIGS, WINDOWED_MODEL_CONFIGS, ModelConfig
from ..gqa import GroupedQueryAttention
from ..kit.run_cache import advance, cached_run
from .tiny_training import fixed_threads

GIB, KIB = 2**30, 2**10
SCHEMES = ("MHA", "GQA", "MQA", "MLA", "window + sinks")


def all_configs() -> dict[str, ModelConfig]:
    """MODEL_CONFIGS, WINDOWED_MODEL_CONFIGS and LATENT_MODEL_CONFIGS together (name -> ModelConfig)."""
    return {**MODEL_CONFIGS, **WINDOWED_MODEL_CONFIGS, **LATENT_MODEL_CONFIGS}


def cache_elements_per_token(scheme: str, *, num_kv_heads: int, head_dim: int, kv_lora_rank=512, rope_dim=64) -> int:
    """Numbers cached per token and layer by ``scheme`` ("MHA"/"GQA"/"MQA" use num_kv_heads as given)."""
    if scheme in ("MHA", "GQA", "MQA", "window + sinks"):
        return 2 * num_kv_heads * head_dim
    if scheme == "MLA":
        return kv_lora_rank + rope_dim
    raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")


def cached_tokens(scheme: str, context_len: int, *, window: int, num_sinks: int) -> int:
    """Tokens a scheme keeps at ``context_len``: all of them, or at most num_sinks + window."""
    return min(context_len, num_sinks + window) if scheme == "window + sinks" else context_len


def scheme_cache_bytes(
    cfg: ModelConfig,
    scheme: str,
    context_len: int,
    *,
    num_kv_heads=None,
    kv_lora_rank=512,
    rope_dim=64,
    window=4096,
    num_sinks=4,
    block_size=1,
    bytes_per_element=2,
) -> int:
    """Cache bytes of one sequence for ``cfg``'s layers and head_dim under ``scheme``; tokens are
    stored in whole blocks of ``block_size`` (1 = no rounding)."""
    h_kv = {"MHA": cfg.num_heads, "MQA": 1}.get(scheme, num_kv_heads or cfg.num_kv_heads)
    per_token = cache_elements_per_token(
        scheme, num_kv_heads=h_kv, head_dim=cfg.head_dim, kv_lora_rank=kv_lora_rank, rope_dim=rope_dim
    )
    tokens = cached_tokens(scheme, context_len, window=window, num_sinks=num_sinks)
    tokens = math.ceil(tokens / block_size) * block_size
    return cfg.num_layers * per_token * tokens * bytes_per_element


def receptive_field(num_layers: int, window: int, seq_len: int) -> int:
    """How many positions back the last token's output can depend on after ``num_layers``
    sliding-window layers: composes the (seq_len, seq_len) window masks as a reachability
    product and returns (seq_len − 1) − the earliest reachable position."""
    mask = sink_window_mask(seq_len, window).to(torch.float64)  # (L, L): 1 = reads directly
    reach = torch.eye(seq_len, dtype=torch.float64)
    for _ in range(num_layers):
        reach = ((mask @ reach) > 0).to(torch.float64)  # reachable through one more layer
    earliest = int(torch.nonzero(reach[-1])[0])
    return seq_len - 1 - earliest


# ---------------------------------------------------------------------------------------------
# the tiny language model for the window-and-sinks experiment

VOCAB, BOS, SEQ_LEN = 16, 16, 32
MARKER, MARKER_RATE, COPY_SPAN = 15, 0.05, 6  # token 15 marks a value to copy for 6 steps


def markov_table(seed: int = 100) -> torch.Tensor:
    """(V−1, V−1) next-token probabilities of the ordinary tokens 0..14 given the previous one."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(VOCAB - 1, VOCAB - 1, generator=g, dtype=torch.float64) * 3.0).softmax(-1)


def _draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One index per row of ``probs`` (n, V), by inverting each row's cumulative distribution at a
    uniform draw: the same tokens on every PyTorch version (torch.multinomial's stream changed
    between 2.6 and 2.13)."""
    u = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64)
    below = (probs.double().cumsum(-1) < u).sum(-1)  # how many cumulative sums lie below u
    return below.clamp(max=probs.shape[-1] - 1)


def sample_sequences(table: torch.Tensor, n: int, *, seed: int) -> torch.Tensor:
    """(n, SEQ_LEN) token ids: BOS, then a first-order Markov chain (``table``) into which a
    MARKER is dropped now and then (rate 5%). The token right after a marker is a *value*; for
    the next COPY_SPAN steps every token repeats it. So a head must look for a recent marker —
    and, most of the time, when there is none, attend to nothing in particular."""
    g = torch.Generator().manual_seed(seed)
    x = torch.empty(n, SEQ_LEN, dtype=torch.long)
    x[:, 0] = BOS
    x[:, 1] = torch.randint(VOCAB - 1, (n,), generator=g)
    value, age = torch.full((n,), -1), torch.full((n,), COPY_SPAN + 1)
    for t in range(2, SEQ_LEN):
        after_marker = x[:, t - 1] == MARKER
        chain = _draw(table[x[:, t - 1].clamp(max=VOCAB - 2)], g)  # (n,)
        copying = (age <= COPY_SPAN) & (value >= 0) & ~after_marker
        marker = (torch.rand(n, generator=g, dtype=torch.float64) < MARKER_RATE) & ~after_marker & ~copying
        x[:, t] = torch.where(copying, value, torch.where(marker, MARKER, chain))
        value = torch.where(after_marker, x[:, t], value)  # the token after a marker is the value
        age = torch.where(after_marker, 0, age + 1)
    return x


class TinyBlock(nn.Module):
    """A pre-norm decoder block: x + attention(LN(x)), then x + MLP(LN(x)); the attention is a
    causal ``mc.GroupedQueryAttention`` (as many K/V heads as heads), with learned sinks or not
    (and any other of its options, e.g. ``qk_norm=True`` or ``output_gate=True``)."""

    def __init__(self, d_model: int, num_heads: int, *, sinks: bool, **attention):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.self_attn = GroupedQueryAttention(d_model, num_heads, num_heads, bias=True, sinks=sinks, **attention)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x, mask=None):
        x = x + self.self_attn(self.norm1(x), mask=mask, is_causal=True)[0]  # (B, L, d_model)
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """Token + learned position embeddings -> causal pre-norm blocks (:class:`TinyBlock`) -> logits.
    ``sinks=True`` gives every head a learned sink logit (gpt-oss's attention sinks); other keyword
    arguments go to every layer's ``GroupedQueryAttention``."""

    def __init__(self, d_model: int = 32, num_heads: int = 2, num_layers: int = 2, *, sinks: bool = False, **attention):
        super().__init__()
        self.embed = nn.Embedding(VOCAB + 1, d_model)
        self.pos = nn.Parameter(0.1 * torch.randn(SEQ_LEN, d_model))
        self.layers = nn.ModuleList(TinyBlock(d_model, num_heads, sinks=sinks, **attention) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB)

    def forward(self, tokens, mask=None):
        """tokens (B, L) -> logits (B, L, V); ``mask`` (L, L) bool is ANDed with the causal mask."""
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]  # (B, L, d_model)
        for layer in self.layers:
            x = layer(x, mask)
        return self.head(self.norm(x))  # (B, L, V)


@cached_run(ignore=("progress",), seeds_itself=True, replay=lambda a: advance(a["progress"], a["steps"]))
def train_tiny_lm(
    *,
    seed: int = 0,
    steps: int = 150,
    batch_size: int = 32,
    lr: float = 3e-3,
    sinks: bool = False,
    sink_lr: float = 0.08,
    progress=None,
):
    """Train a :class:`TinyLM` (with learned sinks or not) in float64 on :func:`sample_sequences`
    with full causal attention. Deterministic for a seed (one thread); returns it in eval mode.
    The sink logits learn at ``sink_lr``: Adam moves a parameter by about its learning rate per
    step, so at ``lr`` a lone logit could not travel far in a few hundred steps."""
    table = markov_table()
    data = sample_sequences(table, steps * batch_size, seed=seed + 1)
    with fixed_threads(), torch.random.fork_rng(devices=[]), torch.enable_grad():
        torch.manual_seed(seed)
        model = TinyLM(sinks=sinks).double()
        sink_logits = [p for n, p in model.named_parameters() if n.endswith("sinks")]
        others = [p for n, p in model.named_parameters() if not n.endswith("sinks")]
        groups = [{"params": others}] + ([{"params": sink_logits, "lr": sink_lr}] if sink_logits else [])
        opt = torch.optim.AdamW(groups, lr=lr, weight_decay=0.0)
        for step in range(steps):
            x = data[step * batch_size : (step + 1) * batch_size]  # (B, L)
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            if progress is not None:
                progress.update(1)
    return model.eval()


@torch.no_grad()
def windowed_losses(model: TinyLM, tokens, *, window: int, sinks=(0, 1, 4)) -> dict[str, float]:
    """Mean next-token loss over the positions the window has already slid past (≥ window + max(sinks)),
    with full attention and with the window plus each number of sinks."""
    L = tokens.shape[1] - 1
    start = window + max(sinks)
    masks = {"full attention": None} | {
        f"window {window}" + (f" + {s} sink{'s' * (s > 1)}" if s else ", no sink"): sink_window_mask(L, window, s)
        for s in sinks
    }
    out = {}
    with fixed_threads():
        for name, mask in masks.items():
            logits = model(tokens[:, :-1], mask=mask)  # (B, L, V)
            loss = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")  # (B, L)
            out[name] = loss[:, start:].mean().item()
    return out


@torch.no_grad()
def attention_shares(model: TinyLM, tokens, *, window: int, from_position: int) -> dict[str, torch.Tensor]:
    """Where the queries at positions ≥ ``from_position`` put their attention under full causal
    attention, per layer and head: {"the BOS token": share on position 0, "keys beyond the window": share on
    positions 1 .. t − window, "the learned sink": 1 − the row's sum} — each (layers, heads),
    averaged over queries and sequences."""
    weights = []
    hooks = [layer.self_attn.register_forward_hook(lambda m, i, o: weights.append(o[1])) for layer in model.layers]
    try:
        with fixed_threads():
            model(tokens[:, :-1])
    finally:
        for h in hooks:
            h.remove()
    w = torch.stack(weights)[:, :, :, from_position:]  # (layers, B, h, queries, keys)
    L = w.shape[-1]
    queries = torch.arange(from_position, L)[:, None]  # (queries, 1)
    old = (torch.arange(L) > 0) & (torch.arange(L) <= queries - window)  # (queries, keys)
    return {
        "the BOS token": w[..., 0].mean(dim=(1, 3)),  # (layers, h)
        "keys beyond the window": (w * old).sum(-1).mean(dim=(1, 3)),
        "the learned sink": (1 - w.sum(-1)).mean(dim=(1, 3)),
    }


def uniform_bos_share(seq_len: int, *, from_position: int) -> float:
    """The BOS share :func:`attention_shares` would report for a head that attends uniformly:
    a query at position t spreads its weight over t + 1 keys, so BOS gets 1/(t + 1), averaged over
    the queries ``from_position`` … ``seq_len − 1`` (the baseline a parked share is measured against)."""
    t = torch.arange(from_position, seq_len, dtype=torch.float64)
    return (1 / (t + 1)).mean().item()


# ---------------------------------------------------------------------------------------------
# figures


def draw_patterns(seq_len: int = 16, window: int = 4, num_sinks: int = 2, block_size: int = 4):
    """Three masks side by side: full causal (MHA/GQA/MQA/MLA read every past token), the sliding
    window, and the window plus sinks, with the block boundaries of a paged cache as grid lines."""
    masks = {
        "full cache (causal)": sink_window_mask(seq_len, seq_len),
        f"window {window}": sink_window_mask(seq_len, window),
        f"window {window} + {num_sinks} sinks": sink_window_mask(seq_len, window, num_sinks),
    }
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.7))
    for ax, (name, mask) in zip(axes, masks.items(), strict=True):
        ax.imshow(mask.cpu().numpy(), cmap="Blues", vmin=0, vmax=1.3)
        for b in range(block_size, seq_len, block_size):
            ax.axvline(b - 0.5, color="gray", lw=0.6, ls=":")
        ax.set(title=f"{name}: {int(mask[-1].sum())} keys", xlabel="key position", ylabel="query position")
    fig.suptitle(f"Which keys each query reads ({seq_len} tokens; dotted: blocks of {block_size})")
    fig.tight_layout()
    return fig


def draw_explorer(
    model: str = "DeepSeek-V2-Lite",
    scheme: str = "MLA",
    context_len: int = 32768,
    num_kv_heads: int = 8,
    kv_lora_rank: int = 512,
    window: int = 4096,
    num_sinks: int = 4,
    block_size: int = 16,
):
    """Left: cache GiB (one sequence, bf16) against context length for every scheme at ``model``'s
    layers and head_dim, ``scheme`` highlighted, the chosen context marked; "window + sinks" is a
    window over a GQA cache of ``num_kv_heads`` K/V heads (the legend says so), also for MLA models.
    Right: which keys the last query reads at a toy scale (32 tokens; the window scaled by 32 / context_len)."""
    cfg = all_configs()[model]
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if cfg.num_heads % num_kv_heads:
        raise ValueError(f"num_kv_heads={num_kv_heads} must divide {model}'s {cfg.num_heads} query heads")
    for name, value in (
        ("context_len", context_len),
        ("kv_lora_rank", kv_lora_rank),
        ("window", window),
        ("block_size", block_size),
    ):
        validation.positive_int(name, value)
    validation.positive_int("num_sinks", num_sinks, allow_zero=True)
    knobs = dict(num_kv_heads=num_kv_heads, kv_lora_rank=kv_lora_rank, window=window, num_sinks=num_sinks)
    contexts = [2**k for k in range(10, 18)]
    window_label = f"window + sinks (on GQA: {num_kv_heads} K/V heads of {cfg.head_dim})"
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 4), gridspec_kw={"width_ratios": [1.7, 1]})
    for s in SCHEMES:
        gib = [scheme_cache_bytes(cfg, s, T, **knobs) / GIB for T in contexts]
        chosen = s == scheme
        left.plot(
            contexts,
            gib,
            "o-" if chosen else ".-",
            lw=2.5 if chosen else 1,
            alpha=1 if chosen else 0.6,
            label={"GQA": f"GQA ({num_kv_heads} K/V heads)", "window + sinks": window_label}.get(s, s),
        )
    total = scheme_cache_bytes(cfg, scheme, context_len, block_size=block_size, **knobs)
    exact = scheme_cache_bytes(cfg, scheme, context_len, **knobs)
    left.axvline(context_len, color="gray", ls="--")
    left.set(
        xscale="log",
        yscale="log",
        xlabel="context length (tokens)",
        ylabel="cache of one sequence (GiB, bf16)",
        title=f"{scheme}: {total / GIB:.3g} GiB at {context_len:,} tokens "
        f"({(total - exact) / KIB:.0f} KiB in partly filled blocks of {block_size})",
    )
    left.legend(fontsize=8)
    toy = 32
    toy_window = max(1, round(toy * window / context_len))
    if scheme == "window + sinks":
        mask = sink_window_mask(toy, min(toy_window, toy), min(num_sinks, toy))
    else:
        mask = sink_window_mask(toy, toy)
    right.imshow(mask.cpu().numpy(), cmap="Blues", vmin=0, vmax=1.3)
    right.set(title=f"keys read at toy scale ({toy} tokens)", xlabel="key position", ylabel="query position")
    fig.suptitle(f"{model}: {cfg.num_layers} layers, {cfg.num_heads} heads of {cfg.head_dim}")
    fig.tight_layout()
    return fig


def transformers_mla(layer):
    """``transformers``' DeepseekV2Attention holding ``layer``'s weights (an independent
    implementation of MLA), as a function x (B, L, d_model) -> causal output (B, L, d_model)."""
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention, DeepseekV2RotaryEmbedding

    config = DeepseekV2Config(
        hidden_size=layer.d_model,
        num_attention_heads=layer.num_heads,
        num_key_value_heads=layer.num_heads,
        kv_lora_rank=layer.kv_lora_rank,
        q_lora_rank=None,
        qk_nope_head_dim=layer.nope,
        qk_rope_head_dim=layer.rope,
        v_head_dim=layer.v_head_dim,
        num_hidden_layers=1,
        vocab_size=8,
    )
    config._attn_implementation = "eager"
    reference = DeepseekV2Attention(config, layer_idx=0).to(layer.q_proj.weight.dtype)
    reference.load_state_dict(layer.state_dict())
    rotary = DeepseekV2RotaryEmbedding(config)

    def run(x):
        L = x.shape[1]
        blocked = torch.zeros(1, 1, L, L, dtype=x.dtype).masked_fill(
            ~torch.ones(L, L, dtype=torch.bool).tril(), -torch.inf
        )
        out, _ = reference(x, attention_mask=blocked, position_embeddings=rotary(x, torch.arange(L)[None]))
        return out

    return run


@torch.no_grad()
def measured_reach(num_layers: int, window: int, seq_len: int = 64, *, seed: int = 0) -> int:
    """How far back a real stack of ``num_layers`` random windowed layers (``mc.block.Encoder``,
    float64) lets the last output depend: move each input position in turn (one batch, by a random
    vector — a constant shift would vanish in LayerNorm) and return (seq_len − 1) − the earliest
    position whose move changes the last output by more than rounding (1e-9)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        stack = Encoder(num_layers, 16, 2, 32, causal=True, norm_first=True).double().eval()
        x = torch.randn(1, seq_len, 16, dtype=torch.float64)  # (1, L, d)
        direction = torch.randn(16, dtype=torch.float64)
    perturbed = x.repeat(seq_len, 1, 1)  # (L, L, d): copy j has position j moved
    perturbed[torch.arange(seq_len), torch.arange(seq_len)] += direction
    mask = sink_window_mask(seq_len, window)
    last = stack(perturbed, mask=mask)[:, -1]  # (L, d): the last output of every copy
    moved = (last - stack(x, mask=mask)[:, -1]).abs().amax(dim=-1) > 1e-9  # (L,)
    return seq_len - 1 - int(torch.nonzero(moved)[0])


def share_in_words(share: float) -> str:
    """A recovered share in coarse words ("less than 10%", "between 10% and 50%", "more than half"):
    a tiny model's training amplifies the last-bit differences between CPUs, so only coarse
    statements about it hold on every machine."""
    if share < 0.1:
        return "less than 10%"
    return "between 10% and 50%" if share < 0.5 else "more than half"


def transformers_sink_attention(q, k, v, sinks, mask):
    """``transformers``' gpt-oss eager attention (``eager_attention_forward``, an independent
    implementation of learned sinks) on q (B, h, L, d), k and v (B, h_kv, L, d), sinks (h,) and a
    bool mask (L, L), True = may attend. Returns out (B, h, L, d) and weights (B, h, L, L)."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    module = nn.Module()
    module.sinks, module.num_key_value_groups, module.training = sinks, q.shape[1] // k.shape[1], False
    additive = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, torch.finfo(q.dtype).min)
    out, weights = eager_attention_forward(module, q, k, v, additive[None, None], scaling=q.shape[-1] ** -0.5)
    return out.transpose(1, 2), weights  # (B, h, L, d), (B, h, L, L)


def rope_matrix(position: int, dim: int, *, dtype=torch.float64):
    """(dim, dim) M with rope(x) = x @ M for a row x at ``position`` (interleaved pairs, as MLA's
    RoPE part): each row of the identity rotated."""
    from ..positions import apply_rope

    eye = torch.eye(dim, dtype=dtype)
    return apply_rope(eye, torch.full((dim,), position), layout="interleaved")


def draw_roofline(points: dict, *, peak_tflops: float, bandwidth_tbs: float, gpu: str):
    """A roofline: attainable TFLOP/s = min(peak, bandwidth · intensity) against FLOPs per byte
    (log–log), with ``points`` (label -> intensity) marked on the line."""
    ridge = peak_tflops / bandwidth_tbs  # FLOPs per byte where the two limits meet
    x = torch.logspace(-0.5, 3.5, 200).tolist()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.plot(x, [min(peak_tflops, bandwidth_tbs * i) for i in x], color="black", lw=1.5)
    ax.axvline(ridge, color="gray", ls=":", lw=1)
    for label, intensity in points.items():
        y = min(peak_tflops, bandwidth_tbs * intensity)
        ax.plot([intensity], [y], "o", label=f"{label}: {intensity:.0f} FLOP/B")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (FLOPs per byte read)",
        ylabel="attainable TFLOP/s",
        title=f"MLA decode on the roofline of an {gpu} (ridge at {ridge:.0f} FLOP/B)",
    )
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def streaming_reference(q, k, v, *, window: int, num_sinks: int):
    """StreamingLLM's definition as a naive loop: at step t the kept tokens (the first
    ``num_sinks`` and the last ``window``) form a fresh sequence at positions 0..n−1, the query
    at n−1. q, k (B, h, L, d) before RoPE, v (B, h, L, d_v) -> (B, h, L, d_v)."""
    from ..positions import apply_rope

    outs = []
    for t in range(q.shape[2]):
        kept = sorted(set(range(min(num_sinks, t + 1))) | set(range(max(0, t - window + 1), t + 1)))
        keys = apply_rope(k[:, :, kept], torch.arange(len(kept)))  # (B, h, n, d)
        query = apply_rope(q[:, :, t : t + 1], [len(kept) - 1])  # (B, h, 1, d)
        outs.append(F.scaled_dot_product_attention(query, keys, v[:, :, kept]))
    return torch.cat(outs, dim=2)  # (B, h, L, d_v)
