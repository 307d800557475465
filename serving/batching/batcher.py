"""The runner side of the queue: rounds planned into engine calls, run one at a time.

Whenever the engine is free, the loop takes a *round* from the token queue (queue.py), plans it
into engine calls with ``grouping.plan`` (sorted by length, padded-token budget, dynamic padding),
runs the calls one at a time on the process's engine thread, and answers each request as soon as
its last row is done. While the engine runs, new requests queue up, so batches grow with load and
a lone request is never made to wait for company. An engine call whose requests have all gone
is skipped before it costs engine time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from serving.batching.admission import Admission
from serving.batching.grouping import plan
from serving.batching.metrics import NullRecorder
from serving.batching.queue import Pending, Timing, TokenQueue, clock, deliver, fail
from serving.features import Feeds, pad

Engine = Callable[[Feeds], np.ndarray]


@dataclass(frozen=True)
class Policy:
    """How a runner batches; built from its settings (runners/settings.py holds the defaults)."""

    max_batch_tokens: int  # padded tokens per engine call
    max_batch_rows: int  # sequences per engine call
    round_tokens: int  # real tokens taken from the queue per round
    max_queue_tokens: int  # beyond this, 429
    deadline_s: float  # default per-request deadline, queue + engine; beyond it, 503
    call_overhead_tokens: int  # an engine call's fixed cost, in padded tokens

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


class Batcher:
    def __init__(
        self,
        engine: Engine,
        policy: Policy,
        *,
        executor: Executor | None = None,
        recorder: NullRecorder | None = None,
        pad_id: int = 0,
        tokens_per_s: float | None = None,
    ) -> None:
        """``tokens_per_s`` seeds the speed estimate used for admission until calls are measured
        (the runners calibrate it at start; default: Admission's)."""
        self.engine = engine
        self.policy = policy
        self.pad_id = pad_id
        self.recorder = recorder or NullRecorder()
        self._executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        admission = Admission(
            policy.max_queue_tokens, policy.deadline_s, on_shed=self.recorder.shed
        )
        if tokens_per_s is not None:
            admission.tokens_per_s = tokens_per_s
        self.queue = TokenQueue(admission, self.recorder)
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False

    # -- public ---------------------------------------------------------------------------

    @property
    def admission(self) -> Admission:
        return self.queue.admission

    @property
    def tokens_per_s(self) -> float:
        """Measured engine speed (real tokens per second of engine time, moving average)."""
        return self.admission.tokens_per_s

    async def submit(
        self, sequences: Sequence[Sequence[int]], deadline_s: float | None = None
    ) -> tuple[np.ndarray, Timing]:
        """Embed ``sequences``; returns one output row per sequence, in order, and the timing."""
        pending = self.queue.put(sequences, deadline_s)
        self._ensure_running()
        self._wakeup.set()
        # Awaiting the future directly: if the caller is cancelled, so is the future, and the
        # round skips the request instead of computing it for nobody.
        rows = await pending.future
        return rows, pending.timing

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
        self.queue.fail_all("runner is shutting down")

    # -- the loop -------------------------------------------------------------------------

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="batcher")

    async def _loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self.queue:
                await self._run_round(self.queue.take(self.policy.round_tokens))
            if self._closing:
                return

    async def _run_round(self, requests: list[Pending]) -> None:
        if not requests:
            return
        started = clock()
        members = [m for r in requests for m in r.rows_of()]
        lengths = [len(r.sequences[row]) for r, row in members]
        loop = asyncio.get_running_loop()
        p = self.policy
        for group in plan(lengths, p.max_batch_tokens, p.max_batch_rows, p.call_overhead_tokens):
            call = [members[i] for i in group.indices]
            real = sum(lengths[i] for i in group.indices)
            if all(request.future.done() for request, _ in call):
                self.admission.finished(real)
                continue
            batch = [request.sequences[row] for request, row in call]
            call_started = clock()
            try:
                out = await loop.run_in_executor(
                    self._executor, self.engine, pad(batch, self.pad_id)
                )
            except Exception as exc:  # the engine failed: fail this call's requests, keep serving
                fail([request for request, _ in call], exc)
                self.admission.finished(real)
                continue
            done = clock()
            self.admission.finished(real, done - call_started)
            self.recorder.engine_call(len(batch), group.padded_tokens, real, done - call_started)
            # A request answered by this call has run from the round's start until now; one with
            # rows in a later call is overwritten there.
            for request in {id(r): r for r, _ in call}.values():
                request.timing.engine_calls += 1
                request.timing.inference_s = done - started
            deliver(call, out)
