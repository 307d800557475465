"""Admission's arithmetic, on given numbers (no clock): what it plans a deadline with, and how it
learns the speed of calls that overlap."""

from __future__ import annotations

import math

import pytest

from serving.batching import Admission
from serving.batching.admission import PLANNED_SHARE, WINDOW_S
from serving.errors import DeadlineExceeded
from testkit.processes import ROOT


def test_work_is_planned_to_a_share_of_the_deadline() -> None:
    """At 1,000 tokens/s and a 1 s deadline, 0.75 s of work ahead is admitted and 0.85 s is
    refused at once, though it would fit the whole budget: the margin absorbs a wrong estimate."""
    admission = Admission(max_queue_tokens=10_000, deadline_s=1.0, tokens_per_s=1000)
    admission.admit(500)  # nothing waits: admitted
    admission.admit(250)  # 0.75 s of work, within the planned share
    with pytest.raises(DeadlineExceeded) as refused:
        admission.admit(100)  # 0.85 s: within the deadline, past the planned share
    assert refused.value.status == 503
    assert admission.waiting == 750  # the refused request is not counted
    readme = (ROOT / "README.md").read_text()
    assert f"within {PLANNED_SHARE * 100:.0f} % of its deadline" in readme


def test_overlapping_calls_measure_the_instance_speed_not_one_call_s() -> None:
    """Two calls of 10 tokens on two lanes, 0.25 s each, the second begun halfway through the
    first: the instance did 20 tokens in 0.375 s. Each call alone says 10 in 0.25 s (40/s); the
    second's own share of the time is only what passed after the first ended (0.125 s)."""
    admission = Admission(max_queue_tokens=1000, deadline_s=1, tokens_per_s=40)
    admission.waiting = 10  # requests wait meanwhile: the calls measure the loaded instance
    admission.overlapped(10, 0.0, 0.25)  # its own 0.25 s: 40 tokens/s, the seed's speed
    admission.overlapped(10, 0.125, 0.375)
    # the averages of tokens and of seconds (the seed counting as one window at 40/s)
    work = 0.8 * (0.8 * 40 * WINDOW_S + 0.2 * 10) + 0.2 * 10
    time = 0.8 * (0.8 * WINDOW_S + 0.2 * 0.25) + 0.2 * 0.125
    assert admission.tokens_per_s == pytest.approx(work / time)
    assert admission.tokens_per_s > 40  # faster than one call alone says


def test_the_speed_is_a_ratio_of_averages_not_an_average_of_ratios() -> None:
    """Samples that swing between a tiny and a long share of the time (calls ending together,
    then a gap) average to the true speed: 100 tokens/s here, whichever sample came last. An
    average of their rates (1,000/s and ~53/s) would say ~500, then dip after each slow one."""
    admission = Admission(max_queue_tokens=1000, deadline_s=1, tokens_per_s=100)
    for _ in range(50):
        admission.measured(10, 0.01)  # 1,000/s
        admission.measured(10, 0.19)  # ~53/s
    assert 90 < admission.tokens_per_s < 110
    admission.measured(10, 0.19)
    assert admission.tokens_per_s > 75  # one slow sample moves it, without a dip to its rate


def test_calls_ending_together_wait_for_a_whole_window() -> None:
    """Calls whose own share of the time is tiny are not measured one by one: the speed moves
    once WINDOW_S of the instance's time has passed."""
    admission = Admission(max_queue_tokens=1000, deadline_s=1, tokens_per_s=100)
    admission.waiting = 10
    admission.overlapped(10, 0.0, 0.001)
    admission.overlapped(10, 0.0, 0.002)
    assert admission.tokens_per_s == 100  # 2 ms of the instance's time: not measured yet
    admission.overlapped(3, 0.002, 0.002 + WINDOW_S)
    seconds = 0.002 + WINDOW_S
    expected = (0.8 * 100 * WINDOW_S + 0.2 * 23) / (0.8 * WINDOW_S + 0.2 * seconds)
    assert math.isclose(admission.tokens_per_s, expected)


def test_a_speed_set_from_outside_is_the_new_seed() -> None:
    admission = Admission(max_queue_tokens=1000, deadline_s=1, tokens_per_s=100)
    admission.measured(10, 0.1)
    admission.tokens_per_s = 1000.0  # e.g. a test, or a caller that knows better
    admission.measured(50, WINDOW_S)  # 1,000/s: the speed set stays
    assert admission.tokens_per_s == pytest.approx(1000)


def test_work_done_unmeasured_leaves_the_speed_as_it_was() -> None:
    """A warm-up's call (a few tokens over a slow first call) would drag the speed far down, and
    with it what admission lets in; unmeasured, the estimate is the one from before."""
    admission = Admission(max_queue_tokens=10_000, deadline_s=1.0, tokens_per_s=1000)
    admission.waiting = 10  # requests wait: a slow call would lower the speed
    admission.overlapped(100, 0.0, 0.1)  # one window at 1,000 tokens/s
    speed, state = admission.tokens_per_s, admission._averages
    with admission.unmeasured():
        admission.overlapped(4, 0.1, 0.6)  # 8 tokens/s: measured, it would move the estimate
        assert admission.tokens_per_s < speed / 2
    assert (admission.tokens_per_s, admission._averages) == (speed, state)
    admission.overlapped(4, 0.6, 1.1)  # outside, the same call moves it
    assert admission.tokens_per_s < speed / 2


def test_calls_ending_alone_never_lower_the_speed_but_may_raise_it() -> None:
    """Lone requests of a few tokens, one at a time, each a slow round trip on a loaded host: the
    speed stays what it was, and a burst that one call would serve is admitted whole. A call that
    ends among other work (waiting or running) measures the loaded instance, slower or not."""
    admission = Admission(max_queue_tokens=131_072, deadline_s=10.0, tokens_per_s=2000)
    for k in range(35):  # 4 tokens per 0.1 s: 40 tokens/s, measured they would set the speed
        admission.overlapped(4, k * 0.3, k * 0.3 + 0.1)
    assert admission.tokens_per_s == 2000
    for _ in range(32):  # 32 users' short texts arriving at once
        admission.admit(20)
    assert admission.waiting == 640  # none refused
    admission.started(20)
    admission.finished(20)
    admission.overlapped(20, 20.0, 20.1)  # the burst's first call, ended with the rest waiting
    assert admission.tokens_per_s < 2000
    idle = Admission(max_queue_tokens=1000, deadline_s=1.0, tokens_per_s=100)
    idle.overlapped(100, 0.0, 0.1)  # 1,000 tokens/s with nothing waiting: faster, so it counts
    assert idle.tokens_per_s > 100


def test_one_call_among_others_makes_its_window_measured_and_the_next_starts_alone() -> None:
    """The speed moves per window of calls: a window in which one call ended among others is
    measured whole, slow lone calls in it included; the window after it starts alone again."""
    admission = Admission(max_queue_tokens=1000, deadline_s=1.0, tokens_per_s=1000)
    admission.waiting = 10  # a request waits as the first call ends
    admission.overlapped(1, 0.0, 0.01)
    admission.waiting = 0
    admission.overlapped(4, 0.01, 0.01 + WINDOW_S)  # alone, slow: its window is measured anyway
    measured = admission.tokens_per_s
    assert measured < 1000
    admission.overlapped(4, 1.0, 1.0 + WINDOW_S)  # a window of lone calls only: left as it was
    assert admission.tokens_per_s == measured
