"""Checkers of notebook 12: correct variants pass, each listed mistake is named, and a learner's
exception or an unfinished exercise never makes a check raise."""

import pytest
import torch

import mha_course as mc

# --- sink_window_update ------------------------------------------------------------------------


def ring_update(keys, positions, k_new, t, window, num_sinks):
    slot = t if t < num_sinks else num_sinks + (t - num_sinks) % window
    keys[:, slot] = k_new
    positions[slot] = t
    return keys, positions


def search_update(keys, positions, k_new, t, window, num_sinks):  # an empty slot, else the oldest window token
    empty = (positions < 0).nonzero().flatten()
    if len(empty):
        slot = int(empty[0])
    else:
        window_positions = positions.clone()
        window_positions[positions < num_sinks] = 10**9  # never evict a sink
        slot = int(window_positions.argmin())
    keys = keys.clone()
    positions = positions.clone()
    keys[:, slot], positions[slot] = k_new, t
    return keys, positions


def modulo_update(keys, positions, k_new, t, window, num_sinks):  # the layout the prompt's freedom allows
    slot = t if t < num_sinks else num_sinks + t % window
    keys[:, slot] = k_new
    positions[slot] = t
    return keys, positions


def shifting_update(keys, positions, k_new, t, window, num_sinks):  # window kept in order, oldest first
    keys, positions = keys.clone(), positions.clone()
    if t < num_sinks:
        keys[:, t], positions[t] = k_new, t
        return keys, positions
    held = int((positions[num_sinks:] >= 0).sum())
    if held == window:  # drop the oldest window token by shifting the window left
        keys[:, num_sinks:-1], positions[num_sinks:-1] = (
            keys[:, num_sinks + 1 :].clone(),
            positions[num_sinks + 1 :].clone(),
        )
        held -= 1
    keys[:, num_sinks + held], positions[num_sinks + held] = k_new, t
    return keys, positions


def reversed_update(keys, positions, k_new, t, window, num_sinks):  # sinks in the LAST slots
    slots = num_sinks + window
    slot = slots - 1 - t if t < num_sinks else (t - num_sinks) % window
    keys[:, slot], positions[slot] = k_new, t
    return keys, positions


@pytest.mark.parametrize("fn", [ring_update, search_update, modulo_update, shifting_update, reversed_update])
def test_sink_window_update_accepts_correct_variants(fn):
    result = mc.check.sink_window_update(fn)
    assert result.passed, result


def test_sink_window_update_names_mistakes():
    def ring_all(keys, positions, k_new, t, window, num_sinks):
        slot = t % (num_sinks + window)
        keys[:, slot], positions[slot] = k_new, t
        return keys, positions

    def from_zero(keys, positions, k_new, t, window, num_sinks):
        slot = t if t < num_sinks else (t - num_sinks) % window
        keys[:, slot], positions[slot] = k_new, t
        return keys, positions

    def no_positions(keys, positions, k_new, t, window, num_sinks):
        keys[:, t if t < num_sinks else num_sinks + (t - num_sinks) % window] = k_new
        return keys, positions

    def newest(keys, positions, k_new, t, window, num_sinks):
        if t < num_sinks + window:
            return ring_update(keys, positions, k_new, t, window, num_sinks)
        slot = num_sinks + int(positions[num_sinks:].argmax())
        keys[:, slot], positions[slot] = k_new, t
        return keys, positions

    def one_short(keys, positions, k_new, t, window, num_sinks):
        slot = t if t < num_sinks else num_sinks + (t - num_sinks) % (window - 1)
        keys[:, slot], positions[slot] = k_new, t
        return keys, positions

    def ring_all_other_layout(keys, positions, k_new, t, window, num_sinks):  # same content as ring_all
        slots = num_sinks + window
        slot = slots - 1 - t % slots
        keys[:, slot], positions[slot] = k_new, t
        return keys, positions

    for fn, words in [
        (ring_all, "first num_sinks positions were evicted"),
        (ring_all_other_layout, "first num_sinks positions were evicted"),
        (from_zero, "overwrote a sink"),
        (no_positions, "positions never changes"),
        (newest, "OLDEST"),
        (one_short, "window − 1 tokens"),
    ]:
        result = mc.check.sink_window_update(fn)
        assert not result.passed and "likely mistake" in result.message and words in result.message, (fn, result)


def test_sink_window_update_diagnoses_fire_only_on_code_that_makes_them():
    """Every correct layout passes, so no diagnosis can be handed to one; and each wrong variant is
    given its own diagnosis, not another's."""
    from mha_course.check.cache_schemes import SINK_WINDOW_UPDATE_MISTAKES

    texts = {m.name: m.diagnosis for m in SINK_WINDOW_UPDATE_MISTAKES}
    for fn in (ring_update, search_update, modulo_update, shifting_update, reversed_update):
        message = mc.check.sink_window_update(fn).message
        assert not any(text in message for text in texts.values()), (fn, message)


def test_sink_window_update_not_attempted_and_raising():
    def todo(*args):
        raise NotImplementedError

    def broken(keys, positions, k_new, t, window, num_sinks):
        keys[:, t] = k_new  # no wrapping: IndexError once t >= slots
        positions[t] = t
        return keys, positions

    assert mc.check.sink_window_update(todo).status == "not attempted"
    result = mc.check.sink_window_update(broken)
    assert not result.passed and "IndexError" in result.message


# --- gather_blocks -----------------------------------------------------------------------------


