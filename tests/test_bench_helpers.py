"""The benchmarks' timing rounds (benchmarks/bench_linear.rounds_ms and run_for), checked with fake timers on the
CPU: every method timed once per round, in the asked order, after settling on its own load when asked."""

import os
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_linear import rounds_ms, run_for  # noqa: E402


def fake_timers(names, calls, sleep_s=0.0):
    """{name: timer}: each timer appends its name to `calls` and returns how many times it has been called."""
    counts = dict.fromkeys(names, 0)

    def timer(name):
        calls.append(name)
        counts[name] += 1
        time.sleep(sleep_s)
        return counts[name]

    return {name: (lambda name=name: timer(name)) for name in names}


@pytest.mark.parametrize("order", ["rotate", "shuffle"])
def test_rounds_time_every_method_once_per_round(order):
    names, calls = ["a", "b", "c", "d"], []
    times = rounds_ms(fake_timers(names, calls), 6, order)
    assert times == {name: [1, 2, 3, 4, 5, 6] for name in names}
    rounds = [calls[i:i + 4] for i in range(0, 24, 4)]
    assert all(sorted(r) == names for r in rounds)
    if order == "rotate":
        assert rounds[1] == ["b", "c", "d", "a"]
    else:  # no method keeps one neighbour in every round
        followers = {name: {r[r.index(name) + 1] for r in rounds if r[-1] != name} for name in names}
        assert any(len(f) > 1 for f in followers.values()), rounds


def test_settling_runs_each_method_by_itself_before_its_timing():
    calls = []
    times = rounds_ms(fake_timers(["a", "b"], calls, sleep_s=0.002), 2, settle_s=0.02)
    # a's settling calls come right before a's timing, and the timing kept is the last call's count (a slow host
    # makes fewer settling calls, never none)
    first_b = calls.index("b")
    assert calls[:first_b] == ["a"] * first_b and first_b >= 2
    assert times["a"][0] == first_b and times["b"][1] > times["b"][0] > 1


@pytest.mark.parametrize("kwargs, message", [(dict(order="random"), "order='random'"),
                                             (dict(settle_s=-1.0), "settle_s=-1.0"),
                                             (dict(settle_s=float("nan")), "settle_s=nan")])
def test_bad_rounds_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        rounds_ms({"a": lambda: 1.0}, 1, **kwargs)


def test_run_for_calls_until_the_time_is_up_and_counts_the_calls():
    calls = []
    assert run_for(lambda: calls.append(1), 0.0) == 0 and calls == []
    start = time.perf_counter()
    count = run_for(lambda: (calls.append(1), time.sleep(0.001)), 0.02)
    assert time.perf_counter() - start >= 0.02 and count == len(calls) >= 2
