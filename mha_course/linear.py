"""Linear attention with the gated delta rule (Gated DeltaNet; Yang et al. 2024,
https://arxiv.org/abs/2412.06464), the linear-attention layer of Qwen3-Next and, with a
per-channel gate, of Kimi Linear.

Instead of a cache that grows by one key and one value per token, each value head keeps a state
S (d_k, d_v) of fixed size. At every step t (queries scaled by 1/√d_k):

    S ← exp(g_t) · S                      forget a little (g_t ≤ 0 is the log-decay)
    S ← S + β_t · k_t (v_t − Sᵀ k_t)ᵀ     the delta rule: write only what S mispredicts for k_t
    o_t = Sᵀ q_t

``gated_delta_rule(..., chunk_size=None)`` runs that loop; with a ``chunk_size`` it computes the
same outputs a chunk at a time, the steps inside a chunk as a few matrix products.
"""

from __future__ import annotations

import torch

from . import validation


def _check(q, k, v, g, beta, initial_state):
    for name, t, dims in (("q", q, 4), ("k", k, 4), ("v", v, 4), ("g", g, 3), ("beta", beta, 3)):
        validation.tensor(name, t, dims=dims, floating=True)
    B, h_k, L, d_k = k.shape
    h_v, d_v = v.shape[1], v.shape[-1]
    if tuple(q.shape) != tuple(k.shape):
        raise ValueError(f"q and k must both be (B, h_k, L, d_k), got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if v.shape[0] != B or v.shape[2] != L:
        raise ValueError(f"v must be (B={B}, h_v, L={L}, d_v), got {tuple(v.shape)}")
    if h_v % h_k:
        raise ValueError(f"the value heads h_v={h_v} are not a multiple of the key heads h_k={h_k}")
    for name, t in (("g", g), ("beta", beta)):
        if tuple(t.shape) != (B, h_v, L):
            raise ValueError(f"{name} must be (B, h_v, L) = {(B, h_v, L)}, got {tuple(t.shape)}")
    if (g > 0).any():
        raise ValueError(
            f"g is a log-decay and must be <= 0 (the state is multiplied by exp(g) <= 1), got max {g.max().item():.3g}"
        )
    if initial_state is not None:
        validation.tensor("initial_state", initial_state, dims=4, floating=True)
        if tuple(initial_state.shape) != (B, h_v, d_k, d_v):
            raise ValueError(
                f"initial_state must be (B, h_v, d_k, d_v) = {(B, h_v, d_k, d_v)}, got {tuple(initial_state.shape)}"
            )


def delta_rule_step(state, q_t, k_t, v_t, g_t, beta_t):
    """One step of the gated delta rule. state (..., d_k, d_v); q_t, k_t (..., d_k) (q_t already
    scaled); v_t (..., d_v); g_t, beta_t (...). Returns (new state, output o_t (..., d_v))."""
    state = state * g_t.exp()[..., None, None]  # (..., d_k, d_v): decay first
    predicted = (state * k_t[..., :, None]).sum(-2)  # (..., d_v): Sᵀ k_t, what S recalls for k_t
    delta = beta_t[..., None] * (v_t - predicted)  # (..., d_v): the correction to write
    state = state + k_t[..., :, None] * delta[..., None, :]  # (..., d_k, d_v): + k_t δᵀ
    return state, (state * q_t[..., :, None]).sum(-2)  # (..., d_v): o_t = Sᵀ q_t


def _recurrent(q, k, v, g, beta, state):
    out = torch.empty_like(v)  # (B, h_v, L, d_v)
    for t in range(v.shape[2]):
        state, out[:, :, t] = delta_rule_step(state, q[:, :, t], k[:, :, t], v[:, :, t], g[:, :, t], beta[:, :, t])
    return out, state


def _chunked(q, k, v, g, beta, state, chunk_size):
    """The same recurrence, C steps at once. Inside a chunk, with G_t = Σ_{s≤t} g_s (from its start)
    and S₀ the state entering it, the written corrections U = (u_1 … u_C) solve
        (I + A) U = diag(β) (V − diag(e^G) K S₀),   A_ts = β_t e^{G_t − G_s} k_t·k_s  (s < t),
    the outputs are O = diag(e^G) Q S₀ + ((Q Kᵀ) ⊙ e^{G_t − G_s}, s ≤ t) U, and the state leaving
    it is e^{G_C} S₀ + (e^{G_C − G} ⊙ K)ᵀ U."""
    out = torch.empty_like(v)  # (B, h_v, L, d_v)
    for start in range(0, v.shape[2], chunk_size):
        c = slice(start, start + chunk_size)
        qc, kc, vc, bc = q[:, :, c], k[:, :, c], v[:, :, c], beta[:, :, c]  # (B, h_v, C, ·)
        G = g[:, :, c].cumsum(-1)  # (B, h_v, C): log of the decay since the chunk began
        C = G.shape[-1]
        causal = torch.ones(C, C, dtype=torch.bool, device=v.device).tril()  # s ≤ t
        decay = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # (B, h_v, C, C)
        A = (bc[..., None] * (kc @ kc.transpose(-1, -2)) * decay).tril(-1)  # (B, h_v, C, C), s < t
        rhs = bc[..., None] * (vc - G.exp()[..., None] * (kc @ state))  # (B, h_v, C, d_v)
        eye = torch.eye(C, dtype=v.dtype, device=v.device)
        U = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)  # (B, h_v, C, d_v)
        out[:, :, c] = G.exp()[..., None] * (qc @ state) + ((qc @ kc.transpose(-1, -2)) * decay) @ U
        to_end = (G[..., -1:] - G).exp()[..., None]  # (B, h_v, C, 1): decay from step s to the chunk's end
        state = G[..., -1].exp()[..., None, None] * state + (to_end * kc).transpose(-1, -2) @ U
    return out, state


