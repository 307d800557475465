"""Requests wait for a runner that has no replica up (services/tokenizer/replica_wait.py): answered
once one is up, one waiter at a time trying again meanwhile, a bounded number waiting for a bounded
time, and a runner's own answers (errors included) passed on as they are."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from services.tokenizer.clients import NoReplica
from services.tokenizer.replica_wait import ReplicaWait
from serving.errors import Overloaded
from tests.waits import until


class Runner:
    """A runner with no replica until ``up_at`` (monotonic), then answering each call with its
    number; records each call made while down: when it was made, and how many calls were then in
    flight (itself included)."""

    def __init__(self, up_in_s: float) -> None:
        self.up_at = time.monotonic() + up_in_s
        self.calls_while_down: list[tuple[float, int]] = []
        self.in_flight = 0
        self.answered = 0

    async def call(self) -> int:
        self.in_flight += 1
        made = (time.monotonic(), self.in_flight)
        try:
            await asyncio.sleep(0.01)
            if time.monotonic() < self.up_at:
                self.calls_while_down.append(made)
                raise NoReplica("onnx_runner", "no replica of this service is up")
            self.answered += 1
            return self.answered
        finally:
            self.in_flight -= 1


def test_requests_sent_while_no_replica_is_up_are_answered_once_one_is() -> None:
    runner = Runner(up_in_s=0.6)
    gate = ReplicaWait("onnx_runner", wait_s=5, max_waiting=100, retry_s=0.1)

    async def main() -> list[int]:
        return await asyncio.gather(*(gate.call(runner.call) for _ in range(20)))

    answers = asyncio.run(main())
    assert sorted(answers) == list(range(1, 21))  # every request answered, each once
    assert gate.up and gate.waiting == 0
    # While down, after the first calls failed together, one waiter at a time tried again, no
    # more often than every retry_s (each try is made as soon as the gate times it: when it was
    # made is when the gate let it go).
    first_wave, retries = runner.calls_while_down[:20], runner.calls_while_down[20:]
    assert max(n for _, n in first_wave) == 20  # all 20 in flight at once
    assert retries and all(n == 1 for _, n in retries)
    assert all(b - a >= 0.1 - 1e-3 for (a, _), (b, _) in itertools.pairwise(retries))
    assert len(retries) <= 0.6 / 0.1 + 1


def test_waiters_beyond_the_bound_are_refused_at_once_with_retry_after() -> None:
    runner = Runner(up_in_s=0.5)
    gate = ReplicaWait("onnx_runner", wait_s=5, max_waiting=3, retry_s=0.1)

    async def main() -> list[int | BaseException]:
        return await asyncio.gather(
            *(gate.call(runner.call) for _ in range(5)), return_exceptions=True
        )

    outcomes = asyncio.run(main())
    refused = [o for o in outcomes if isinstance(o, NoReplica)]
    assert len(refused) == 2 and sum(isinstance(o, int) for o in outcomes) == 3
    assert refused[0].status == 503 and refused[0].headers() == {"Retry-After": "1"}
    assert "3 requests already wait" in refused[0].message


def test_a_request_waits_at_most_wait_s_then_gets_503() -> None:
    gate = ReplicaWait("onnx_runner", wait_s=0.3, max_waiting=10, retry_s=0.05)
    began = time.monotonic()
    with pytest.raises(NoReplica) as info:
        asyncio.run(gate.call(Runner(up_in_s=60).call))
    assert 0.3 <= time.monotonic() - began < 2
    assert "none came up within 0.3 s" in info.value.message and not gate.up


def test_with_no_wait_the_first_refusal_is_passed_on() -> None:
    runner = Runner(up_in_s=60)
    gate = ReplicaWait("onnx_runner", wait_s=0, max_waiting=10)
    with pytest.raises(NoReplica):
        asyncio.run(gate.call(runner.call))
    assert gate.up and len(runner.calls_while_down) == 1


def test_an_error_while_down_is_passed_on_and_only_an_answer_opens_the_gate() -> None:
    """The first try after the runner came back is shed (its own 503): that waiter gets the
    error, the gate stays closed, the next waiter's try is answered and opens it."""
    up_at = time.monotonic() + 0.3
    gate = ReplicaWait("onnx_runner", wait_s=5, max_waiting=10, retry_s=0.05)
    open_at_each_call: list[bool] = []

    async def call() -> str:
        await asyncio.sleep(0.01)
        if time.monotonic() < up_at:
            raise NoReplica("onnx_runner", "ConnectionRefusedError")
        open_at_each_call.append(gate.up)
        if len(open_at_each_call) == 1:
            raise Overloaded(503, 2, "onnx_runner: cannot finish in time")
        return "vectors"

    async def main() -> list[str | BaseException]:
        return await asyncio.gather(*(gate.call(call) for _ in range(4)), return_exceptions=True)

    outcomes = asyncio.run(main())
    assert [type(o) for o in outcomes].count(Overloaded) == 1 and outcomes.count("vectors") == 3
    assert open_at_each_call[:2] == [False, False]  # two tries while closed: shed, then answered
    assert open_at_each_call[2:] == [True, True] and gate.up


