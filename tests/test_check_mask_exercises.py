"""The checkers of notebook 05's new exercises: to_torch_masks (5.3) and leaks_future (5.4).
Correct variants pass, each listed mistake is named, an unattempted exercise is 'not attempted'."""

import pytest
import torch

import mha_course as mc
from mha_course.check import leakage, torch_masks
from mha_course.lessons import mask_lab

# ---------------------------------------------------------------------------------------------
# 5.3: the course's masks -> nn.MultiheadAttention's attn_mask and key_padding_mask


def invert_both(mask, pad):
    return ~mask, ~pad[:, 0, 0, :]


def logical_not_and_squeeze(mask, pad):
    return torch.logical_not(mask), (pad == 0).squeeze(1).squeeze(1)


def additive_attn_mask(mask, pad):
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))  # 0 / -inf, added to the scores
    return additive, mask_lab.course_to_key_padding(pad)


def everything_in_one_float_mask(mask, pad):  # (B*h, L, L): one additive mask, no key_padding_mask
    both = (mask & pad).expand(pad.shape[0], torch_masks.NUM_HEADS, *mask.shape)
    both = both.reshape(-1, *mask.shape)
    return torch.zeros(both.shape).masked_fill(~both, float("-inf")), None


@pytest.mark.parametrize("fn", [invert_both, logical_not_and_squeeze, additive_attn_mask, everything_in_one_float_mask])
def test_to_torch_masks_correct_variants_pass(fn):
    result = mc.check.to_torch_masks(fn)
    assert result.passed, result


WRONG_MASKS = {
    "not inverted": lambda mask, pad: (mask, pad[:, 0, 0]),
    "padding not inverted": lambda mask, pad: (~mask, pad[:, 0, 0]),
    "attn_mask not inverted": lambda mask, pad: (mask, ~pad[:, 0, 0]),
    "transposed": lambda mask, pad: (~mask.T, ~pad[:, 0, 0]),
}


@pytest.mark.parametrize("mistake", torch_masks.TO_TORCH_MASKS_MISTAKES, ids=lambda m: m.name)
def test_to_torch_masks_each_mistake_is_diagnosed(mistake):
    result = mc.check.to_torch_masks(WRONG_MASKS[mistake.name])
    assert result.message == f"to_torch_masks: likely mistake — {mistake.diagnosis}", result


def test_to_torch_masks_not_attempted_and_a_crash_is_reported():
    def todo(mask, pad):
        raise NotImplementedError

    assert mc.check.to_torch_masks(todo).status == "not attempted"
    swapped = mc.check.to_torch_masks(lambda mask, pad: (~pad[:, 0, 0], ~mask))  # arguments swapped: torch raises
    assert swapped.status == "failed"
    assert set(WRONG_MASKS) == {m.name for m in torch_masks.TO_TORCH_MASKS_MISTAKES}


# ---------------------------------------------------------------------------------------------
# 5.4: a leakage test


def every_split_exactly(layer, x):
    def out(y):
        y = layer(y)
        return y[0] if isinstance(y, tuple) else y

    base = out(x)
    for t in range(x.shape[1] - 1):
        changed = x.clone()
        changed[:, t + 1 :] = torch.randn_like(changed[:, t + 1 :])
        if not torch.equal(out(changed)[:, : t + 1], base[:, : t + 1]):
            return True
    return False


def one_position_at_a_time(layer, x):
    """Perturb each input position j alone; any output i < j that moves is a leak."""

    def out(y):
        y = layer(y)
        return y[0] if isinstance(y, (tuple, list)) else y

    base = out(x)
    for j in range(1, x.shape[1]):
        changed = x.clone()
        changed[:, j] += 1.0
        if (out(changed)[:, :j] - base[:, :j]).abs().max() > 1e-7:
            return True
    return False


def with_the_course_tool(layer, x):
    return mask_lab.leaks(layer, x)


@pytest.mark.parametrize("fn", [every_split_exactly, one_position_at_a_time, with_the_course_tool])
def test_leaks_future_correct_variants_pass(fn):
    result = mc.check.leaks_future(fn)
    assert result.passed, result


@pytest.mark.parametrize("mistake", leakage.LEAKS_FUTURE_MISTAKES, ids=lambda m: m.name)
def test_leaks_future_each_mistake_is_diagnosed(mistake):
    wrong = {
        "all outputs": leakage._all_outputs,
        "last input only": leakage._last_input_only,
        "first output only": leakage._first_output_only,
        "loose tolerance": leakage._loose_tolerance,
    }[mistake.name]
    result = mc.check.leaks_future(wrong)
    assert result.message == f"leaks_future: likely mistake — {mistake.diagnosis}", result


def test_leaks_future_known_answers_are_right():
    """The cases' answers come from how each layer is built; the course's leakage test agrees."""
    g = torch.Generator().manual_seed(0)
    for layer in leakage._layers():
        assert mask_lab.leaks(layer, torch.randn(2, leakage.L, leakage.D_MODEL, generator=g)) == layer.leaks, layer


def test_leaks_future_not_attempted():
    def todo(layer, x):
        raise NotImplementedError

    assert mc.check.leaks_future(todo).status == "not attempted"


# ---------------------------------------------------------------------------------------------
# the source tutorial's encoder layer


@torch.no_grad()
def test_the_seed_encoder_layer_ignores_its_mask_and_the_fixed_one_is_causal():
    torch.manual_seed(0)
    seed_layer = mask_lab.MaskIgnoringEncoderLayer(16, 2, 32).eval()
    fixed = mask_lab.MaskRespectingEncoderLayer(16, 2, 32).eval()
    fixed.load_state_dict(seed_layer.state_dict())
    x = torch.randn(6, 2, 16)  # (L, B, d_model): sequence-first, as the source uses it
    causal = torch.tril(torch.ones(6, 6)).bool()  # the source's create_causal_mask: True = may attend
    assert torch.equal(seed_layer(x, src_mask=causal), seed_layer(x))
    assert mask_lab.leaks(lambda s: seed_layer(s, src_mask=causal), x, dim=0)
    assert not mask_lab.leaks(lambda s: fixed(s, src_mask=causal), x, dim=0)
    torch.testing.assert_close(fixed(x), seed_layer(x))  # without a mask they are the same layer
    reference = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0).eval()  # post-norm, ReLU, seq-first
    reference.load_state_dict(fixed.state_dict())  # the same parameter names
    torch.testing.assert_close(fixed(x, src_mask=causal), reference(x, src_mask=~causal), atol=1e-5, rtol=1e-4)
