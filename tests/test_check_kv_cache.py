"""The write_kv checker (Exercise 6.1): correct variants pass, each listed mistake is named,
an unattempted exercise is 'not attempted'."""

import pytest
import torch

import mha_course as mc
from mha_course.check import kv_cache as checker


def slices(k_cache, v_cache, k, v, length):
    end = length + k.shape[2]
    k_cache[:, :, length:end] = k
    v_cache[:, :, length:end] = v
    return k_cache[:, :, :end], v_cache[:, :, :end]


def narrow_copy(k_cache, v_cache, k, v, length):
    n = k.shape[2]
    k_cache.narrow(2, length, n).copy_(k)
    v_cache.narrow(2, length, n).copy_(v)
    return k_cache.narrow(2, 0, length + n), v_cache.narrow(2, 0, length + n)


def index_copy(k_cache, v_cache, k, v, length):
    where = torch.arange(length, length + k.shape[2])
    k_cache.index_copy_(2, where, k)
    v_cache.index_copy_(2, where, v)
    return k_cache[..., : length + k.shape[2], :], v_cache[..., : length + k.shape[2], :]


def one_position_at_a_time(k_cache, v_cache, k, v, length):
    for i in range(k.shape[2]):
        k_cache[:, :, length + i] = k[:, :, i]
        v_cache[:, :, length + i] = v[:, :, i]
    return k_cache[:, :, : length + k.shape[2]], v_cache[:, :, : length + k.shape[2]]


@pytest.mark.parametrize("fn", [slices, narrow_copy, index_copy, one_position_at_a_time, mc.kv_cache.write_kv])
def test_correct_variants_pass(fn):
    result = mc.check.write_kv(fn)
    assert result.passed, result


def test_the_library_cache_agrees_with_the_reference_the_checker_uses():
    """The checker's reference is a full causal pass; the library's preallocated cache must match it."""
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out, keys, _ = checker._full_recomputation(x, 3, 8, 2)
        layer = checker._layer(8, 2)
        cache = mc.KVCache(max_length=8)
        steps = [layer(x[:, :3], cache=cache, is_causal=True)[0]]
        steps += [layer(x[:, t : t + 1], cache=cache)[0] for t in range(3, 6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), out, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(cache.keys, keys[:, :, :6])


WRONG = {
    "copies": checker._copies,
    "concatenates": checker._concatenates,
    "whole buffer": checker._whole_buffer,
    "writes at 0": checker._writes_at_start,
    "only new": checker._only_new,
}


@pytest.mark.parametrize("mistake", checker.WRITE_KV_MISTAKES, ids=lambda m: m.name)
def test_each_mistake_is_diagnosed(mistake):
    result = mc.check.write_kv(WRONG[mistake.name])
    assert not result.passed
    assert result.message == f"write_kv: likely mistake — {mistake.diagnosis}", result


def test_mistakes_list_covers_the_wrong_functions():
    assert {m.name for m in checker.WRITE_KV_MISTAKES} == set(WRONG) and len(WRONG) >= 3


def test_not_attempted_and_not_a_function():
    def todo(k_cache, v_cache, k, v, length):
        raise NotImplementedError

    assert mc.check.write_kv(todo).status == "not attempted"
    assert "expected your function" in mc.check.write_kv(None).message


def test_a_crashing_function_is_reported_not_raised():
    def crash(k_cache, v_cache, k, v, length):
        return k[None], v  # 5-D: attention cannot run on it

    result = mc.check.write_kv(crash)
    assert result.status == "failed"
