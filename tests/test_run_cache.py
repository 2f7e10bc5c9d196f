"""mha_course.kit.run_cache: a training run computed once per test session, reused only when
everything that decides it is the same, and invisible without MHA_COURSE_RUN_CACHE."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import torch

from mha_course.kit import run_cache, timing
from mha_course.lessons import relation_task, tiny_training


@dataclasses.dataclass(frozen=True)
class Settings:
    width: int = 3


def counted(**options):
    """A cached function that draws from the global generator (unless it seeds itself) and counts its calls."""
    calls = []

    @run_cache.cached_run(**options)
    def run(n, settings=Settings(), *, progress=None):
        calls.append(n)
        if options.get("seeds_itself"):
            torch.manual_seed(n)
        return {"n": n, "draw": torch.rand(settings.width)}

    return run, calls


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv(run_cache.ENV, str(tmp_path))
    return tmp_path


def test_the_suite_sets_the_variable_the_package_reads():
    import importlib.util

    from authoring.notebooks import ROOT

    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    root_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root_conftest)
    assert root_conftest.RUN_CACHE_ENV == run_cache.ENV
    assert root_conftest.TIMING_ROUNDS_ENV == timing.ROUNDS_VARIABLE


def test_the_sessions_kernels_and_only_they_time_one_round():
    import os

    from jupyter_client.kernelspec import KernelSpecManager

    assert KernelSpecManager().get_kernel_spec("python3").env == {timing.ROUNDS_VARIABLE: "1"}
    assert timing.ROUNDS_VARIABLE not in os.environ  # the tests' own processes time as asked


def test_without_the_variable_every_call_computes(monkeypatch):
    monkeypatch.delenv(run_cache.ENV, raising=False)
    run, calls = counted()
    torch.manual_seed(0)
    first = run(1)["draw"]
    torch.manual_seed(0)
    assert torch.equal(run(1)["draw"], first) and calls == [1, 1]


def test_a_repeated_call_is_loaded_as_a_fresh_copy_and_leaves_the_generator_where_a_call_would(folder):
    run, calls = counted()
    torch.manual_seed(0)
    first = run(1)
    after_call = torch.rand(2)
    torch.manual_seed(0)
    second = run(1)
    assert calls == [1], "the second call is served from the folder"
    assert torch.equal(second["draw"], first["draw"]) and second["draw"] is not first["draw"]
    assert torch.equal(torch.rand(2), after_call), "the generator is where the real call left it"
    second["draw"].zero_()
    torch.manual_seed(0)
    assert torch.equal(run(1)["draw"], first["draw"]), "a caller's change does not reach the stored result"


def test_other_arguments_another_generator_state_or_kernel_setting_compute_again(folder, monkeypatch):
    run, calls = counted()
    torch.manual_seed(0)
    run(1)
    torch.manual_seed(0)
    run(2)
    torch.manual_seed(0)
    run(1, Settings(width=4))
    torch.manual_seed(1)
    run(1)  # the result depends on the generator's state: another state, another result
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    torch.manual_seed(0)
    run(1)
    assert calls == [1, 2, 1, 1, 1]
    monkeypatch.setattr(run_cache, "package_digest", lambda: "changed code")
    torch.manual_seed(0)
    run(1)
    assert len(calls) == 6, "a change to the package's code is a new key"


def test_a_function_that_seeds_itself_is_reused_from_any_generator_state_and_sets_it_after(folder):
    run, calls = counted(seeds_itself=True)
    torch.manual_seed(5)
    first = run(3)
    after_call = torch.random.get_rng_state()
    torch.manual_seed(99)
    again = run(3)
    assert calls == [3] and torch.equal(again["draw"], first["draw"])
    assert torch.equal(torch.random.get_rng_state(), after_call)


def test_ignored_arguments_are_not_in_the_key_and_replay_sees_them(folder):
    seen = []
    run, calls = counted(ignore=("progress",), replay=lambda arguments: seen.append(arguments["progress"]))
    torch.manual_seed(0)
    run(1, progress="bar A")
    torch.manual_seed(0)
    run(1, progress="bar B")
    assert calls == [1] and seen == ["bar B"]


def test_an_argument_the_key_cannot_describe_means_no_cache(folder):
    run, calls = counted()
    torch.manual_seed(0)
    run(object())
    torch.manual_seed(0)
    run(object())
    assert len(calls) == 2 and not list(folder.glob("*.pkl"))
    with pytest.raises(run_cache.Unkeyable, match="object"):
        run_cache.describe(object())


def test_concurrent_callers_wait_for_the_one_that_computes(folder):
    calls = []

    @run_cache.cached_run(seeds_itself=True)
    def slow(n):
        calls.append(n)
        time.sleep(0.3)
        return n * 2

    results = []
    threads = [threading.Thread(target=lambda: results.append(slow(7))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [14, 14, 14] and calls == [7]


def test_the_tiny_training_run_reused_is_bit_identical_and_its_bar_is_filled(folder):
    task = relation_task.TwoRelationTask()

    class Bar:
        n = 0

        def update(self, k):
            self.n += k

    computed, bar = tiny_training.train(task, 2, seed=1, steps=4, eval_every=2, progress=False), Bar()
    reused = tiny_training.train(task, 2, seed=1, steps=4, eval_every=2, progress=bar)
    plain = tiny_training.train.uncached(task, 2, seed=1, steps=4, eval_every=2, progress=False)
    assert bar.n == 4, "the caller's bar advances as if the run had happened"
    assert reused[1] == computed[1] == plain[1]
    for a, b in zip(reused[0].state_dict().values(), plain[0].state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert len(list(folder.glob("*.pkl"))) == 1


def test_a_reused_tiny_training_run_with_its_own_bar_still_shows_the_bar_full(folder, capsys):
    task = relation_task.TwoRelationTask()
    tiny_training.train(task, 1, seed=2, steps=3, eval_every=3, progress=False)
    capsys.readouterr()
    tiny_training.train(task, 1, seed=2, steps=3, eval_every=3, progress=True)
    shown = capsys.readouterr().err
    assert "h=1, seed 2" in shown and "3/3" in shown, shown
