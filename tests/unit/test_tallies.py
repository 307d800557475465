"""serving/tallies.py's timing: a tally is written within FLUSH_S of its first observation, and
every tally of a loop on one grid of instants, so that one wake-up of the loop writes them all."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from serving.tallies import FLUSH_S, Flushes, next_flush


class _Timer:
    def cancel(self) -> None: ...


class _Loop:
    """The running loop as ``Flushes`` sees it: a clock that moves only when told, and the
    instants writes are armed for."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.armed: list[float] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> _Timer:
        self.armed.append(when)
        return _Timer()


@pytest.mark.parametrize("now", [0.0, 0.01, FLUSH_S - 1e-6, FLUSH_S, 12.3456, 86_400.1])
def test_the_next_flush_is_the_first_instant_of_the_grid_after_now(now: float) -> None:
    at = next_flush(now)
    assert now < at <= now + FLUSH_S
    assert at / FLUSH_S == pytest.approx(round(at / FLUSH_S))


def test_tallies_armed_at_different_moments_are_written_at_one_instant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = _Loop(now=100.03)
    monkeypatch.setattr(asyncio, "get_running_loop", lambda: loop)
    first, second = Flushes(lambda: None), Flushes(lambda: None)
    first.soon()
    loop.now = 100.13  # timed from each one's arming, they would be written 0.1 s apart
    second.soon()
    first.soon()  # already armed: not armed again
    assert loop.armed == [100.25, 100.25]
    for armed_at in (100.03, 100.13):
        assert armed_at < loop.armed[0] <= armed_at + FLUSH_S