def gather_index(pool, block_table, length):
    blocks = pool[block_table]  # (n, h, B, d)
    return blocks.permute(1, 0, 2, 3).flatten(1, 2)[:, :length]


def gather_loop(pool, block_table, length):
    B = pool.shape[2]
    return torch.stack([pool[int(block_table[p // B]), :, p % B] for p in range(length)], dim=1)


def gather_cat(pool, block_table, length):
    return torch.cat([pool[int(b)] for b in block_table], dim=1)[:, :length]


@pytest.mark.parametrize("fn", [gather_index, gather_loop, gather_cat])
def test_gather_blocks_accepts_correct_variants(fn):
    result = mc.check.gather_blocks(fn)
    assert result.passed, result


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda pool, t, n: pool[t].reshape(pool.shape[1], -1, pool.shape[3])[:, :n], "transpose"),
        (lambda pool, t, n: gather_index(pool, torch.arange(len(t)), n), "block table says"),
        (lambda pool, t, n: gather_index(pool, t.sort().values, n), "ORDER"),
        (lambda pool, t, n: gather_index(pool, t, len(t) * pool.shape[2]), "partly filled"),
        (lambda pool, t, n: gather_index(pool, t, n).transpose(0, 1), "heads first"),
    ],
)
def test_gather_blocks_names_mistakes(fn, words):
    result = mc.check.gather_blocks(fn)
    assert not result.passed and "likely mistake" in result.message and words in result.message, result


# --- mla_cache_bytes ---------------------------------------------------------------------------


def mla_formula(num_layers, kv_lora_rank, qk_rope_head_dim, seq_len, batch=1, bytes_per_element=2):
    return num_layers * (kv_lora_rank + qk_rope_head_dim) * seq_len * batch * bytes_per_element


def mla_tensors(num_layers, kv_lora_rank, qk_rope_head_dim, seq_len, batch=1, bytes_per_element=2):
    dtype = {1: torch.int8, 2: torch.bfloat16, 4: torch.float32}[bytes_per_element]
    with torch.device("meta"):
        latent = torch.empty(batch, seq_len, kv_lora_rank, dtype=dtype)
        rope = torch.empty(batch, seq_len, qk_rope_head_dim, dtype=dtype)
    return num_layers * (latent.nbytes + rope.nbytes)


@pytest.mark.parametrize("fn", [mla_formula, mla_tensors])
def test_mla_cache_bytes_accepts_correct_variants(fn):
    result = mc.check.mla_cache_bytes(fn)
    assert result.passed, result


@pytest.mark.parametrize(
    "per_token, words",
    [
        (lambda r, rope: 2 * r + rope, "latent counted twice"),
        (lambda r, rope: r, "RoPE key is missing"),
        (lambda r, rope: 2 * (r + rope), "no factor 2"),
    ],
)
def test_mla_cache_bytes_names_mistakes(per_token, words):
    def fn(num_layers, kv_lora_rank, qk_rope_head_dim, seq_len, batch=1, bytes_per_element=2):
        return num_layers * per_token(kv_lora_rank, qk_rope_head_dim) * seq_len * batch * bytes_per_element

    result = mc.check.mla_cache_bytes(fn)
    assert not result.passed and words in result.message, result


def test_mla_cache_bytes_names_per_head_mistakes():
    heads = iter([16, 128, 128, 4])  # the cases' models, in order

    def rope_per_head(num_layers, kv_lora_rank, qk_rope_head_dim, seq_len, batch=1, bytes_per_element=2):
        return num_layers * (kv_lora_rank + next(heads) * qk_rope_head_dim) * seq_len * batch * bytes_per_element

    result = mc.check.mla_cache_bytes(rope_per_head)
    assert not result.passed and "shared by all heads" in result.message, result

    def no_layers(num_layers, kv_lora_rank, qk_rope_head_dim, seq_len, batch=1, bytes_per_element=2):
        return (kv_lora_rank + qk_rope_head_dim) * seq_len * batch * bytes_per_element

    assert "layers ignored" in mc.check.mla_cache_bytes(no_layers).message


# --- every checker of this module: reports instead of raising, deterministic, RNG untouched -----

GOOD = {"sink_window_update": ring_update, "gather_blocks": gather_index, "mla_cache_bytes": mla_formula}


def _raises_value_error(*args, **kwargs):
    raise ValueError("boom")


def _todo(*args, **kwargs):
    raise NotImplementedError


@pytest.mark.parametrize("name", list(GOOD))
def test_checker_reports_instead_of_raising(name):
    check = getattr(mc.check, name)
    assert check(_todo).status == "not attempted"
    assert "raised ValueError" in check(_raises_value_error).message
    for wrong in (lambda *a, **k: None, lambda *a, **k: [1, 2, 3], lambda *a, **k: "text", lambda: 0):
        result = check(wrong)
        assert not result.passed and result.status == "failed", (name, result)
    assert "expected your function" in check(None).message


@pytest.mark.parametrize("name", list(GOOD))
def test_checker_is_deterministic_and_leaves_the_rng_alone(name):
    check = getattr(mc.check, name)
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    good, bad = check(GOOD[name]), check(lambda *a, **k: torch.ones(3))
    assert good.passed and not bad.passed
    assert torch.equal(before, torch.random.get_rng_state())
    assert repr(good) == repr(check(GOOD[name])) and repr(bad) == repr(check(lambda *a, **k: torch.ones(3)))
