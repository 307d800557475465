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


class Runner:
    """A runner with no replica until ``up_at`` (monotonic), then answering each call with its
    number; records each call made while down: when, and how many calls were in flight."""

    def __init__(self, up_in_s: float) -> None:
        self.up_at = time.monotonic() + up_in_s
        self.calls_while_down: list[tuple[float, int]] = []
        self.in_flight = 0
        self.answered = 0

    async def call(self) -> int:
        self.in_flight += 1
        try:
            await asyncio.sleep(0.01)
            if time.monotonic() < self.up_at:
                self.calls_while_down.append((time.monotonic(), self.in_flight))
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
    # more often than every retry_s.
    first = runner.calls_while_down[0][0]
    retries = [(t, n) for t, n in runner.calls_while_down if t > first + 0.05]
    assert len(runner.calls_while_down) - len(retries) == 20  # the first wave
    assert retries and all(n == 1 for _, n in retries)
    assert all(b - a >= 0.09 for (a, _), (b, _) in itertools.pairwise(retries))
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


def test_a_runners_own_error_opens_the_gate_and_is_passed_on() -> None:
    """A replica that answers, if with its own 503 (shedding), is up: the waiters go through."""
    up_at = time.monotonic() + 0.3
    sent = []

    async def call() -> str:
        sent.append(time.monotonic())
        if time.monotonic() < up_at:
            raise NoReplica("onnx_runner", "ConnectionRefusedError")
        if len(sent) % 2:
            raise Overloaded(503, 2, "onnx_runner: cannot finish in time")
        return "vectors"

    gate = ReplicaWait("onnx_runner", wait_s=5, max_waiting=10, retry_s=0.05)

    async def main() -> list[str | BaseException]:
        return await asyncio.gather(*(gate.call(call) for _ in range(4)), return_exceptions=True)

    outcomes = asyncio.run(main())
    assert gate.up
    assert all(o == "vectors" or type(o) is Overloaded for o in outcomes), outcomes
    assert "vectors" in outcomes