def gated_delta_rule(q, k, v, g, beta, *, chunk_size=None, initial_state=None):
    """The gated delta rule over a sequence: returns out (B, h_v, L, d_v) and the final state
    (B, h_v, d_k, d_v).

    q, k (B, h_k, L, d_k); v (B, h_v, L, d_v) with h_v a multiple of h_k: query/key head i serves
    the consecutive value heads i·r … i·r + r − 1 (r = h_v / h_k); g (B, h_v, L) log-decay ≤ 0;
    beta (B, h_v, L) the write strength (in (0, 1) in the models); initial_state (B, h_v, d_k, d_v)
    or None (zeros). The queries are scaled by 1/√d_k inside, as transformers does; q and k are
    used as given — Qwen3-Next L2-normalises them first (``use_qk_l2norm_in_kernel=True``), which
    keeps the delta rule stable (β·‖k‖² ≤ 1 makes each write a projection).
    ``chunk_size=None`` runs the step-by-step recurrence; an int runs the chunked form (any L,
    the last chunk may be shorter). Both equal transformers' ``torch_recurrent_gated_delta_rule`` /
    ``torch_chunk_gated_delta_rule`` (which take (B, L, h, d) and compute in float32) and each other.
    """
    _check(q, k, v, g, beta, initial_state)
    if chunk_size is not None:
        validation.positive_int("chunk_size", chunk_size)
    B, h_k, L, d_k = k.shape
    r = v.shape[1] // h_k
    q = q.repeat_interleave(r, dim=1) * d_k**-0.5  # (B, h_v, L, d_k)
    k = k.repeat_interleave(r, dim=1)  # (B, h_v, L, d_k)
    if initial_state is None:
        state = v.new_zeros(B, v.shape[1], d_k, v.shape[-1])  # (B, h_v, d_k, d_v)
    else:
        state = initial_state.to(v.dtype)
    if chunk_size is None:
        return _recurrent(q, k, v, g, beta, state)
    return _chunked(q, k, v, g, beta, state, chunk_size)


def linear_attention(q, k, v, *, feature_map=None):
    """Causal linear attention (Katharopoulos et al. 2020, https://arxiv.org/abs/2006.16236):
    o_t = φ(q_t)ᵀ S_t / φ(q_t)ᵀ z_t with S_t = Σ_{s≤t} φ(k_s) v_sᵀ and z_t = Σ_{s≤t} φ(k_s).

    q, k (..., L, d_k), v (..., L, d_v); feature_map φ defaults to elu(x) + 1 (positive).
    Equal to softmax attention with the kernel φ(q)·φ(k) in place of exp(q·k), row-normalised and
    causal: (φ(Q) φ(K)ᵀ ⊙ causal) V / row sums. Returns (..., L, d_v).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        validation.tensor(name, t, floating=True)
    phi = feature_map or (lambda x: torch.nn.functional.elu(x) + 1)
    fq, fk = phi(q), phi(k)  # (..., L, d_k)
    S = torch.cumsum(fk[..., :, None] * v[..., None, :], dim=-3)  # (..., L, d_k, d_v): S_t for every t
    z = torch.cumsum(fk, dim=-2)  # (..., L, d_k)
    num = (fq[..., None] * S).sum(-2)  # (..., L, d_v)
    return num / (fq * z).sum(-1, keepdim=True)  # (..., L, d_v)
