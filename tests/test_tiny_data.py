"""The tiny language model's data (notebooks 12 and 15): the Markov chain is sampled as its table
says, by a draw that does not depend on torch.multinomial (whose stream differs between PyTorch
releases, which moved the stored outputs of notebook 15)."""

import torch

from mha_course.lessons import beyond_gqa


def test_draw_inverts_the_cumulative_distribution():
    probs = torch.tensor([[0.1, 0.2, 0.7], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64).repeat(50, 1)
    gen = torch.Generator().manual_seed(3)
    drawn = beyond_gqa._draw(probs, gen)
    u = torch.rand(probs.shape[0], generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for row, (p, ui) in enumerate(zip(probs.tolist(), u.tolist(), strict=True)):
        cumulative = [sum(p[: i + 1]) for i in range(len(p))]
        first = next(i for i, c in enumerate(cumulative) if c >= ui)  # the first index whose sum reaches u
        assert drawn[row].item() == first
    assert not ((probs.gather(1, drawn[:, None]) == 0).any()), "drew a token of probability 0"


def test_draws_follow_the_table():
    table = beyond_gqa.markov_table()  # (15, 15)
    rows = torch.arange(table.shape[0]).repeat_interleave(4000)
    drawn = beyond_gqa._draw(table[rows], torch.Generator().manual_seed(7))
    ones = torch.ones(len(rows), dtype=table.dtype)
    counts = torch.zeros_like(table).index_put_((rows, drawn), ones, accumulate=True)
    empirical = counts / 4000
    assert (empirical - table).abs().max() < 0.03  # 4,000 draws a row: a standard error below 0.008
    assert (empirical - table.flip(-1)).abs().max() > 0.2  # a wrong order of tokens would not pass


def test_sequences_start_with_bos_and_repeat_for_a_seed():
    a = beyond_gqa.sample_sequences(beyond_gqa.markov_table(), 20, seed=4)
    assert (a[:, 0] == beyond_gqa.BOS).all() and a.shape == (20, beyond_gqa.SEQ_LEN)
    assert torch.equal(a, beyond_gqa.sample_sequences(beyond_gqa.markov_table(), 20, seed=4))
    assert not torch.equal(a, beyond_gqa.sample_sequences(beyond_gqa.markov_table(), 20, seed=5))
