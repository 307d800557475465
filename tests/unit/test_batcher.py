"""The batching core against a fake engine: order, budget, shedding, cancellation, failures."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import numpy as np
import pytest

from runners.settings import RunnerSettings
from serving.batching import Batcher
from serving.batching.metrics import NullRecorder
from serving.errors import DeadlineExceeded, QueueFull
from serving.features import Feeds
from tests.waits import until


class FakeEngine:
    """Row i of the output is (sum of real ids, real length, padded width): checkable per sequence."""

    def __init__(self, delay_s: float = 0.0, gated: bool = False) -> None:
        self.calls: list[tuple[int, int]] = []  # (rows, width)
        self.seen: list[int] = []
        self.delay_s = delay_s
        self.lock = threading.Lock()
        # Gated: each call, once seen, waits for the test to let it finish (``finish``), so a
        # test can set up what is running and in line without racing a sleep.
        self.gate = threading.Semaphore(0) if gated else None

    def finish(self, calls: int = 1) -> None:
        assert self.gate is not None
        self.gate.release(calls)

    def __call__(self, feeds: Feeds) -> np.ndarray:
        ids, mask = feeds["input_ids"], feeds["attention_mask"]
        with self.lock:
            self.calls.append(ids.shape)
            self.seen.extend(ids[:, 0].tolist())
        if self.gate is not None:
            self.gate.acquire()
        if self.delay_s:
            time.sleep(self.delay_s)
        return np.stack([(ids * mask).sum(1), mask.sum(1), np.full(len(ids), ids.shape[1])], axis=1)


def expected(seq: list[int]) -> list[int]:
    return [sum(seq), len(seq)]


def spin(seconds: float) -> None:
    """Burn ``seconds`` of this thread's CPU (not the clock's)."""
    spun = time.thread_time()
    while time.thread_time() - spun < seconds:
        pass


class Calls(NullRecorder):
    """Records the engine CPU each call reports."""

    def __init__(self) -> None:
        self.cpu: list[float] = []

    def engine_call(self, rows, padded, real, seconds, cpu_seconds=0.0) -> None:
        self.cpu.append(cpu_seconds)


class Sheds(NullRecorder):
    """Records why each request was shed."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def shed(self, reason: str) -> None:
        self.reasons.append(reason)


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The batcher's clock (deadlines, and when each call began and ended), moved by the test
    (``now[0]``), from 100.0."""
    import serving.batching.batcher as batcher_module
    from serving.batching import queue

    at = [100.0]
    for module in (queue, batcher_module):
        monkeypatch.setattr(module, "clock", lambda: at[0])
    return at


def Policy(**overrides):
    """The runners' default policy (their settings hold the defaults), with some limits changed."""
    return RunnerSettings(**overrides).policy


def test_order_preserved_across_sub_batches_and_requests() -> None:
    rng = random.Random(1)
    engine = FakeEngine()
    policy = Policy(max_batch_tokens=64, max_batch_rows=8)
    requests = [
        [
            [rng.randint(1, 999) for _ in range(rng.randint(1, 30))]
            for _ in range(rng.randint(1, 12))
        ]
        for _ in range(40)
    ]

    async def main():
        batcher = Batcher(engine, policy)
        results = await asyncio.gather(*(batcher.submit(r) for r in requests))
        await batcher.close()
        return results

    for request, (rows, timing) in zip(requests, run(main()), strict=True):
        assert rows[:, :2].tolist() == [expected(s) for s in request]
        assert timing.engine_calls >= 1
    assert len(engine.calls) > 1  # the work was split into several engine calls


def test_token_budget_never_exceeded_and_over_budget_sequence_served_alone() -> None:
    engine = FakeEngine()
    policy = Policy(max_batch_tokens=100, max_batch_rows=16)
    long_one = list(range(1, 251))  # 250 tokens: over the budget on its own

    async def main():
        batcher = Batcher(engine, policy)
        short = [[[7] * n for n in (3, 9, 27, 11, 5)] for _ in range(10)]
        results = await asyncio.gather(
            batcher.submit([long_one]), *(batcher.submit(r) for r in short)
        )
        await batcher.close()
        return results

    results = run(main())
    assert results[0][0][0, :2].tolist() == expected(long_one)
    for rows, width in engine.calls:
        assert rows * width <= policy.max_batch_tokens or rows == 1
    assert (1, 250) in engine.calls


def test_concurrent_requests_are_batched_together() -> None:
    engine = FakeEngine(delay_s=0.05)

    async def main():
        batcher = Batcher(engine, Policy())
        # The first call occupies the engine; the 31 that arrive meanwhile form the next batch.
        await asyncio.gather(*(batcher.submit([[i + 1, 5, 6]]) for i in range(32)))
        await batcher.close()

    run(main())
    assert max(rows for rows, _ in engine.calls) > 1
    assert len(engine.calls) < 32


