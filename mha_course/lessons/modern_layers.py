"""Notebook 15 (modern attention layers): the tiny training runs behind QK-norm and the output
gate, their measurements (logit range, entropy, first-token share, largest activation, intervals
over seeds), the soft-cap figure, and tiny random transformers models of the supported families.

The tiny model is notebook 12's :class:`~mha_course.lessons.beyond_gqa.TinyLM` (2 pre-norm
layers, d_model 32, 2 heads, BOS then a Markov chain with copy markers), with the attention
options of :class:`~mha_course.GroupedQueryAttention` switched on or off.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from ..kit.run_cache import advance, cached_run
from .beyond_gqa import TinyLM, markov_table, sample_sequences
from .tiny_training import fixed_threads

#: two-sided 95% quantiles of Student's t, by degrees of freedom (for intervals over a few seeds)
T_95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def _row_stats(weights: torch.Tensor) -> tuple[float, float]:
    """(largest logit range, mean entropy in nats) of attention weights (B, h, L, L), causal:
    the range max_j s_j − min_j s_j over a row's allowed keys is log(w_max / w_min), what the
    softmax sees of the scores (it ignores a shift). Rows with one key are left out."""
    allowed = torch.ones(weights.shape[-2:], dtype=torch.bool, device=weights.device).tril()  # (L, L)
    logw = weights.clamp_min(1e-300).log()  # (B, h, L, L)
    top = logw.masked_fill(~allowed, -math.inf).amax(-1)  # (B, h, L)
    bottom = logw.masked_fill(~allowed, math.inf).amin(-1)  # (B, h, L)
    entropy = -(weights * logw).sum(-1)  # (B, h, L)
    return (top - bottom)[..., 1:].max().item(), entropy[..., 1:].mean().item()


@cached_run(ignore=("progress",), seeds_itself=True, replay=lambda a: advance(a["progress"], a["steps"]))
def train(
    *,
    seed: int = 0,
    steps: int = 120,
    lr: float = 3e-3,
    batch_size: int = 32,
    record: bool = True,
    progress=None,
    **attention,
):
    """Train a tiny :class:`TinyLM` in float64 (AdamW, constant ``lr``) with the attention options
    ``attention`` (e.g. ``qk_norm=True``). Returns (model in eval mode, history) where history holds,
    per step, "loss", "logit range" (the largest over layers, heads and queries) and "entropy" (mean
    over them, nats) of the training batch (``record=False``: only the loss, faster). Deterministic
    for a seed (one thread)."""
    data = sample_sequences(markov_table(), steps * batch_size, seed=seed + 1)
    history = {"loss": [], "logit range": [], "entropy": []}
    with fixed_threads(), torch.random.fork_rng(devices=[]), torch.enable_grad():
        torch.manual_seed(seed)
        model = TinyLM(**attention).double()
        weights = []
        hooks = [layer.self_attn.register_forward_hook(lambda m, i, o: weights.append(o[1])) for layer in model.layers]
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        for step in range(steps):
            x = data[step * batch_size : (step + 1) * batch_size]  # (B, L)
            weights.clear()
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            history["loss"].append(loss.item())
            if record:
                stats = [_row_stats(w.detach()) for w in weights]
                history["logit range"].append(max(s[0] for s in stats))
                history["entropy"].append(sum(s[1] for s in stats) / len(stats))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if progress is not None:
                progress.update(1)
        for hook in hooks:
            hook.remove()
    return model.eval(), history


@torch.no_grad()
def sink_measures(model: TinyLM, tokens: torch.Tensor, *, from_position: int = 8) -> dict[str, float]:
    """What Qiu et al. (2025) measure, on ``tokens`` (n, L) with full causal attention:
    "first-token share": the attention the queries at positions ≥ ``from_position`` give position 0
    (BOS), averaged over layers, heads, queries and sequences; "largest activation": the largest
    |value| in the residual stream after any layer."""
    weights, hidden = [], []
    hooks = [layer.self_attn.register_forward_hook(lambda m, i, o: weights.append(o[1])) for layer in model.layers]
    hooks += [layer.register_forward_hook(lambda m, i, o: hidden.append(o)) for layer in model.layers]
    with fixed_threads():
        model(tokens)
    for hook in hooks:
        hook.remove()
    share = torch.stack([w[:, :, from_position:, 0].mean() for w in weights]).mean().item()
    return {"first-token share": share, "largest activation": max(h.abs().max().item() for h in hidden)}


def interval(values) -> tuple[float, float, float]:
    """(mean, low, high): the mean of a few measurements and its 95% Student-t interval."""
    x = torch.tensor([float(v) for v in values], dtype=torch.float64)
    n = len(x)
    if n < 2 or n - 1 not in T_95:
        raise ValueError(f"values must hold 2 to 10 measurements, got {n}")
    half = T_95[n - 1] * x.std(unbiased=True).item() / math.sqrt(n)
    return x.mean().item(), x.mean().item() - half, x.mean().item() + half


def draw_training(histories: dict[str, dict], *, lr: float):
    """Logit range and entropy over the training steps, one line per run."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for label, h in histories.items():
        left.plot(h["logit range"], label=label)
        right.plot(h["entropy"], label=label)
    left.set(xlabel="training step", ylabel="largest logit range (max − min score in a row)", yscale="log")
    left.set_title(f"Attention logits at learning rate {lr:g}")
    right.set(xlabel="training step", ylabel="mean attention entropy (nats)", title="Attention entropy")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


