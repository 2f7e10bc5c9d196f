"""Attention inside a transformer: the encoder block (notebook 10).

An encoder block wraps ``mc.MultiHeadAttention`` with the two other ingredients of a transformer
layer: a position-wise feed-forward network (FFN) and, around each of the two sub-layers, a
residual connection and a LayerNorm. Two orders exist::

    post-norm (Vaswani et al. 2017, BERT):     x = norm1(x + attn(x));   x = norm2(x + ffn(x))
    pre-norm  (GPT-2 and most modern models):  x = x + attn(norm1(x));   x = x + ffn(norm2(x))

:class:`EncoderBlock` is equivalent to ``torch.nn.TransformerEncoderLayer(batch_first=True)``
(``norm_first`` False or True) with the mask convention inverted: ours is bool, True = may
attend; torch's ``src_mask``/``src_key_padding_mask`` use True = blocked. ``from_torch`` copies
a torch layer's weights. :class:`Encoder` stacks blocks, optionally causal.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import validation
from .masks import causal_mask
from .multihead import MultiHeadAttention

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


class EncoderBlock(nn.Module):
    """One transformer encoder layer built from the course's multi-head attention.

    Args:
        d_model: model width; num_heads: h (d_model must be divisible by h).
        d_ff: hidden width of the feed-forward network (typically 4·d_model).
        norm_first: False = post-norm (the original paper), True = pre-norm (modern models).
        activation: "relu" or "gelu" (the FFN's non-linearity).
        dropout: on the attention weights, the FFN hidden layer and each sub-layer's output
            (only while training); layer_norm_eps: LayerNorm's epsilon; bias: biases in every
            Linear and LayerNorm.

    ``forward(x, *, mask=None) -> x``: x (B, L, d_model) -> (B, L, d_model). ``mask``: bool,
    True = may attend, (L, L) or broadcastable to (B, h, L, L), e.g. ``mc.padding_mask``'s
    (B, 1, 1, L). The attention weights are not returned: read them with a forward hook on
    ``self_attn`` (see ``mha_course.diagnostics.capture_attention``).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        *,
        norm_first: bool = False,
        activation: str = "relu",
        dropout: float = 0.0,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
    ):
        super().__init__()
        validation.positive_int("d_ff", d_ff)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.norm_first, self.activation = bool(norm_first), activation
        self.self_attn = MultiHeadAttention(d_model, num_heads, bias=bias, dropout=dropout)
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)  # (d_model -> d_ff)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)  # (d_ff -> d_model)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def _attention(self, x, mask):
        out, _ = self.self_attn(x, mask=mask)  # (B, L, d_model); weights (B, h, L, L) go to hooks
        return self.dropout(out)

    def _feed_forward(self, x):
        hidden = ACTIVATIONS[self.activation](self.linear1(x))  # (B, L, d_ff): each position alone
        return self.dropout(self.linear2(self.dropout(hidden)))  # (B, L, d_model)

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
        validation.tensor("x", x, dims=3, floating=True)
        if self.norm_first:  # pre-norm: the residual stream itself is never normalised
            x = x + self._attention(self.norm1(x), mask)  # (B, L, d_model)
            return x + self._feed_forward(self.norm2(x))
        x = self.norm1(x + self._attention(x, mask))  # post-norm: normalise after each sum
        return self.norm2(x + self._feed_forward(x))

    @classmethod
    @torch.no_grad()
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> EncoderBlock:
        """A block with the weights of ``layer`` (a ``torch.nn.TransformerEncoderLayer``, either
        ``batch_first``), computing the same function batch-first. Pass our mask where torch
        takes ``src_mask=~mask`` or ``src_key_padding_mask`` (True = padding)."""
        if not isinstance(layer, nn.TransformerEncoderLayer):
            raise TypeError(f"layer must be a torch.nn.TransformerEncoderLayer, got {type(layer).__name__}")
        code = getattr(layer, "activation_relu_or_gelu", 0)
        if code not in (1, 2):
            raise ValueError("layer uses an activation other than relu or gelu, which EncoderBlock does not model")
        attn = layer.self_attn
        block = cls(
            attn.embed_dim,
            attn.num_heads,
            layer.linear1.out_features,
            norm_first=layer.norm_first,
            activation="relu" if code == 1 else "gelu",
            dropout=layer.dropout.p,
            layer_norm_eps=layer.norm1.eps,
            bias=layer.linear1.bias is not None,
        ).to(layer.linear1.weight)
        block.self_attn = MultiHeadAttention.from_torch(attn)
        for name in ("linear1", "linear2", "norm1", "norm2"):
            getattr(block, name).load_state_dict(getattr(layer, name).state_dict())
        return block


class Encoder(nn.Module):
    """A stack of ``num_layers`` :class:`EncoderBlock` s (keyword arguments are passed on).

    ``causal=True`` makes it a decoder-only (GPT-style) stack: every block gets the causal
    mask, combined with the caller's mask. Pre-norm stacks end with a final LayerNorm (as
    GPT-2 and Llama do), post-norm stacks do not need one.

    ``forward(x, *, mask=None) -> x``: x (B, L, d_model); mask bool, True = may attend,
    (L, L) or broadcastable to (B, h, L, L).
    """

    def __init__(self, num_layers: int, d_model: int, num_heads: int, d_ff: int, *, causal: bool = False, **kwargs):
        super().__init__()
        validation.positive_int("num_layers", num_layers)
        self.causal = bool(causal)
        self.layers = nn.ModuleList(EncoderBlock(d_model, num_heads, d_ff, **kwargs) for _ in range(num_layers))
        norm_first = kwargs.get("norm_first", False)
        self.norm = nn.LayerNorm(d_model, eps=kwargs.get("layer_norm_eps", 1e-5)) if norm_first else nn.Identity()

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
        validation.tensor("x", x, dims=3, floating=True)
        if self.causal:
            future = causal_mask(x.shape[1], device=x.device)  # (L, L), True = may attend
            mask = future if mask is None else mask & future  # broadcasts to (B, 1|h, L, L)
        for layer in self.layers:
            x = layer(x, mask=mask)  # (B, L, d_model)
        return self.norm(x)