def test_rows_held_from_one_round_join_the_next_and_the_oldest_goes_first() -> None:
    """A round's rows that are not in the call placed now wait for the next free lane, planned
    there with the requests that arrived meanwhile: the held long row shares a call with a later
    one of its length (each round alone would have made two calls of one row), and that call goes
    before a shorter row that arrived later, because it holds the oldest row."""
    from serving.batching import Lanes

    engine = FakeEngine(gated=True)

    async def main():
        lanes = Lanes(1)
        batcher = Batcher(engine, Policy(max_batch_rows=2), lanes=lanes)
        try:
            blocker = asyncio.create_task(batcher.submit([[1] * 5]))
            await until(lambda: engine.seen == [1])  # on the lane
            # 5 and 40 tokens: two calls (padding 5 to 40 costs more than a call); the short one
            # waits in line, the long one is held.
            first = asyncio.create_task(batcher.submit([[2] * 5, [3] * 40]))
            await until(lambda: lanes.held == lanes.slots and batcher.admission.waiting == 0)
            later = [asyncio.create_task(batcher.submit(r)) for r in ([[4] * 40], [[6] * 5])]
            await until(lambda: batcher.admission.waiting == 45)
            engine.finish()  # 2's call runs; the next round is planned and its first call placed
            await until(
                lambda: (
                    engine.seen == [1, 2]
                    and batcher.admission.waiting == 0
                    and lanes.held == lanes.slots
                )
            )
        finally:
            engine.finish(100)
        await asyncio.gather(blocker, first, *later)
        await batcher.close()
        return batcher.admission

    admission = run(main())
    assert engine.seen == [1, 2, 3, 4, 6]
    assert engine.calls[2] == (2, 40)  # the held row and the later one of its length, together
    assert (admission.waiting, admission.running) == (0, 0)


def test_held_rows_whose_caller_went_cost_no_engine_time() -> None:
    from serving.batching import Lanes

    engine = FakeEngine(gated=True)

    async def main():
        lanes = Lanes(1)
        batcher = Batcher(engine, Policy(max_batch_rows=2), lanes=lanes)
        try:
            blocker = asyncio.create_task(batcher.submit([[1] * 5]))
            await until(lambda: engine.seen == [1])  # on the lane
            gone = asyncio.create_task(batcher.submit([[2] * 5, [3] * 40]))  # in line, held
            await until(lambda: lanes.held == lanes.slots and batcher.admission.waiting == 0)
            gone.cancel()
            await until(gone.done)
        finally:
            engine.finish(100)
        await blocker
        kept = await batcher.submit([[4] * 40])
        await batcher.close()
        return kept, batcher.admission

    (rows, _), admission = run(main())
    assert rows[0, :2].tolist() == [160, 40]
    assert 2 not in engine.seen and 3 not in engine.seen
    assert (admission.waiting, admission.running) == (0, 0)


def test_a_round_is_planned_once_while_nothing_joins_or_leaves_it(monkeypatch) -> None:
    """The plan runs on the event loop: a round whose rows go out in ten calls, with nothing
    arriving meanwhile, is planned once, not once a call."""
    import serving.batching.batcher as batcher_module
    from serving.batching import Lanes

    plans = []

    def counted(*args, **kwargs):
        plans.append(args[0])
        return plan(*args, **kwargs)

    plan = batcher_module.plan
    monkeypatch.setattr(batcher_module, "plan", counted)
    engine = FakeEngine()

    async def main():
        batcher = Batcher(engine, Policy(max_batch_rows=1), lanes=Lanes(1))
        rows, _ = await batcher.submit([[i + 1] * 3 for i in range(10)])
        await batcher.close()
        return rows

    assert run(main())[:, 0].tolist() == [3 * (i + 1) for i in range(10)]
    assert len(engine.calls) == 10 and len(plans) == 1


def test_a_held_row_whose_caller_went_is_planned_out_of_the_call_it_was_cut_into() -> None:
    """Rows held in one planned call: when one request of it goes, the rows left are planned
    again, not sent in the call as it was cut (which would compute the gone row and count its
    tokens as finished twice)."""
    from serving.batching import Lanes

    engine = FakeEngine(gated=True)

    async def main():
        lanes = Lanes(1)
        batcher = Batcher(engine, Policy(max_batch_rows=2), lanes=lanes)
        try:
            blocker = asyncio.create_task(batcher.submit([[1] * 5]))
            await until(lambda: engine.seen == [1])  # on the lane
            # One round, two calls of two rows: [2, 3] in line, [6, 7] held.
            first = asyncio.create_task(batcher.submit([[2] * 5, [3] * 5]))
            gone = asyncio.create_task(batcher.submit([[6] * 5]))
            kept = asyncio.create_task(batcher.submit([[7] * 5]))
            await until(lambda: lanes.held == lanes.slots and batcher.admission.waiting == 0)
            gone.cancel()
            await until(gone.done)
        finally:
            engine.finish(100)
        await asyncio.gather(blocker, first, kept)
        await batcher.close()
        return batcher.admission

    admission = run(main())
    assert 6 not in engine.seen and engine.seen[-1] == 7
    assert (admission.waiting, admission.running) == (0, 0)