def draw_softcap(caps=(5.0, 20.0, 50.0), span: float = 80.0):
    """s against c · tanh(s / c) for a few caps c: the identity near 0, flat at ±c."""
    s = torch.linspace(-span, span, 401)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(s, s, color="grey", linestyle="--", label="no cap (s)")
    for c in caps:
        ax.plot(s, c * torch.tanh(s / c), label=f"cap {c:g}: {c:g}·tanh(s/{c:g})")
    ax.set(xlabel="score s (after scaling)", ylabel="capped score", title="Soft-capping bounds every score")
    ax.set_ylim(-span / 1.5, span / 1.5)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# tiny random transformers models of the families attention_from_hf reads


def tiny_configs() -> dict:
    """Tiny configs (d_model 32, 4 heads, 2 K/V heads) of Llama 3.1 (llama3 rope scaling), Qwen3,
    Qwen3-Next (3 linear-attention layers, then one full one), Gemma 2 and gpt-oss (a sliding layer,
    then a full one); eager attention, so that Gemma 2's soft-cap is applied."""
    import transformers as tf

    small = dict(vocab_size=32, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)
    llama3 = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
    configs = {
        "Llama 3.1": tf.LlamaConfig(
            **small, num_hidden_layers=1, rope_parameters=llama3 | {"original_max_position_embeddings": 8}
        ),
        "Qwen3": tf.Qwen3Config(**small, num_hidden_layers=1, head_dim=16),
        "Qwen3-Next": tf.Qwen3NextConfig(
            **small,
            num_hidden_layers=4,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=16,
            linear_num_value_heads=2,
            linear_num_key_heads=2,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
        ),
        "Gemma 2": tf.Gemma2Config(
            **small,
            num_hidden_layers=2,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=4,
            attn_logit_softcapping=5.0,
        ),
        "gpt-oss": tf.GptOssConfig(
            **small | {"intermediate_size": 32},
            num_hidden_layers=2,
            head_dim=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=4,
            attention_bias=True,
        ),
    }
    for c in configs.values():
        c._attn_implementation = "eager"
    return configs


def tiny_model(config, *, seed: int = 0):
    """A transformers causal LM built from ``config`` (random weights, nothing downloaded), in
    float32 and eval mode; every attention weight redrawn at a scale where scores are far from 0
    (so soft-caps, gates and norms all matter)."""
    import transformers as tf

    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "self_attn" in name:
                p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 0.5))
    return model


@torch.no_grad()
def hf_attention_output(model, layer_idx: int, x: torch.Tensor) -> torch.Tensor:
    """The output of ``model.model.layers[layer_idx].self_attn`` for x (B, L, d_model) at positions
    0…L−1, with the model's own rotary embedding and its causal (or sliding-window) mask from
    ``transformers.masking_utils``."""
    from transformers import masking_utils

    attn = model.model.layers[layer_idx].self_attn
    L = x.shape[1]
    cos_sin = model.model.rotary_emb(x, torch.arange(L)[None])
    window = getattr(attn, "sliding_window", None)
    if window is None:
        allowed_fn = masking_utils.causal_mask_function
    else:
        allowed_fn = masking_utils.sliding_window_causal_mask_function(window)
    allowed = allowed_fn(0, 0, torch.arange(L)[:, None], torch.arange(L)[None, :])  # (L, L) bool
    additive = torch.zeros(L, L, dtype=x.dtype).masked_fill(~allowed, torch.finfo(x.dtype).min)
    return attn(x, position_embeddings=cos_sin, attention_mask=additive[None, None])[0]  # (B, L, d_model)


def attention_layers(model) -> list[int]:
    """Indices of the layers of ``model`` that have softmax attention (``self_attn``)."""
    return [i for i, layer in enumerate(model.model.layers) if hasattr(layer, "self_attn")]
