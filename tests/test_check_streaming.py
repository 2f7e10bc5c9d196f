"""Checkers of notebook 12's learned sinks and StreamingLLM positions: correct variants pass, each
listed mistake is named, an unfinished exercise is "not attempted" and a raising one never raises."""

import pytest
import torch

import mha_course as mc

# --- sink_softmax ------------------------------------------------------------------------------


def _sink_column(scores, sinks):
    return sinks[:, None, None].to(scores.dtype).expand(*scores.shape[:-1], 1)


def sink_cat(scores, sinks):
    return torch.cat([scores, _sink_column(scores, sinks)], dim=-1).softmax(-1)[..., :-1]


def sink_logsumexp(scores, sinks):
    lse = torch.logsumexp(torch.cat([scores, _sink_column(scores, sinks)], dim=-1), dim=-1, keepdim=True)
    return torch.exp(scores - lse)


def sink_gate(scores, sinks):  # the plain softmax, scaled by the share the keys keep
    keys = torch.logsumexp(scores, dim=-1, keepdim=True)
    return scores.softmax(-1) * torch.sigmoid(keys - sinks[:, None, None])


def sink_manual(scores, sinks):
    m = torch.maximum(scores.amax(-1, keepdim=True), _sink_column(scores, sinks))
    e = torch.exp(scores - m)
    return e / (e.sum(-1, keepdim=True) + torch.exp(_sink_column(scores, sinks) - m))


@pytest.mark.parametrize("fn", [sink_cat, sink_logsumexp, sink_gate, sink_manual])
def test_sink_softmax_accepts_correct_variants(fn):
    result = mc.check.sink_softmax(fn)
    assert result.passed, result


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda s, k: s.softmax(-1), "every row sums to 1"),
        (lambda s, k: sink_cat(s, k) / sink_cat(s, k).sum(-1, keepdim=True), "every row sums to 1"),
        (
            lambda s, k: torch.cat([s, _sink_column(s, k)], dim=-1).softmax(-1)[..., 1:],
            "first key's weight is missing",
        ),
        (
            lambda s, k: torch.cat([s, k[:, None].expand(*s.shape[:-1], 1)], dim=-1).softmax(-1)[..., :-1],
            "along the query axis",
        ),
        (
            lambda s, k: torch.cat([s, k[0].expand(*s.shape[:-1], 1)], dim=-1).softmax(-1)[..., :-1],
            "first head's sink",
        ),
        (
            lambda s, k: s.exp() / (s.exp().sum(-1, keepdim=True) + k.exp()[:, None, None]),
            "exp(100) overflows float32",
        ),
    ],
)
def test_sink_softmax_names_mistakes(fn, words):
    result = mc.check.sink_softmax(fn)
    assert not result.passed and "likely mistake" in result.message and words in result.message, result


def test_sink_softmax_not_attempted_and_raising():
    def todo(scores, sinks):
        raise NotImplementedError

    assert mc.check.sink_softmax(todo).status == "not attempted"
    result = mc.check.sink_softmax(lambda s, k: torch.cat([s, k], dim=-1))
    assert not result.passed and "RuntimeError" in result.message


# --- cache_positions ---------------------------------------------------------------------------


def positions_loop(positions):
    order = sorted(int(p) for p in positions if p >= 0)
    return torch.tensor([order.index(int(p)) if p >= 0 else -1 for p in positions])


def positions_argsort(positions):
    big = torch.where(positions >= 0, positions, torch.iinfo(positions.dtype).max)
    return torch.where(positions >= 0, big.argsort().argsort(), -1)


def positions_compare(positions):
    kept = positions >= 0
    older = ((positions[None, :] < positions[:, None]) & kept[None, :]).sum(1)
    return torch.where(kept, older, -1)


@pytest.mark.parametrize("fn", [positions_loop, positions_argsort, positions_compare])
def test_cache_positions_accepts_correct_variants(fn):
    result = mc.check.cache_positions(fn)
    assert result.passed, result


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda p: p, "text positions themselves"),
        (lambda p: torch.where(p >= 0, (p >= 0).long().cumsum(0) - 1, -1), "follow the slots' order"),
        (lambda p: torch.where(p >= 0, p.argsort().argsort(), -1), "empty slots took ranks"),
        (lambda p: positions_compare(p).clamp(min=0), "mark it −1"),
        (lambda p: torch.where(p >= 0, positions_compare(p) + 1, -1), "start at 0"),
    ],
)
def test_cache_positions_names_mistakes(fn, words):
    result = mc.check.cache_positions(fn)
    assert not result.passed and "likely mistake" in result.message and words in result.message, result


def test_cache_positions_not_attempted_and_raising():
    def todo(positions):
        raise NotImplementedError

    assert mc.check.cache_positions(todo).status == "not attempted"
    result = mc.check.cache_positions(lambda p: p.float().argsort(dim=2))
    assert not result.passed and "IndexError" in result.message
