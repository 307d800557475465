"""The batching core every runner shares.

Requests (lists of token-id sequences) wait in a bounded FIFO queue. Whenever the engine is free,
the loop takes a *round* of requests from the head of the queue, plans it into engine calls with
``grouping.plan`` (sorted by length, padded-token budget, dynamic padding), runs the calls one at
a time on the process's engine thread, and answers each request as soon as its last row is done,
rows in request order. While the engine runs, new requests queue up, so batches grow with load
and a lone request is never made to wait for company.

Admission is decided up front: a request that would overflow the queue gets 429, one that cannot
finish before its deadline at the measured engine speed gets 503, both with Retry-After; a request
whose deadline passes while queued, or whose caller has gone, is dropped before it costs engine time.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from models.features import Feeds, pad
from runners.batching.admission import Admission
from runners.batching.errors import DeadlineExceeded
from runners.batching.grouping import CALL_OVERHEAD_TOKENS, plan

Engine = Callable[[Feeds], np.ndarray]


@dataclass(frozen=True)
class Policy:
    max_batch_tokens: int = 1024  # padded tokens per engine call
    max_batch_rows: int = 64  # sequences per engine call
    round_tokens: int = 8192  # real tokens taken from the queue per round
    max_queue_tokens: int = 65536  # beyond this, 429
    deadline_s: float = 5.0  # default per-request deadline, queue + engine; beyond it, 503
    call_overhead_tokens: int = (
        CALL_OVERHEAD_TOKENS  # an engine call's fixed cost, in padded tokens
    )

    def __post_init__(self) -> None:
        for name in (
            "max_batch_tokens",
            "max_batch_rows",
            "round_tokens",
            "max_queue_tokens",
            "call_overhead_tokens",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.deadline_s <= 0:
            raise ValueError(f"deadline_s must be positive, got {self.deadline_s}")


@dataclass
class Timing:
    queue_s: float = 0.0  # enqueued -> its round started
    inference_s: float = 0.0  # round started -> its last row computed
    engine_calls: int = 0  # engine calls that held at least one of its rows


@dataclass
class _Request:
    sequences: Sequence[Sequence[int]]
    tokens: int
    deadline: float
    enqueued: float
    future: asyncio.Future
    timing: Timing = field(default_factory=Timing)
    rows: np.ndarray | None = None
    remaining: int = 0


class NullRecorder:
    def engine_call(self, rows: int, padded: int, real: int, seconds: float) -> None: ...
    def queued(self, seconds: float) -> None: ...
    def shed(self, reason: str) -> None: ...
    def queue_depth(self, tokens: int) -> None: ...


class Batcher:
    def __init__(
        self,
        engine: Engine,
        policy: Policy,
        *,
        executor: Executor | None = None,
        recorder: NullRecorder | None = None,
        pad_id: int = 0,
        tokens_per_s: float = 10_000.0,
    ) -> None:
        """``tokens_per_s`` seeds the speed estimate used for admission until calls are measured."""
        self.engine = engine
        self.policy = policy
        self.pad_id = pad_id
        self.recorder = recorder or NullRecorder()
        self._executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._queue: collections.deque[_Request] = collections.deque()
        self.admission = Admission(
            policy.max_queue_tokens, policy.deadline_s, tokens_per_s, on_shed=self.recorder.shed
        )
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False

    # -- public ---------------------------------------------------------------------------

    @property
    def tokens_per_s(self) -> float:
        """Measured engine speed (real tokens per second of engine time, moving average)."""
        return self.admission.tokens_per_s

    async def submit(
        self, sequences: Sequence[Sequence[int]], deadline_s: float | None = None
    ) -> tuple[np.ndarray, Timing]:
        """Embed ``sequences``; returns one output row per sequence, in order, and the timing."""
        if not sequences or any(len(s) == 0 for s in sequences):
            raise ValueError("sequences must be a non-empty list of non-empty sequences")
        self._ensure_running()
        tokens = sum(len(s) for s in sequences)
        budget = self.admission.admit(tokens, deadline_s)
        now = time.monotonic()
        request = _Request(
            sequences=sequences,
            tokens=tokens,
            deadline=now + budget,
            enqueued=now,
            future=asyncio.get_running_loop().create_future(),
            remaining=len(sequences),
        )
        self._queue.append(request)
        self.recorder.queue_depth(self.admission.waiting)
        self._wakeup.set()
        # Awaiting the future directly: if the caller is cancelled, so is the future, and the
        # loop skips the request instead of computing it for nobody.
        rows = await request.future
        return rows, request.timing

    def close_when_idle(self) -> None:
        """Stop the loop once the queue is empty: requests already submitted are still served.
        (An evicted model's batcher must not outlive its last request: the loop task holds it.)"""
        self._closing = True
        self._wakeup.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for request in self._queue:
            self.admission.cancelled(request.tokens)
            if not request.future.done():
                request.future.set_exception(DeadlineExceeded(1, "runner is shutting down"))
        self._queue.clear()

    # -- the loop -------------------------------------------------------------------------

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="batcher")

    async def _loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue:
                await self._run_round(self._take_round())
            if self._closing:
                return

    def _take_round(self) -> list[_Request]:
        now = time.monotonic()
        taken: list[_Request] = []
        tokens = 0
        while self._queue and (
            not taken or tokens + self._queue[0].tokens <= self.policy.round_tokens
        ):
            request = self._queue.popleft()
            if request.future.done():  # cancelled by its caller
                self.admission.cancelled(request.tokens)
                continue
            if now > request.deadline:
                request.future.set_exception(self.admission.expired(request.tokens))
                continue
            self.admission.started(request.tokens)
            request.timing.queue_s = now - request.enqueued
            self.recorder.queued(request.timing.queue_s)
            taken.append(request)
            tokens += request.tokens
        self.recorder.queue_depth(self.admission.waiting)
        return taken

    async def _run_round(self, requests: list[_Request]) -> None:
        if not requests:
            return
        started = time.monotonic()
        sequences = [seq for r in requests for seq in r.sequences]
        owners = [(r, row) for r in requests for row in range(len(r.sequences))]
        lengths = [len(s) for s in sequences]
        loop = asyncio.get_running_loop()
        p = self.policy
        for group in plan(lengths, p.max_batch_tokens, p.max_batch_rows, p.call_overhead_tokens):
            members = [owners[i] for i in group.indices]
            real = sum(lengths[i] for i in group.indices)
            if all(request.future.done() for request, _ in members):
                self.admission.finished(real)
                continue
            batch = [sequences[i] for i in group.indices]
            call_started = time.monotonic()
            try:
                out = await loop.run_in_executor(
                    self._executor, self.engine, pad(batch, self.pad_id)
                )
            except Exception as exc:  # the engine failed: fail this call's requests, keep serving
                for request, _ in members:
                    if not request.future.done():
                        request.future.set_exception(exc)
                self.admission.finished(real)
                continue
            seconds = time.monotonic() - call_started
            self.admission.finished(real, seconds)
            self.recorder.engine_call(len(batch), group.padded_tokens, real, seconds)
            self._deliver(members, out, time.monotonic() - started)

    @staticmethod
    def _deliver(members: list[tuple[_Request, int]], out: np.ndarray, elapsed: float) -> None:
        """Scatter one engine call's rows to their requests; answer those now complete."""
        for request in {id(r): r for r, _ in members}.values():
            request.timing.engine_calls += 1
        for (request, row), vector in zip(members, out, strict=True):
            if request.future.done():
                continue
            if request.rows is None:
                request.rows = np.empty((len(request.sequences), *vector.shape), dtype=vector.dtype)
            request.rows[row] = vector
            request.remaining -= 1
            if request.remaining == 0:
                request.timing.inference_s = elapsed
                request.future.set_result(request.rows)