def test_a_held_row_whose_deadline_passes_fails_its_request_unrun(now: list[float]) -> None:
    from serving.batching import Lanes

    engine = FakeEngine(gated=True)

    async def main():
        lanes = Lanes(1)
        batcher = Batcher(engine, Policy(max_batch_rows=1), lanes=lanes)
        try:
            blocker = asyncio.create_task(batcher.submit([[1] * 5]))
            await until(lambda: engine.seen == [1])  # on the lane
            late = asyncio.create_task(batcher.submit([[2] * 5, [3] * 40], deadline_s=0.15))
            # one row in line, one held, both past the deadline when the lane frees
            await until(lambda: lanes.held == lanes.slots and batcher.admission.waiting == 0)
            now[0] += 0.3
        finally:
            engine.finish(100)
        with pytest.raises(DeadlineExceeded):
            await late
        await blocker
        await batcher.close()
        return batcher.admission

    admission = run(main())
    assert engine.seen == [1]
    assert (admission.waiting, admission.running) == (0, 0)


def test_held_rows_past_their_deadline_are_failed_before_they_are_cut_into_a_call(
    now: list[float],
) -> None:
    """Rows held for a free lane whose request's deadline has passed are refused when the next
    call is chosen: not cut into a call and handed to a lane to be skipped there (only the count
    of hand-offs tells the two apart: either way the request fails as late, unrun). All of the
    request's rows are held, none in line, so its outcome does not depend on which of an in-line
    call's answer and the next choice comes first (the test above: there either fails it)."""
    from serving.batching import Lanes

    engine = FakeEngine(gated=True)
    recorder = Sheds()

    async def main():
        lanes = Lanes(1)
        batcher = Batcher(engine, Policy(max_batch_rows=1), lanes=lanes, recorder=recorder)
        handed = []
        run_on_lane = batcher.lanes.run
        batcher.lanes.run = lambda work, then, size=0: (
            handed.append(work),
            run_on_lane(work, then, size),
        )
        try:
            blocker = asyncio.create_task(batcher.submit([[1] * 5]))
            await until(lambda: engine.seen == [1])  # on the lane
            # One round: the oldest row (the next call) goes in line, the late request's two are
            # held.
            in_line = asyncio.ensure_future(batcher.submit([[2] * 5]))
            late = asyncio.ensure_future(batcher.submit([[3] * 5, [4] * 9], deadline_s=0.1))
            await until(lambda: lanes.held == lanes.slots and batcher.admission.waiting == 0)
            now[0] += 0.3  # past the late request's deadline before the lane frees
        finally:
            engine.finish(100)
        outcome = await asyncio.gather(blocker, in_line, late, return_exceptions=True)
        await batcher.close()
        return outcome, len(handed), batcher.admission

    (first, second, late), handed, admission = run(main())
    assert isinstance(late, DeadlineExceeded) and "while queued" in str(late)
    assert first[0][0, 0] == 5 and second[0][0, 0] == 10
    assert engine.seen == [1, 2] and handed == 2  # the late rows never reached a lane
    assert recorder.reasons == ["deadline"]
    assert (admission.waiting, admission.running) == (0, 0)


def test_rows_held_over_half_a_round_are_planned_before_the_queue_is_taken_from(
    monkeypatch,
) -> None:
    """The queue tops up the rows held only once they fall below half of ``round_tokens``: a
    request that arrives meanwhile waits in the queue, and the plan is not run again for it."""
    import serving.batching.batcher as batcher_module
    from serving.batching import Lanes

    plans = []
    plan = batcher_module.plan
    monkeypatch.setattr(
        batcher_module,
        "plan",
        lambda lengths, *a, **k: plans.append(list(lengths)) or plan(lengths, *a, **k),
    )
    engine = FakeEngine(gated=True)

    async def main():
        lanes = Lanes(1)
        batcher = Batcher(engine, Policy(max_batch_rows=1, round_tokens=20), lanes=lanes)
        try:
            # 20 tokens: one row on the lane, one in line, 10 tokens held (half the round)
            whole = asyncio.create_task(batcher.submit([[i + 1] * 5 for i in range(4)]))
            await until(lambda: engine.seen == [1] and lanes.held == lanes.slots)
            later = asyncio.create_task(batcher.submit([[9] * 5]))
            await until(lambda: batcher.admission.waiting == 5)  # in the queue
        finally:
            engine.finish(100)
        await asyncio.gather(whole, later)
        await batcher.close()

    run(main())
    # taken when 5 tokens were held: planned with the last row, not with the last two
    assert plans == [[5, 5, 5, 5], [5, 5]]
    assert engine.seen == [1, 2, 3, 4, 9]


