"""The tokenizer service's coalescer: merged calls, rows split back in order, errors shared.

It runs on the runners' own token queue (serving/batching/queue.py), handed a client object."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from services.tokenizer.coalesce import Coalescer, Embedded
from services.tokenizer.settings import TokenizerSettings
from serving.batching import Admission, TokenQueue
from serving.errors import DeadlineExceeded, QueueFull
from tests.waits import until


class FakeRunner:
    def __init__(
        self, delay_s: float = 0.02, fail: Exception | None = None, gated: bool = False
    ) -> None:
        self.calls: list[int] = []
        self.budgets: list[float] = []
        self.delay_s = delay_s
        self.fail = fail
        # Gated: each call, once made, waits until the test sets ``gate``: the test, not the
        # host's speed, says when it ends.
        self.gate = asyncio.Event() if gated else None

    async def embed(self, ids: list[list[int]], deadline_s: float) -> Embedded:
        self.calls.append(len(ids))
        self.budgets.append(deadline_s)
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(self.delay_s)
        if self.fail:
            raise self.fail
        return Embedded(np.array([[seq[0], len(seq)] for seq in ids], dtype=np.float32), 1.0, 2.0)


def coalescer_for(
    runner: FakeRunner,
    *,
    max_inflight: int,
    max_tokens: int = 8192,
    admission: Admission | None = None,
) -> Coalescer:
    settings = TokenizerSettings()
    queue = TokenQueue(admission or Admission(settings.max_queue_tokens, settings.deadline_s))
    return Coalescer(runner, queue, max_inflight=max_inflight, max_tokens=max_tokens)


def admission_at(tokens_per_s: float, deadline_s: float = 60) -> Admission:
    """An admission whose speed estimate is set: the coalescer times its calls by it."""
    admission = Admission(max_queue_tokens=1000, deadline_s=deadline_s)
    admission.tokens_per_s = tokens_per_s
    return admission


@pytest.fixture
def now(monkeypatch) -> list[float]:
    """The coalescer's clock and its queue's (deadlines), moved by the test (``now[0]``), from
    100.0."""
    from services.tokenizer import coalesce
    from serving.batching import queue

    at = [100.0]
    for module in (coalesce, queue):
        monkeypatch.setattr(module, "clock", lambda: at[0])
    return at


def test_concurrent_requests_are_merged_and_rows_return_in_order() -> None:
    runner = FakeRunner()

    async def main():
        coalescer = coalescer_for(runner, max_inflight=1)
        requests = [[[i * 10 + k] * (k + 1) for k in range(i % 3 + 1)] for i in range(30)]
        results = await asyncio.gather(*(coalescer.embed(r) for r in requests))
        return requests, results

    requests, results = asyncio.run(main())
    for request, result in zip(requests, results, strict=True):
        assert result.vectors.tolist() == [[seq[0], len(seq)] for seq in request]
        assert result.inference_ms == 2.0 and result.queue_ms >= 1.0
    assert runner.calls[0] == 1  # the first request left at once, alone
    assert len(runner.calls) == 2 and sum(runner.calls) == sum(len(r) for r in requests)


class CountingRunner(FakeRunner):
    """A FakeRunner that notes, as each call starts, how many calls were already out."""

    def __init__(self, delay_s: float = 0.02) -> None:
        super().__init__(delay_s)
        self.active = 0
        self.out_at_start: list[int] = []

    async def embed(self, ids: list[list[int]], deadline_s: float) -> Embedded:
        self.out_at_start.append(self.active)
        self.active += 1
        try:
            return await super().embed(ids, deadline_s)
        finally:
            self.active -= 1


def test_calls_in_flight_are_capped() -> None:
    runner = CountingRunner()

    async def main():
        coalescer = coalescer_for(runner, max_inflight=2)
        await asyncio.gather(*(coalescer.embed([[i]]) for i in range(50)))

    asyncio.run(main())
    assert runner.calls[0] == 1  # the first request left at once, alone
    assert max(runner.out_at_start) <= 1  # never a third call beside two
    assert sum(runner.calls) == 50 and len(runner.calls) < 10


def test_a_second_call_waits_for_what_arrives_and_goes_while_the_first_is_out() -> None:
    """With a call out, the next one waits until the first is expected to be OVERLAP_SHARE of its
    time from done (at the queue's speed, set here), then goes while the first is still out: the
    runner has work queued when it finishes, and the second call carries every request that
    arrived meanwhile instead of the first of them alone. (When it goes: the two tests below.)"""
    from services.tokenizer.coalesce import OVERLAP_SHARE

    call_s = 0.4
    runner = CountingRunner(delay_s=call_s)
    admission = admission_at(1 / call_s)  # the first call (one token) is expected to take call_s

    async def main():
        coalescer = coalescer_for(runner, max_inflight=2, admission=admission)
        first = asyncio.ensure_future(coalescer.embed([[1]]))
        await asyncio.sleep(0)  # the first call goes out at once
        later = []
        for k in range(3):  # arriving well before the first call's expected end less the share
            later.append(asyncio.ensure_future(coalescer.embed([[2 + k]])))
            await asyncio.sleep(call_s * (1 - OVERLAP_SHARE) / 10)
        await asyncio.gather(first, *later)

    asyncio.run(main())
    assert runner.calls == [1, 3]  # the three later requests left together, not the first alone
    assert runner.out_at_start == [0, 1]  # the second went while the first was still out


def test_a_second_call_is_due_overlap_share_of_the_first_ones_time_before_its_expected_end(
    now: list[float],
) -> None:
    """The first call, 4 tokens at 10 tokens/s, goes at 100.0: the runner is expected done with it
    at 100.4, so a request arriving meanwhile is due to go OVERLAP_SHARE x 0.4 s before that."""
    from services.tokenizer.coalesce import OVERLAP_SHARE

    runner = FakeRunner(delay_s=0.05)
    admission = admission_at(10)

    async def main():
        coalescer = coalescer_for(runner, max_inflight=2, admission=admission)
        first = asyncio.ensure_future(coalescer.embed([[1] * 4]))
        await asyncio.sleep(0)
        now[0] = 100.1
        second = asyncio.ensure_future(coalescer.embed([[2]]))
        await asyncio.sleep(0)
        armed = coalescer._timer_due, list(runner.calls)
        await asyncio.gather(first, second)
        return armed

    due, sent_by_then = asyncio.run(main())
    assert sent_by_then == [1]  # one sequence out: the second request waited
    assert due == pytest.approx(100.4 - OVERLAP_SHARE * 0.4)
    assert runner.calls == [1, 1]  # and went later, alone


def test_once_no_call_is_out_the_next_ones_are_timed_from_now_not_a_stale_estimate(
    now: list[float],
) -> None:
    """An estimate far too slow (1 token in 100 s) dates the runner's end to 200.0; the call is
    back at once. With nothing out, that end is dropped: the next call is timed from the clock,
    and a flush armed on the stale end gives way to the sooner one."""
    from services.tokenizer.coalesce import OVERLAP_SHARE

    runner = FakeRunner(delay_s=0.01)
    admission = admission_at(0.01, deadline_s=1000)

    async def main():
        coalescer = coalescer_for(runner, max_inflight=2, admission=admission)
        first = asyncio.ensure_future(coalescer.embed([[1]]))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(coalescer.embed([[2]]))
        await asyncio.sleep(0)
        stale = coalescer._timer_due  # 200.0 less the share of 100 s
        admission.tokens_per_s = 10  # the second call, 1 token, is expected to take 0.1 s
        await first  # back: nothing out, so the second goes at once, at 100.0
        await asyncio.sleep(0)
        third = asyncio.ensure_future(coalescer.embed([[3]]))
        await asyncio.sleep(0)
        armed = coalescer._timer_due
        await asyncio.gather(second, third)
        return stale, armed

    stale, armed = asyncio.run(main())
    assert stale == pytest.approx(200.0 - OVERLAP_SHARE * 100)
    # from 100.0, the second call's end (100.1) less the share of its 0.1 s, not from 200.0
    assert armed == pytest.approx(100.1 - OVERLAP_SHARE * 0.1)
    assert runner.calls == [1, 1, 1]


def test_token_cap_splits_calls_but_a_large_request_still_goes_alone() -> None:
    runner = FakeRunner()

    async def main():
        coalescer = coalescer_for(runner, max_inflight=1, max_tokens=100)
        big = coalescer.embed([[1] * 80, [2] * 80])  # 160 tokens: over the cap on its own
        small = [coalescer.embed([[3] * 40]) for _ in range(5)]
        return await asyncio.gather(big, *small)

    results = asyncio.run(main())
    assert results[0].vectors.tolist() == [[1, 80], [2, 80]]
    assert runner.calls == [2, 2, 2, 1]


def test_an_error_reaches_every_merged_request() -> None:
    runner = FakeRunner(fail=QueueFull(2, "queue full"))

    async def main():
        coalescer = coalescer_for(runner, max_inflight=1)
        return await asyncio.gather(
            *(coalescer.embed([[i]]) for i in range(5)), return_exceptions=True
        )

    outcomes = asyncio.run(main())
    assert all(isinstance(o, QueueFull) and o.status == 429 for o in outcomes)


def test_a_cancelled_request_is_not_sent() -> None:
    runner = FakeRunner(delay_s=0, gated=True)
    admission = Admission(max_queue_tokens=1000, deadline_s=60)

    async def main():
        coalescer = coalescer_for(runner, max_inflight=1, admission=admission)
        first = asyncio.create_task(coalescer.embed([[1]]))
        await until(lambda: runner.calls == [1])  # sent; the one call in flight
        gone = asyncio.create_task(coalescer.embed([[2], [2]]))
        await until(lambda: admission.waiting == 2)  # queued behind it
        gone.cancel()
        await until(gone.done)  # its tokens stay counted until the queue is next taken from
        kept = asyncio.create_task(coalescer.embed([[3]]))
        await until(lambda: admission.waiting == 3)
        runner.gate.set()
        await first
        with pytest.raises(asyncio.CancelledError):
            await gone
        return await kept

    kept = asyncio.run(main())
    assert kept.vectors.tolist() == [[3, 1]]
    assert runner.calls == [1, 1]
    assert admission.waiting == admission.running == 0


def test_waiting_beyond_the_token_limit_is_refused_at_once_with_429() -> None:
    runner = FakeRunner(delay_s=0, gated=True)

    async def main():
        admission = Admission(max_queue_tokens=10, deadline_s=60)
        coalescer = coalescer_for(runner, max_inflight=1, admission=admission)
        first = asyncio.create_task(coalescer.embed([[1] * 4]))  # sent at once
        await until(lambda: runner.calls == [1])
        waiting = asyncio.create_task(coalescer.embed([[2] * 8]))  # waits: 8 tokens
        await until(lambda: admission.waiting == 8)
        # At once: the first call is held, so a request that waited its turn would time out.
        with pytest.raises(QueueFull) as info:
            await asyncio.wait_for(coalescer.embed([[3] * 4]), 5)  # 8 + 4 > 10
        runner.gate.set()
        await asyncio.gather(first, waiting)
        return info.value

    error = asyncio.run(main())
    assert error.status == 429 and error.retry_after >= 1


def test_a_request_whose_deadline_passes_while_waiting_gets_503_and_is_not_sent(
    now: list[float],
) -> None:
    runner = FakeRunner(delay_s=0, gated=True)

    async def main():
        admission = Admission(max_queue_tokens=1000, deadline_s=0.1, tokens_per_s=1e9)
        coalescer = coalescer_for(runner, max_inflight=1, admission=admission)
        first = asyncio.create_task(coalescer.embed([[1]]))
        await until(lambda: runner.calls == [1])
        late = asyncio.gather(coalescer.embed([[7, 7]]), return_exceptions=True)
        await until(lambda: admission.waiting == 2)
        now[0] += 0.3  # the first call outlasts the waiting request's deadline
        runner.gate.set()
        await first
        return (await late)[0], admission

    outcome, admission = asyncio.run(main())
    assert isinstance(outcome, DeadlineExceeded) and outcome.status == 503
    assert runner.calls == [1]
    assert admission.waiting == 0 and admission.running == 0


def test_the_runner_is_given_what_is_left_of_the_tightest_deadline(
    now: list[float],
) -> None:
    runner = FakeRunner(delay_s=0, gated=True)

    async def main():
        admission = Admission(max_queue_tokens=1000, deadline_s=5.0, tokens_per_s=1e9)
        coalescer = coalescer_for(runner, max_inflight=1, admission=admission)
        first = asyncio.create_task(coalescer.embed([[1]]))
        await until(lambda: runner.calls == [1])
        # Both wait for the first call, then go out in one call; the second arrives 0.1 s later,
        # its deadline 0.1 s later too.
        second = asyncio.create_task(coalescer.embed([[2]]))
        await until(lambda: admission.waiting == 1)
        now[0] += 0.1
        third = asyncio.create_task(coalescer.embed([[3]]))
        await until(lambda: admission.waiting == 2)
        now[0] += 0.1  # the first call took 0.2 s
        runner.gate.set()
        await asyncio.gather(first, second, third)

    asyncio.run(main())
    assert runner.calls == [1, 2]
    # Sent at once: the whole budget. The merged call went out 0.2 s after the earlier of its
    # requests arrived: that wait is not granted again, and the later one's spare 0.1 s is not
    # given to both.
    assert runner.budgets == pytest.approx([5.0, 4.8])


def test_a_call_never_carries_more_sequences_than_a_runner_takes() -> None:
    """Short texts under a large token budget: the call stops at the runner's MAX_SEQUENCES."""
    from serving.protocol import MAX_SEQUENCES

    runner = FakeRunner()

    async def main():
        coalescer = coalescer_for(runner, max_inflight=1, max_tokens=10 * MAX_SEQUENCES)
        first = asyncio.ensure_future(coalescer.embed([[1, 2]]))  # out at once, alone
        await asyncio.sleep(0)
        waiting = [coalescer.embed([[i, i]] * 100) for i in range(3 * MAX_SEQUENCES // 100)]
        await asyncio.gather(first, *waiting)

    asyncio.run(main())
    assert max(runner.calls) <= MAX_SEQUENCES
    assert sum(runner.calls) == 1 + 100 * (3 * MAX_SEQUENCES // 100)
    assert len(runner.calls) >= 4  # three runner-fulls of rows, after the lone first


def test_embeddings_wait_while_the_runner_has_no_replica_and_get_their_own_rows() -> None:
    """With a gate (services/tokenizer/replica_wait.py), a call the runner's proxy answers "no
    replica" is not passed on: the requests wait, go through the queue again once a replica
    answers, and each gets its own rows. Without one, it is passed on as before."""
    from services.tokenizer.clients import NoReplica
    from services.tokenizer.replica_wait import ReplicaWait

    down = NoReplica("onnx_runner", "no replica of this service is up")
    runner = FakeRunner(fail=down)
    settings = TokenizerSettings()
    queue = TokenQueue(Admission(settings.max_queue_tokens, settings.deadline_s))
    gate = ReplicaWait("onnx_runner", wait_s=5, max_waiting=10, retry_s=0.05)
    coalescer = Coalescer(runner, queue, max_inflight=2, max_tokens=8192, replicas=gate)

    async def main() -> list[Embedded]:
        calls = [
            asyncio.ensure_future(coalescer.embed(ids)) for ids in ([[7, 8, 9]], [[5], [6, 1]])
        ]
        for _ in range(500):  # both fail their first call and wait at the gate (within 5 s)
            if gate.waiting == 2:
                break
            await asyncio.sleep(0.01)
        assert not gate.up and gate.waiting == 2 and not any(c.done() for c in calls)
        runner.fail = None  # a replica is up
        return await asyncio.gather(*calls)

    first, second = asyncio.run(main())
    np.testing.assert_array_equal(first.vectors, [[7, 3]])
    np.testing.assert_array_equal(second.vectors, [[5, 1], [6, 2]])
    assert gate.up and not queue  # nothing left behind in the queue

    bare = coalescer_for(FakeRunner(fail=down), max_inflight=2)
    with pytest.raises(NoReplica):
        asyncio.run(bare.embed([[1]]))


def test_a_burst_after_lone_requests_on_a_slow_hop_is_admitted_whole(
    now: list[float],
) -> None:
    """On a loaded host a call's round trip is long whatever it carries: requests of a few
    tokens, one at a time, then 32 short texts at once, which fit in one runner call. Calls that
    ended alone, measured as the instance's speed, refused half of the burst as seconds of work
    (503)."""
    slow = SlowHop(now, round_trip_s=0.1)
    coalescer = coalescer_for(slow, max_inflight=2)  # the default settings

    async def main() -> list[Embedded | BaseException]:
        for _ in range(35):
            await coalescer.embed([[101, 7, 8, 102]])
            now[0] += 0.3  # the next one comes later
        burst = [coalescer.embed([[101, *range(18), 102]]) for _ in range(32)]
        return await asyncio.gather(*burst, return_exceptions=True)

    answers = asyncio.run(main())
    refused = [a for a in answers if isinstance(a, BaseException)]
    assert not refused, f"{len(refused)} of 32 refused: {refused[0]}"
    assert sum(slow.calls[35:]) == 32 and len(slow.calls[35:]) <= 3  # a few calls, not seconds


def test_a_backlog_of_more_than_a_call_measures_the_speed(
    now: list[float],
) -> None:
    """Calls that end while others wait (each carries what its token cap allows) are the
    instance's speed under load: slow ones bring the estimate down."""
    slow = SlowHop(now, round_trip_s=0.1)
    coalescer = coalescer_for(slow, max_inflight=2, max_tokens=40)

    async def main() -> None:
        await asyncio.gather(*(coalescer.embed([[7] * 20]) for _ in range(30)))

    asyncio.run(main())
    assert max(slow.calls) == 2 and sum(slow.calls) == 30  # cut at the cap: the others waited
    assert coalescer.queue.admission.tokens_per_s < 1000  # ~400 tokens/s: 40 per 0.1 s


class SlowHop(FakeRunner):
    """A runner whose every call takes the same round trip on the coalescer's clock."""

    def __init__(self, now: list[float], round_trip_s: float) -> None:
        super().__init__()
        self.now, self.round_trip_s = now, round_trip_s

    async def embed(self, ids: list[list[int]], deadline_s: float) -> Embedded:
        self.calls.append(len(ids))
        await asyncio.sleep(0)
        self.now[0] += self.round_trip_s
        return Embedded(np.zeros((len(ids), 2), dtype=np.float32), 0.0, self.round_trip_s * 1000)
