"""What the notebooks say about PyTorch's own behaviour, checked on the PyTorch installed.

CI runs this file under every PyTorch it tests (the main run's 2.13 and .ci/matrix's Colab 2.11 and
the oldest supported, 2.6), so a statement that holds on only part of the supported range fails
here rather than in a learner's notebook:

* notebook 05 (fully masked rows): which APIs give NaN and which give zeros for a query row that
  may attend to nothing (SDPA has given zeros since pytorch/pytorch#133882, in 2.5);
* notebook 09 (SDPA on the CPU): the kernels each backend runs and what their peak memory is in
  score matrices (the math backend's exact peak is version-dependent: 2.53 score matrices on
  2.11-2.13, 3.53 on 2.5; the bounds below hold on all).
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import mha_course as mc
from mha_course.kit.memory import peak_memory
from mha_course.lessons import mask_lab
from mha_course.lessons.head_layout import kernels_called

FLASH = "_scaled_dot_product_flash_attention_for_cpu"


@pytest.fixture
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # as notebook 09 runs: memory counts that do not depend on the CPU
    yield
    torch.set_num_threads(previous)


def _first_row(out: torch.Tensor) -> str:
    row = out[..., 0, :]
    return "nan" if row.isnan().any() else "zeros" if (row == 0).all() else "other"


def test_a_fully_masked_row_is_nan_or_zeros_as_notebook_05_says():
    torch.manual_seed(2)
    mask = mc.causal_mask(5) & torch.tensor([False, False, True, True, True])  # rows 0, 1 see nothing
    x = torch.randn(1, 5, 4)
    layer_t = mc.MultiHeadAttention(4, num_heads=1, bias=False).to_torch()
    q, k, v = torch.randn(3, 1, 1, 5, 4).unbind(0)
    scores = q @ k.transpose(-2, -1) / 2
    additive = mask_lab.convert(mask, "course", "additive")
    got = {
        "hand, -inf": _first_row(torch.softmax(scores.masked_fill(~mask, -torch.inf), -1) @ v),
        "hand, -1e9": _first_row(torch.softmax(scores.masked_fill(~mask, -1e9), -1) @ v),
        "SDPA, bool": _first_row(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)),
        "SDPA, additive": _first_row(F.scaled_dot_product_attention(q, k, v, attn_mask=additive)),
        "MHA, weights": _first_row(layer_t(x, x, x, attn_mask=~mask)[0]),
        "MHA, no weights": _first_row(layer_t(x, x, x, attn_mask=~mask, need_weights=False)[0]),
    }
    assert got == {
        "hand, -inf": "nan",
        "hand, -1e9": "other",  # a uniform average over every key, blocked ones included
        "SDPA, bool": "zeros",
        "SDPA, additive": "zeros",
        "MHA, weights": "nan",
        "MHA, no weights": "zeros",
    }, f"torch {torch.__version__}"


def test_sdpa_kernels_and_their_memory_as_notebook_09_says(one_thread):
    B, h, L, d_head = 1, 4, 1024, 32
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, h, L, d_head, generator=g) for _ in range(3))
    score_matrix = B * h * L * L * 4
    with torch.no_grad():
        causal = partial(F.scaled_dot_product_attention, q, k, v, is_causal=True)
        assert kernels_called(causal) == [FLASH], "the default choice on the CPU is the flash kernel"
        with sdpa_kernel(SDPBackend.MATH):
            assert kernels_called(causal) == ["bmm", "_safe_softmax", "bmm"]
            math_peak = peak_memory(causal)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            flash_peak = peak_memory(causal)
        assert 2 * score_matrix < math_peak < 4 * score_matrix, math_peak / score_matrix
        assert flash_peak < 0.1 * score_matrix, flash_peak / score_matrix

        with_mask = partial(F.scaled_dot_product_attention, q, k, v, attn_mask=mc.causal_mask(L))
        ran = kernels_called(with_mask, keep=None)
        assert ran[-1] == FLASH and "where" in ran, ran  # the bool mask becomes a float one, then flash
        mask_bytes = L * L * 4
        assert peak_memory(with_mask) == pytest.approx(mask_bytes + peak_memory(causal), rel=0.01)