def test_the_tokens_held_are_the_held_rows_tokens_after_every_call_rows_gone_included() -> None:
    """The batcher keeps the tokens it holds by subtraction, not by summing its rows each call: a
    drift would gate the queue's top-up wrongly and leave admission counting work never run. A
    request cut into three calls counts three."""
    from serving.batching import Lanes

    engine = FakeEngine(gated=True)
    checked = []

    async def main():
        lanes = Lanes(1)
        batcher = Batcher(engine, Policy(max_batch_rows=1, round_tokens=20), lanes=lanes)
        next_call = batcher._next_call

        def checking():
            call = next_call()
            held = sum(len(r.sequences[row]) for r, row in batcher._held)
            checked.append((batcher._held_tokens, held))
            return call

        batcher._next_call = checking
        try:
            blocker = asyncio.create_task(batcher.submit([[1] * 5]))
            await until(lambda: engine.seen == [1])  # on the lane
            three = asyncio.create_task(batcher.submit([[2] * 5, [3] * 4, [4] * 3]))
            gone = asyncio.create_task(batcher.submit([[5] * 2, [6] * 2]))
            await until(lambda: lanes.held == lanes.slots and batcher.admission.waiting == 0)
            gone.cancel()  # its rows are held: planned out when the lane frees
            await until(gone.done)
            later = asyncio.create_task(batcher.submit([[7] * 6]))
            await until(lambda: batcher.admission.waiting == 6)  # queued behind them
        finally:
            engine.finish(100)
        await blocker
        (_, timing), _ = await asyncio.gather(three, later)
        await batcher.close()
        return timing, batcher.admission

    timing, admission = run(main())
    assert checked and all(kept == held for kept, held in checked)
    assert 5 not in engine.seen and 6 not in engine.seen and engine.seen[-1] == 7
    assert timing.engine_calls == 3
    assert (admission.waiting, admission.running) == (0, 0)


def test_a_call_counts_once_for_each_request_in_it_whatever_its_rows() -> None:
    engine = FakeEngine()

    async def main():
        batcher = Batcher(engine, Policy())
        _, timing = await batcher.submit([[1] * 3, [2] * 3, [3] * 3])
        await batcher.close()
        return timing

    timing = run(main())
    assert engine.calls == [(3, 3)] and timing.engine_calls == 1


def test_queue_full_gives_429_with_retry_after() -> None:
    engine = FakeEngine(delay_s=0.05)

    async def main():
        batcher = Batcher(engine, Policy(max_queue_tokens=50, deadline_s=60))
        outcomes = await asyncio.gather(
            *(batcher.submit([[1] * 20]) for _ in range(10)), return_exceptions=True
        )
        await batcher.close()
        return outcomes

    outcomes = run(main())
    refused = [o for o in outcomes if isinstance(o, QueueFull)]
    served = [o for o in outcomes if not isinstance(o, Exception)]
    assert refused and served
    assert all(o.status == 429 and o.retry_after >= 1 for o in refused)
    assert refused[0].response().headers["Retry-After"] == str(refused[0].retry_after)


def test_deadline_that_cannot_be_met_gives_503_at_once() -> None:
    engine = FakeEngine(delay_s=0.2)

    async def main():
        # Measured speed: 20 tokens / 0.2 s = 100 tokens/s, so a 0.5 s deadline admits ~50 tokens.
        batcher = Batcher(engine, Policy(deadline_s=0.5), tokens_per_s=100)
        outcomes = await asyncio.gather(
            *(batcher.submit([[1] * 20]) for _ in range(10)), return_exceptions=True
        )
        await batcher.close()
        return outcomes

    outcomes = run(main())
    refused = [o for o in outcomes if isinstance(o, DeadlineExceeded)]
    assert refused, outcomes
    assert all(o.status == 503 and o.retry_after >= 1 for o in refused)
    served = sum(not isinstance(o, Exception) for o in outcomes)
    assert served >= 1
    # "At once": refused on admission (the reason says so, not a deadline passed in the queue),
    # so the engine never saw a refused request's rows.
    assert all("cannot finish within" in str(o) for o in refused), refused
    assert sum(rows for rows, _ in engine.calls) == served


def test_request_whose_deadline_passes_in_queue_is_dropped_before_the_engine(
    now: list[float],
) -> None:
    engine = FakeEngine(gated=True)

    async def main():
        batcher = Batcher(engine, Policy(deadline_s=10), tokens_per_s=1e9)
        try:
            first = asyncio.create_task(batcher.submit([[11, 1]]))
            await until(lambda: engine.seen == [11])  # the first call is on the engine now
            late = asyncio.gather(batcher.submit([[22, 2]], deadline_s=0.1), return_exceptions=True)
            await until(lambda: batcher.lanes.held == 2)  # in line behind it
            now[0] += 0.3  # the first call outlasts its deadline
        finally:
            engine.finish(100)
        outcome = await late
        await first
        await batcher.close()
        return outcome[0]

    outcome = run(main())
    assert isinstance(outcome, DeadlineExceeded)
    assert 22 not in engine.seen


