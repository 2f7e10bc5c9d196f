"""mha_course.kit.verify.proof_line: the verdict follows the real error, and only the bound is printed."""

import torch

from mha_course.kit.verify import proof_line


def test_bitwise_claims():
    a = torch.ones(3)
    assert proof_line("same", a, a.clone(), exact=True) == "✅ passed · same: bitwise identical"
    assert proof_line("copy?", a, a + 2**-20, exact=True).startswith("❌ failed · copy?: not bitwise identical")


def test_bounded_claims_print_the_bound_not_the_error():
    a = torch.ones(3)
    assert proof_line("close", a, a + 2**-22) == "✅ passed · close: max abs error < 1e-06"
    assert proof_line("same", a, a.clone()) == "✅ passed · same: max abs error < 1e-06"
    assert proof_line("loose", a, a + 1e-4, bound=1e-3) == "✅ passed · loose: max abs error < 1e-03"
    assert proof_line("far", a, a + 0.25) == "❌ failed · far: max abs error 2.50e-01 (bound 1e-06)"


def test_nan_and_shape_mismatch_fail():
    a = torch.ones(3)
    assert proof_line("nan", a * float("nan"), a).startswith("❌")
    assert "shapes differ" in proof_line("shape", a, torch.ones(4))
    assert proof_line("empty", torch.ones(0), torch.ones(0)).startswith("✅")


def test_a_rounding_error_of_a_real_computation_passes():
    torch.manual_seed(0)
    x, w = torch.randn(7, 16), torch.randn(16, 8)
    by_columns = torch.cat([x @ w[:, :4], x @ w[:, 4:]], dim=1)
    assert proof_line("blocks", by_columns, (x.double() @ w.double()).float()).startswith("✅")