def test_a_cancelled_waiter_that_was_trying_hands_the_tries_over() -> None:
    runner = Runner(up_in_s=0.4)
    gate = ReplicaWait("onnx_runner", wait_s=5, max_waiting=10, retry_s=0.05)

    async def main() -> list[int | BaseException]:
        calls = [asyncio.ensure_future(gate.call(runner.call)) for _ in range(3)]
        await until(lambda: gate._trying is not None)  # the first wave failed; the first tries
        calls[0].cancel()  # its client left
        return await asyncio.gather(*calls, return_exceptions=True)

    answers = asyncio.run(main())
    assert isinstance(answers[0], asyncio.CancelledError)
    assert sorted(a for a in answers[1:] if isinstance(a, int)) == [1, 2] and gate.up


def test_a_gate_every_waiter_left_lets_the_next_request_try_at_once() -> None:
    """With nobody left waiting the gate stays closed; a request arriving once retry_s has passed
    since the last try tries at once: with a wait shorter than retry_s, it could not otherwise be
    answered."""
    runner = Runner(up_in_s=60)
    gate = ReplicaWait("onnx_runner", wait_s=0.1, max_waiting=10, retry_s=0.3)

    async def main() -> int:
        with pytest.raises(NoReplica, match=r"none came up within 0\.1 s"):
            await gate.call(runner.call)
        assert not gate.up and gate.waiting == 0
        await asyncio.sleep(0.4)
        runner.up_at = time.monotonic()
        return await gate.call(runner.call)

    assert asyncio.run(main()) == 1 and gate.up


def test_a_waiter_leaves_at_its_own_deadline_while_another_tries_slowly() -> None:
    """A try that hangs (a replica starting to accept, slow to answer) does not hold the other
    waiters past their wait: the one not trying leaves with 503 at its own deadline, not when the
    try ends (the trying one is bounded by its call's own deadline, not by the gate)."""
    gate = ReplicaWait("onnx_runner", wait_s=0.3, max_waiting=10, retry_s=0.01)
    tries = 0

    async def send() -> int:
        nonlocal tries
        tries += 1
        if tries <= 2:  # the first wave of both requests: no replica
            raise NoReplica("onnx_runner", "no replica of this service is up")
        await asyncio.sleep(2)  # the try that hangs
        return 1

    async def main() -> tuple[list[int | BaseException], float]:
        started = time.monotonic()
        calls = [asyncio.ensure_future(gate.call(send)) for _ in range(2)]
        await asyncio.wait(calls, return_when=asyncio.FIRST_COMPLETED)
        left_after = time.monotonic() - started
        for call in calls:
            call.cancel()
        return await asyncio.gather(*calls, return_exceptions=True), left_after

    answers, left_after = asyncio.run(main())
    assert left_after < 1.0  # the waiter left at its 0.3 s, long before the 2 s try ends
    assert any(isinstance(a, NoReplica) and "within 0.3 s" in str(a) for a in answers), answers
    assert tries == 3  # one try at a time: the waiter did not send a second


def test_the_gate_closes_again_when_the_replicas_go_again() -> None:
    """Up, then gone again (scaled to zero a second time): the next request closes the gate anew,
    waits, and is answered once a replica is back; the count of those that waited starts over."""
    runner = Runner(up_in_s=float("inf"))
    gate = ReplicaWait("onnx_runner", wait_s=5, max_waiting=10, retry_s=0.05)

    async def wave(count: int) -> list[int]:
        calls = [asyncio.ensure_future(gate.call(runner.call)) for _ in range(count)]
        for _ in range(500):  # each fails its first call and waits (within 5 s)
            if gate.waiting == count:
                break
            await asyncio.sleep(0.01)
        assert not gate.up and gate.waiting == count
        runner.up_at = time.monotonic()  # a replica is up
        return await asyncio.gather(*calls)

    async def main() -> tuple[list[int], list[int]]:
        first = await wave(3)
        assert gate.up and gate.waited == 3
        runner.up_at = float("inf")  # gone again
        second = await wave(2)
        return first, second

    first, second = asyncio.run(main())
    assert sorted(first) == [1, 2, 3] and sorted(second) == [4, 5]
    assert gate.up and gate.waited == 2


def test_requests_still_waiting_when_the_gate_closes_again_are_counted_in_the_new_closure() -> None:
    """A replica answers one waiter's try and is gone before the others' calls: the gate opens,
    their calls find no replica, and it closes again; they wait once more. When it opens the
    second time, those two waited through it and are counted (the count used to start at 0)."""

    class OneAnswerThenGone:
        def __init__(self) -> None:
            self.state, self.answered = "down", 0

        async def call(self) -> int:
            await asyncio.sleep(0.01)
            if self.state == "down":
                raise NoReplica("onnx_runner", "no replica of this service is up")
            if self.state == "one answer":
                self.state = "down"
            self.answered += 1
            return self.answered

    runner = OneAnswerThenGone()
    gate = ReplicaWait("onnx_runner", wait_s=5, max_waiting=10, retry_s=0.05)

    async def main() -> list[int]:
        calls = [asyncio.ensure_future(gate.call(runner.call)) for _ in range(3)]
        await until(lambda: gate.waiting == 3)
        assert gate.waited == 3
        runner.state = "one answer"
        # the try answered (the gate opened), then the other two calls closed it again
        await until(lambda: runner.answered == 1 and not gate.up)
        assert gate.waiting == 2 and gate.waited == 2
        runner.state = "up"
        return await asyncio.gather(*calls)

    assert sorted(asyncio.run(main())) == [1, 2, 3]
    assert gate.up and gate.waiting == 0 and gate.waited == 2