def test_cancelled_request_is_not_computed() -> None:
    engine = FakeEngine(gated=True)

    async def main():
        batcher = Batcher(engine, Policy())
        try:
            first = asyncio.create_task(batcher.submit([[11, 1]]))
            await until(lambda: engine.seen == [11])  # on the lane
            gone = asyncio.create_task(batcher.submit([[33, 3]]))
            # One step of the loop: the request is queued, and cancelled before the batcher's
            # loop (woken by it) takes it from the queue.
            await asyncio.sleep(0)
            assert batcher.admission.waiting == 2  # its two tokens, in the queue
            gone.cancel()
            await until(gone.done)
        finally:
            engine.finish(100)
        await first
        kept = await batcher.submit([[44, 4]])
        await batcher.close()
        return kept

    rows, _ = run(main())
    assert rows[0, :2].tolist() == [48, 2]
    assert 33 not in engine.seen


def test_engine_failure_fails_that_call_and_keeps_serving() -> None:
    calls = {"n": 0}

    def flaky(feeds: Feeds) -> np.ndarray:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("engine blew up")
        return FakeEngine()(feeds)

    async def main():
        batcher = Batcher(flaky, Policy())
        with pytest.raises(RuntimeError, match="blew up"):
            await batcher.submit([[1, 2]])
        rows, _ = await batcher.submit([[3, 4]])
        await batcher.close()
        return rows

    assert run(main())[0, :2].tolist() == [7, 2]


@pytest.mark.parametrize("bad", [[], [[]], [[1], []]])
def test_empty_input_is_refused(bad) -> None:
    async def main():
        batcher = Batcher(FakeEngine(), Policy())
        with pytest.raises(ValueError):
            await batcher.submit(bad)

    run(main())


def test_policy_validates_limits() -> None:
    from dataclasses import replace

    with pytest.raises(ValueError, match="max_batch_tokens"):
        replace(Policy(), max_batch_tokens=0)
    with pytest.raises(ValueError, match="deadline_s"):
        replace(Policy(), deadline_s=0)


def test_shared_lanes_serve_the_batcher_with_the_least_work_first() -> None:
    """Two batchers on one lane (two models of a runner): A has a queue of long rows, one call
    running and one in line, when B asks for one short row. The next free slot goes to B, the
    batcher with fewer tokens to do, so B's call runs right after A's call in line, before the
    rest of A's queue (first come, first served would put it after A's next call too)."""
    from serving.batching import Lanes

    engine = FakeEngine(gated=True)

    async def main():
        lanes = Lanes(1)
        a = Batcher(engine, Policy(max_batch_rows=1), lanes=lanes)
        b = Batcher(engine, Policy(max_batch_rows=1), lanes=lanes)
        try:
            bulk = [asyncio.create_task(a.submit([[i] * 30])) for i in range(1, 7)]
            # A's first call on the lane, its second in line, A waiting for the next slot.
            await until(lambda: engine.seen == [1] and lanes.held == lanes.slots)
            short = asyncio.create_task(b.submit([[99] * 3]))
            await asyncio.sleep(0.01)  # B waits for a slot beside A (nothing runs meanwhile)
            engine.finish()  # the freed slot goes to B: its call goes in line behind A's second
            await until(lambda: engine.seen == [1, 2] and b.admission.waiting == 0)
        finally:
            engine.finish(100)
        await asyncio.gather(short, *bulk)
        await a.close()
        await b.close()

    run(main())
    assert engine.seen == [1, 2, 99, 3, 4, 5, 6]


def test_a_free_lane_takes_the_smallest_call_in_line() -> None:
    """Calls handed to the lanes while every lane is busy run smallest first, in arrival order
    among equals."""
    from serving.batching import Lanes

    order: list[str] = []
    started, release = threading.Event(), threading.Event()

    async def main():
        lanes = Lanes(1, "test-engine")
        done = asyncio.get_running_loop().create_future()
        answered: list[str] = []

        def then(result: str, error: BaseException | None) -> None:
            answered.append(result)
            if len(answered) == 4:
                done.set_result(None)

        def work(name: str) -> str:
            if name == "first":
                started.set()
                release.wait(5)
            order.append(name)
            return name

        lanes.run(lambda: work("first"), then, 100)
        assert await asyncio.to_thread(started.wait, 5)  # the lane busy with the first call
        for name, size in (("big", 500), ("small", 10), ("big too", 500)):
            lanes.run(lambda name=name: work(name), then, size)
        release.set()
        await asyncio.wait_for(done, 5)
        lanes.close()

    run(main())
    assert order == ["first", "small", "big", "big too"]


def test_lanes_run_calls_at_once_and_a_lone_call_runs_solo() -> None:
    """Two lanes: a backlog runs on both at once, on the one-thread engine; a call that is alone
    (nothing running, nothing queued) runs on the solo engine."""
    from serving.batching import Lanes

    narrow, solo = FakeEngine(delay_s=0.05), FakeEngine(delay_s=0.05)
    running, most = [0], [0]
    lock = threading.Lock()

    def counted(engine: FakeEngine):
        def call(feeds: Feeds) -> np.ndarray:
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            try:
                return engine(feeds)
            finally:
                with lock:
                    running[0] -= 1

        return call

    async def main():
        # one row per call: each request is a call of its own
        batcher = Batcher(
            counted(narrow), Policy(max_batch_rows=1), lanes=Lanes(2), solo=counted(solo)
        )
        lone = await batcher.submit([[5, 6]])
        backlog = await asyncio.gather(*(batcher.submit([[i + 1, 2]]) for i in range(8)))
        await batcher.close()
        return lone, backlog

    lone, backlog = run(main())
    assert lone[0][0, :2].tolist() == [11, 2]
    for i, (rows, _) in enumerate(backlog):
        assert rows[0, :2].tolist() == [i + 3, 2]  # each request its own answer, in order
    assert solo.seen[0] == 5 and most[0] == 2  # the lone call solo; then two calls at once
    assert len(narrow.seen) >= 6  # the backlog on the lanes


