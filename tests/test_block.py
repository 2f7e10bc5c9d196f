"""mha_course.block against PyTorch's own transformer layers (copied weights, dropout 0)."""

import pytest
import torch
from torch import nn

import mha_course as mc
from mha_course.block import Encoder, EncoderBlock


def torch_layer(norm_first, activation, d_model=16, nhead=4, d_ff=24, seed=0):
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(
        d_model, nhead, d_ff, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    )
    with torch.no_grad():  # non-zero biases and LayerNorm affine parameters, so copying them matters
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return layer


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("training", [False, True])  # eval uses torch's fused fast path, train the Python path
def test_block_equals_torch_encoder_layer(norm_first, activation, training):
    layer = torch_layer(norm_first, activation).train(training)
    block = EncoderBlock.from_torch(layer).train(training)
    assert block.norm_first == norm_first and block.activation == activation
    x = torch.randn(3, 7, 16)
    pad = mc.padding_mask([7, 4, 1], 7)  # (B, 1, 1, L), True = real token
    cm = mc.causal_mask(7)
    with torch.no_grad():
        cases = [
            (block(x), layer(x)),
            (block(x, mask=pad), layer(x, src_key_padding_mask=~pad[:, 0, 0])),
            (block(x, mask=cm), layer(x, src_mask=~cm)),
        ]
    for got, expected in cases:
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_block_equals_a_formula_written_out():
    """Post-norm and pre-norm written with torch.nn.functional, independent of both modules."""
    layer = torch_layer(False, "relu")
    block = EncoderBlock.from_torch(layer).eval()
    x = torch.randn(2, 5, 16)
    a = layer.self_attn

    def attn(t):
        return a(t, t, t, need_weights=False)[0]

    def ffn(t):
        return layer.linear2(torch.relu(layer.linear1(t)))

    with torch.no_grad():
        post = layer.norm2(layer.norm1(x + attn(x)) + ffn(layer.norm1(x + attn(x))))
        torch.testing.assert_close(block(x), post, atol=1e-5, rtol=1e-5)
        block.norm_first = True
        h = x + attn(layer.norm1(x))
        torch.testing.assert_close(block(x), h + ffn(layer.norm2(h)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_stack_equals_torch_transformer_encoder(norm_first):
    layers = [torch_layer(norm_first, "gelu", seed=s) for s in range(3)]
    norm = nn.LayerNorm(16) if norm_first else None
    ref = nn.TransformerEncoder(layers[0], 3, norm=norm, enable_nested_tensor=False).eval()
    for i, layer in enumerate(layers):
        ref.layers[i].load_state_dict(layer.state_dict())
    ours = Encoder(3, 16, 4, 24, norm_first=norm_first, activation="gelu", causal=True).eval()
    for i, layer in enumerate(layers):
        ours.layers[i] = EncoderBlock.from_torch(layer).eval()
    x = torch.randn(2, 6, 16)
    pad = mc.padding_mask([6, 3], 6)
    with torch.no_grad():
        expected = ref(x, mask=~mc.causal_mask(6), src_key_padding_mask=~pad[:, 0, 0])
        torch.testing.assert_close(ours(x, mask=pad), expected, atol=1e-5, rtol=1e-5)


def test_block_is_permutation_equivariant_without_positions():
    block = EncoderBlock.from_torch(torch_layer(True, "relu")).eval()
    x = torch.randn(2, 9, 16)
    perm = torch.randperm(9)
    with torch.no_grad():
        torch.testing.assert_close(block(x[:, perm]), block(x)[:, perm], atol=1e-5, rtol=1e-5)
        pos = torch.randn(9, 16)  # a position signal breaks the symmetry
        assert (block(x[:, perm] + pos) - block(x + pos)[:, perm]).abs().max() > 0.1


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(TypeError, match="TransformerEncoderLayer"):
        EncoderBlock.from_torch(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="activation"):
        EncoderBlock(8, 2, 16, activation="tanh")
    with pytest.raises(ValueError, match="divisible"):
        EncoderBlock(10, 3, 16)
    with pytest.raises(ValueError, match="x must be 3-D"):
        EncoderBlock(8, 2, 16)(torch.randn(8))
