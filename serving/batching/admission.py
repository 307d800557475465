"""Admission control: a bounded queue (429) and a deadline at the measured speed (503).

Every token queue (queue.py) admits through one of these, so a request is refused at once wherever
it would otherwise wait: the same limits, the same Retry-After arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from serving.errors import DeadlineExceeded, QueueFull

# A request is admitted only if the work ahead of it fits in this share of its budget. The speed is
# a moving average measured before the request waits, and the engine shares the cores with the
# tokenizer and the load: under overload, refusing requests takes CPU from the engine, so what was
# admitted at the earlier speed runs slower than planned. The rest of the budget is the margin for
# that slowdown; with a thinner margin a slower host expired admitted requests at their deadline (a
# 503 after the whole budget instead of at once). A lower share refuses more of the requests that
# would have finished in time (docs/decisions/0009-admission.md; `make chaos` measures it again).
PLANNED_SHARE = 0.8
# Overlapping calls' speed is measured over this much of the instance's time, not per call.
WINDOW_S = 0.05


@dataclass
class Admission:
    max_queue_tokens: int
    deadline_s: float
    tokens_per_s: float = 10_000.0  # seeds the estimate until work is measured (not a setting)
    on_shed: Callable[[str], None] = field(default=lambda reason: None, repr=False)
    waiting: int = 0  # tokens admitted, not yet started
    running: int = 0  # tokens started, not yet finished
    # When the latest overlapping call ended; the tokens and seconds not yet measured (overlapped),
    # and whether any of those calls ended while other work was admitted.
    _last_done: float = field(default=0.0, init=False, repr=False)
    _window: tuple[int, float, bool] = field(default=(0, 0.0, False), init=False, repr=False)
    _averages: tuple[float, float] = field(default=(0.0, 0.0), init=False, repr=False)

    def backlog_s(self) -> float:
        """Seconds of work waiting or running, at the measured speed."""
        return (self.waiting + self.running) / self.tokens_per_s

    def admit(self, tokens: int, deadline_s: float | None = None) -> float:
        """Count ``tokens`` as waiting and return the request's time budget, or refuse it.

        Nothing is refused while nothing waits: a lone request, however large, is served. Work
        is planned to ``PLANNED_SHARE`` of the budget; the rest absorbs a wrong speed estimate.
        """
        budget = self.deadline_s if deadline_s is None else deadline_s
        if self.waiting:
            if self.waiting + tokens > self.max_queue_tokens:
                self.on_shed("queue_full")
                raise QueueFull(
                    self.backlog_s(),
                    f"queue full ({self.waiting} tokens waiting, limit {self.max_queue_tokens})",
                )
            expected = self.backlog_s() + tokens / self.tokens_per_s
            planned = budget * PLANNED_SHARE
            if expected > planned:
                self.on_shed("deadline")
                raise DeadlineExceeded(
                    expected - planned,
                    f"cannot finish within {budget:.2f} s (about {expected:.2f} s of work ahead;"
                    f" {PLANNED_SHARE:.0%} of a deadline is planned, the rest is margin)",
                )
        self.waiting += tokens
        return budget

    def expired(self, tokens: int) -> DeadlineExceeded:
        """A waiting request whose deadline passed: forget its tokens, return the error to raise."""
        self.waiting -= tokens
        self.on_shed("deadline")
        return DeadlineExceeded(self.backlog_s(), "deadline passed while queued")

    def cancelled(self, tokens: int) -> None:
        self.waiting -= tokens

    def started(self, tokens: int) -> None:
        self.waiting -= tokens
        self.running += tokens

    def finished(self, tokens: int) -> None:
        self.running -= tokens

    def measured(self, tokens: int, seconds: float) -> None:
        """``tokens`` of work done in ``seconds``: the speed is the ratio of two moving averages,
        tokens over seconds, not a moving average of ratios. Samples of overlapping calls swing
        (a call that ends just after another has a tiny share of the time: a huge rate; the other
        a long one); an average of such rates is biased high and jumps with every sample, so
        admission swung between admitting too much and refusing what would have finished."""
        work, time = self._averages
        if not time or self.tokens_per_s != work / time:
            # The first sample, or a speed set from outside: it counts as one window's worth.
            self._averages = (self.tokens_per_s * WINDOW_S, WINDOW_S)
        work, time = self._averages
        self._averages = (0.8 * work + 0.2 * tokens, 0.8 * time + 0.2 * max(seconds, 1e-6))
        self.tokens_per_s = self._averages[0] / self._averages[1]

    @contextmanager
    def unmeasured(self) -> Iterator[None]:
        """Work done inside leaves the speed estimate as it was: a warm-up's calls are a few tokens
        each on a process just started, and measured they set the speed far below the instance's,
        so that requests that would finish in time were refused."""
        saved = (self.tokens_per_s, self._averages, self._window, self._last_done)
        try:
            yield
        finally:
            self.tokens_per_s, self._averages, self._window, self._last_done = saved

    def overlapped(self, tokens: int, began: float, ended: float) -> None:
        """``tokens`` of work done from ``began`` to ``ended`` (``clock``) by one of several calls
        that run at once (a runner's lanes, the tokenizer's calls in flight). The speed to plan
        with is the instance's, not one call's: a call's share of the time is what passed since
        the previous call ended (or since it began). Calls that end together share little time
        each, so the speed is updated per ``WINDOW_S`` of that time rather than per call.

        The speed admission needs is the instance's under load, when calls carry whatever has
        queued. A call that ends with no other work admitted (none waiting, none running; call
        ``finished`` first) measures how long one call of what arrived takes, mostly its fixed
        cost (the hop, the engine's per-call work): lone requests of a few tokens each would set
        the speed to a few tokens per round trip, and the next burst, which one call would
        serve, be refused as seconds of work. So a window in which every call ended alone may
        raise the speed, never lower it."""
        window_tokens, window_s, crowded = self._window
        window_tokens += tokens
        window_s += max(0.0, ended - max(began, self._last_done))
        crowded = crowded or self.waiting + self.running > 0
        self._last_done = max(self._last_done, ended)
        if window_s >= WINDOW_S:
            if crowded or window_tokens > self.tokens_per_s * window_s:
                self.measured(window_tokens, window_s)
            window_tokens, window_s, crowded = 0, 0.0, False
        self._window = (window_tokens, window_s, crowded)