def test_lanes_run_work_on_their_own_threads_and_answer_on_the_loop() -> None:
    """A lane runs the work on one of its ``count`` threads, never the event loop's, and hands the
    result (or what the work raised) back as a callback on the loop's thread."""
    from serving.batching import Lanes

    async def main():
        lanes = Lanes(2, "test-engine")
        answers: asyncio.Queue = asyncio.Queue()
        ran_on: list[str] = []

        def work(k: int) -> int:
            ran_on.append(threading.current_thread().name)
            time.sleep(0.01)
            if k == 3:
                raise ValueError("engine broke")
            return k * 10

        def then(result, error) -> None:
            answers.put_nowait(
                (result, error, threading.current_thread() is threading.main_thread())
            )

        for k in range(6):
            lanes.run(lambda k=k: work(k), then)
        # bounded: an answer that never reaches the loop fails the test instead of hanging it
        got = [await asyncio.wait_for(answers.get(), 5) for _ in range(6)]
        threads = list(lanes._threads)
        lanes.close()
        return got, ran_on, threads

    got, ran_on, threads = run(main())
    assert sorted(r for r, e, _ in got if e is None) == [0, 10, 20, 40, 50]
    assert [type(e) for r, e, _ in got if e is not None] == [ValueError]
    assert all(on_loop for _, _, on_loop in got)  # answered on the loop's thread
    assert set(ran_on) <= {"test-engine_0", "test-engine_1"} and len(ran_on) == 6
    assert len(threads) == 2 and not any(t.is_alive() for t in threads)  # close() ended them


def test_an_idle_lane_keeps_nothing_of_its_last_call() -> None:
    """Once a batcher has closed (an evicted model's), nothing of it stays reachable from the
    shared lanes' threads: not the batcher, its engine, nor its last call's requests and rows."""
    import gc
    import weakref

    from serving.batching import Lanes

    async def main():
        lanes = Lanes(1)
        engine = FakeEngine()
        batcher = Batcher(engine, Policy(), lanes=lanes)
        rows, _ = await batcher.submit([[3, 4]])
        batcher.close_when_idle()
        await asyncio.wait_for(batcher._task, 5)
        gone = weakref.ref(batcher), weakref.ref(engine), weakref.ref(rows)
        del batcher, engine, rows
        for _ in range(100):  # until the lane thread is back waiting for work (bounded: 5 s)
            await asyncio.sleep(0.05)
            gc.collect()
            alive = [ref() is not None for ref in gone]
            if not any(alive):
                break
        lanes.close()
        return alive

    assert run(main()) == [False, False, False]


def test_a_lane_thread_that_cannot_start_fails_the_call_and_frees_its_slots(monkeypatch) -> None:
    """If no lane thread can start (a process out of threads), the call's requests get the error
    at once, its slots and admitted tokens are given back and close() returns; once threads can
    start again, the batcher serves."""
    from serving.batching import Lanes

    started = threading.Thread.start

    def refuse(thread: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    async def main():
        batcher = Batcher(FakeEngine(), Policy(), lanes=Lanes(2))
        monkeypatch.setattr(threading.Thread, "start", refuse)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            await asyncio.wait_for(batcher.submit([[5, 6]]), 5)
        held, running = batcher.lanes.held, batcher.admission.running
        monkeypatch.setattr(threading.Thread, "start", started)
        rows, _ = await asyncio.wait_for(batcher.submit([[7, 8]]), 5)
        await asyncio.wait_for(batcher.close(), 5)
        return held, running, rows

    held, running, rows = run(main())
    assert (held, running) == (0, 0)
    assert rows[0, :2].tolist() == [15, 2]


def test_one_lane_keeps_one_call_in_line_and_drops_it_if_its_caller_goes() -> None:
    """While a lane works, one more call waits in line (no gap between calls); a call in line
    whose requests have all gone is skipped before it costs engine time."""
    engine = FakeEngine(gated=True)

    async def main():
        batcher = Batcher(engine, Policy(max_batch_rows=1))
        try:
            first = asyncio.create_task(batcher.submit([[11, 1]]))
            await until(lambda: engine.seen == [11])  # the first call is on the lane
            gone = asyncio.create_task(batcher.submit([[33, 3]]))
            await until(lambda: batcher.lanes.held == 2)  # in line behind it
            gone.cancel()
            await until(gone.done)
        finally:
            engine.finish(100)
        await first
        kept = await batcher.submit([[44, 4]])
        await batcher.close()
        return kept

    rows, _ = run(main())
    assert rows[0, :2].tolist() == [48, 2]
    assert 33 not in engine.seen


def test_admission_returns_to_zero_and_close_answers_calls_not_yet_placed() -> None:
    """Closing while a round's rows wait for a lane (one in line, one held): every request is
    answered (served or refused), none left waiting, and the admission's counts return to zero."""
    from serving.batching import Lanes

    engine = FakeEngine(gated=True)

    async def main():
        lanes = Lanes(1)
        batcher = Batcher(engine, Policy(max_batch_rows=1), lanes=lanes)
        engine.finish(3)
        served = await asyncio.gather(*(batcher.submit([[i + 1, 2]]) for i in range(3)))
        counts = (batcher.admission.waiting, batcher.admission.running)
        # three calls' worth of rows, one lane: the third is held when close() comes
        pending = asyncio.gather(batcher.submit([[7, 1], [8, 1], [9, 1]]), return_exceptions=True)
        try:
            await until(lambda: engine.seen[-1] == 7 and lanes.held == lanes.slots)
            closing = asyncio.create_task(batcher.close())
            await until(lambda: batcher._task is None)  # placing no more: 9 stays held
        finally:
            engine.finish(100)
        await closing
        outcome = await asyncio.wait_for(pending, timeout=5)
        return served, counts, outcome[0], batcher.admission

    served, counts, outcome, admission = run(main())
    assert [rows[0, 0] for rows, _ in served] == [3, 4, 5] and counts == (0, 0)
    assert isinstance(outcome, DeadlineExceeded)  # refused at close, not left hanging
    assert (admission.waiting, admission.running) == (0, 0)


def test_a_close_while_a_solo_call_waits_for_its_slots_answers_its_request() -> None:
    """A lone call takes one slot, then the others before it runs solo. Here the others stay busy
    (as when another batcher sharing the lanes holds them: the stub stands in for that wait), and
    the batcher closes while the call waits: its rows go back to the rows held, and close()
    refuses them. Its request is answered, the slot it took is free again (all of them can be
    placed at once), and the admission's counts return to zero."""
    from serving.batching import Lanes

    async def main():
        batcher = Batcher(FakeEngine(), Policy(), lanes=Lanes(2), solo=FakeEngine())
        place, waiting = batcher.lanes.place, asyncio.Event()

        async def slots_never_free(slots: int = 1, tokens: float = 0) -> None:
            if slots == 1:
                return await place(slots, tokens)
            waiting.set()
            await asyncio.Event().wait()  # the other slots stay busy until the close

        batcher.lanes.place = slots_never_free
        request = asyncio.ensure_future(batcher.submit([[5, 6], [7]]))
        await asyncio.wait_for(waiting.wait(), timeout=5)  # the solo call waits for its slots
        await batcher.close()
        outcome = await asyncio.wait_for(asyncio.gather(request, return_exceptions=True), 5)
        await asyncio.wait_for(place(batcher.lanes.slots), 1)  # every slot free
        batcher.lanes.done(batcher.lanes.slots)
        return outcome[0], batcher

    outcome, batcher = run(main())
    assert isinstance(outcome, DeadlineExceeded) and "shutting down" in str(outcome)
    assert batcher.lanes.held == 0
    assert (batcher.admission.waiting, batcher.admission.running) == (0, 0)


def test_a_solo_call_runs_with_nothing_beside_it() -> None:
    """While a lone call runs on the solo engine (every core), calls that arrive wait for it
    instead of running beside it on the other lane."""
    from serving.batching import Lanes

    solo, narrow = FakeEngine(delay_s=0.2), FakeEngine(delay_s=0.01)
    overlap: list[bool] = []
    running = {"solo": False}

    def solo_call(feeds: Feeds) -> np.ndarray:
        running["solo"] = True
        try:
            return solo(feeds)
        finally:
            running["solo"] = False

    def narrow_call(feeds: Feeds) -> np.ndarray:
        overlap.append(running["solo"])
        return narrow(feeds)

    async def main():
        batcher = Batcher(narrow_call, Policy(max_batch_rows=1), lanes=Lanes(2), solo=solo_call)
        lone = asyncio.create_task(batcher.submit([[5, 6]]))
        await asyncio.sleep(0.05)  # the lone call is on the solo engine
        await asyncio.gather(batcher.submit([[7, 8]]), batcher.submit([[9, 8]]))
        await lone
        await batcher.close()

    run(main())
    assert solo.seen == [5] and sorted(narrow.seen) == [7, 9]  # two calls: the lanes
    assert overlap == [False, False]  # neither ran while the solo call did


def test_engine_calls_teach_admission_the_speed() -> None:
    """The calls that end among other work are measured (Admission.overlapped): after calls
    worth more than a window, the speed admission plans with is no longer the seed it started
    from."""
    from serving.batching import Lanes

    async def main():
        batcher = Batcher(
            FakeEngine(delay_s=0.03), Policy(max_batch_rows=1), lanes=Lanes(2), tokens_per_s=1e6
        )
        await asyncio.gather(*(batcher.submit([[1, 2, 3]]) for _ in range(8)))
        await batcher.close()
        return batcher.tokens_per_s

    assert run(main()) < 1e6  # ~100 tokens/s measured: far below the seed, whatever the timing


def test_lone_engine_calls_leave_the_speed_where_it_was() -> None:
    """Requests one at a time each make a call that ends alone: slow as they are, they say how
    long one call takes, not what the instance does with a backlog."""

    async def main():
        batcher = Batcher(FakeEngine(delay_s=0.03), Policy(max_batch_rows=1), tokens_per_s=1e6)
        for _ in range(4):  # 3 tokens per 0.03 s each: ~100 tokens/s, over two windows
            await batcher.submit([[1, 2, 3]])
        await batcher.close()
        return batcher.tokens_per_s

    assert run(main()) == 1e6


def test_an_engine_call_s_cpu_is_its_lane_thread_s_inside_the_engine_and_nothing_around_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine CPU a call reports (what the benchmark subtracts from the runner's CPU to get
    everything else) is the lane thread's CPU inside the engine: an engine that spins is counted,
    one that sleeps is not, and padding that spins before the call is not either."""
    from serving.batching import batcher as batcher_module

    def spinning(feeds: Feeds) -> np.ndarray:
        spin(0.05)
        return np.zeros((len(feeds["input_ids"]), 1))

    def sleeping(feeds: Feeds) -> np.ndarray:
        time.sleep(0.05)  # nobody's CPU
        return np.zeros((len(feeds["input_ids"]), 1))

    async def cpu_of(engine) -> float:
        calls = Calls()
        batcher = Batcher(engine, Policy(), recorder=calls)
        await batcher.submit([[1, 2, 3]])
        await batcher.close()
        (cpu,) = calls.cpu
        return cpu

    # Each "not counted" bound is half the 0.05 s a wrongly counted spin would add, not near zero:
    # on a busy host a thread's own start-up and locking cost it milliseconds.
    assert run(cpu_of(spinning)) >= 0.05
    assert run(cpu_of(sleeping)) < 0.025
    padding, padded = batcher_module.pad, []

    def slow_padding(*args, **kwargs):
        padded.append(spin(0.05))
        return padding(*args, **kwargs)

    monkeypatch.setattr(batcher_module, "pad", slow_padding)
    assert run(cpu_of(sleeping)) < 0.025
    assert len(padded) == 1  # the call was padded, by the slow padding


def test_a_solo_call_s_engine_cpu_counts_its_session_s_own_threads() -> None:
    """A solo call holds every lane, so its engine's own threads (an ONNX session's pool) are
    counted as engine CPU: a solo engine that spins on a thread of its own while the calling
    thread waits is counted; the same engine run as a lane's call counts only the lane's thread
    (other lanes may run beside it, and their CPU is not its); and the event loop's CPU during a
    solo call is not counted."""
    from serving.batching import Lanes

    def pooled(feeds: Feeds) -> np.ndarray:
        worker = threading.Thread(target=spin, args=(0.05,))
        worker.start()
        worker.join()  # the calling thread waits: its own CPU stays ~0
        return np.zeros((len(feeds["input_ids"]), 1))

    def sleeping(feeds: Feeds) -> np.ndarray:
        time.sleep(0.2)
        return np.zeros((len(feeds["input_ids"]), 1))

    async def main():
        lone = Batcher(FakeEngine(), Policy(), lanes=Lanes(2), solo=pooled, recorder=Calls())
        await lone.submit([[1, 2, 3]])  # alone: the solo engine
        # A lane's call: the same engine, with a solo engine of its own beside it, not alone.
        on_lanes = Batcher(
            pooled, Policy(max_batch_rows=1), lanes=Lanes(2), solo=FakeEngine(), recorder=Calls()
        )
        await on_lanes.submit([[1, 2], [3, 4]])
        # The event loop spins while a solo call sleeps: the loop's CPU is not the engine's. Made
        # on another thread: the thread left out is the loop's, not the constructor's.
        busy = await asyncio.to_thread(
            Batcher, FakeEngine(), Policy(), lanes=Lanes(2), solo=sleeping, recorder=Calls()
        )
        call = asyncio.create_task(busy.submit([[1, 2, 3]]))
        await asyncio.sleep(0.02)  # the call is on its lane
        spin(0.1)
        await call
        for batcher in (lone, on_lanes, busy):
            await batcher.close()
        return lone.recorder.cpu, on_lanes.recorder.cpu, busy.recorder.cpu

    solo_cpu, lane_cpu, busy_loop_cpu = run(main())
    assert solo_cpu[0] >= 0.05  # its session's thread counted
    # Half the worker's 0.05 s, not near zero: on a busy host starting and joining a thread costs
    # the lane thread milliseconds of its own.
    assert len(lane_cpu) == 2 and max(lane_cpu) < 0.025  # two calls on the lanes: their threads
    assert busy_loop_cpu[0] < 0.03  # not the loop's 0.1 s
