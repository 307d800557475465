"""The runner side of the queue: rows planned into engine calls, run on the instance's lanes.

Whenever a lane can take work, the loop takes a *round* from the token queue (queue.py; only while
the rows held fall below half of ``round_tokens``), plans it together with the rows still held from
earlier rounds (``grouping.plan``: sorted by length, padded-token budget, dynamic padding) and
hands the lane one call: the one that holds the oldest row. The other rows are held for the next
free lane, where the requests that arrived meanwhile join them, and the oldest always goes next.
Each request is answered as soon as its last row is done. While the lanes work, new requests
queue up, so batches grow with load and a lone request is never made to wait for company. An
engine call whose requests have all gone is skipped before it costs engine time.

Lanes (``Lanes``): the engine threads of a runner instance, shared by its batchers (one per model).
With one lane, calls run one after another on one engine that uses every core of the instance.
With several, that many calls run at once, each on a single-threaded engine: a single-threaded
call never waits at a barrier for a thread that another process has taken the core from, and on
these machines the raw engine itself is faster that way (make bench's raw figures time both
layouts, loadtests/README.md). A call that is alone (nothing else held, running or queued) runs
on the batcher's ``solo`` engine instead, which uses every lane's core: a lone request is as fast
as with one wide lane.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from operator import itemgetter
from typing import Any

import numpy as np

from serving.batching.admission import Admission
from serving.batching.grouping import plan
from serving.batching.metrics import NullRecorder
from serving.batching.queue import Pending, Timing, TokenQueue, clock, deliver, fail
from serving.errors import DeadlineExceeded
from serving.features import Feeds, pad

Engine = Callable[[Feeds], np.ndarray]


@dataclass(frozen=True)
class Policy:
    """How a runner batches; built from its settings (runners/settings.py holds the defaults)."""

    max_batch_tokens: int  # padded tokens per engine call
    max_batch_rows: int  # sequences per engine call
    round_tokens: int  # real tokens planned together (rows held and a new round)
    max_queue_tokens: int  # beyond this, 429
    deadline_s: float  # default per-request deadline, queue + engine; beyond it, 503
    call_overhead_tokens: int  # an engine call's weight against padding, in padded tokens

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


_NOTHING = object()  # no call was in line


class Lanes:
    """The engine threads of a runner instance, shared by its batchers: ``count`` calls run at
    once, and one more waits in line so that a lane never idles between two calls. A solo call
    holds every slot: nothing runs beside it on the cores it uses.

    Shared by several batchers (one per model, or per tenant), the lanes serve the smallest work
    first: a free slot goes to the waiting batcher with the fewest tokens to do, and a free lane
    takes the smallest call in line. A model whose queue is full of bulk work then delays a model
    with one sentence to embed by the calls already running, not by its whole queue; among equals
    the order is first come, first served.

    The threads are the lanes' own, not a ``ThreadPoolExecutor``'s: a call is a plain function
    handed over on a ``SimpleQueue``, and its result comes back as one ``call_soon_threadsafe``
    callback, where ``loop.run_in_executor`` and a task per call cost the event loop's thread a
    concurrent future and its lock, an asyncio future chained to it and the task's wake-up: CPU
    that the runner spends beside the engine on every call.

    The threads run at the process's own priority. Lanes nicer than the event loops were measured
    and left out: chat under load gained, but bulk under overload lost throughput and shed more.
    Likely, under overload, the tokenizer's work on requests it then refuses took the cores from
    the engine (docs/decisions/0004-engine-lanes.md has the figures)."""

    def __init__(self, count: int = 1, name: str = "engine") -> None:
        if count < 1:
            raise ValueError(f"lanes must be positive, got {count}")
        self.count = count
        self.slots = count + 1
        self.name = name
        self.held = 0  # slots held by calls handed over and not finished (running or in line)
        self._free = self.slots
        # Batchers waiting for a slot: (their tokens to do, arrival, the future that wakes them).
        self._waiting: list[tuple[float, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()
        # Calls in line: (size, arrival, (the call, what to do with its result, the loop to do it
        # on)); an item of None stops a thread, after the work queued before it.
        self._work: queue.PriorityQueue[tuple[float, int, Any]] = queue.PriorityQueue()
        self._threads: list[threading.Thread] = []

    async def place(self, slots: int = 1, tokens: float = 0) -> None:
        """Wait until ``slots`` more are free, and hold them (none, if cancelled meanwhile).
        ``tokens``: the work the caller has to do; the fewest are served first."""
        taken = 0
        try:
            for _ in range(slots):
                await self._acquire(tokens)
                self.held += 1
                taken += 1
        except asyncio.CancelledError:
            self.done(taken)
            raise

    async def _acquire(self, tokens: float) -> None:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (tokens, next(self._arrivals), woken))
        try:
            await woken
        except asyncio.CancelledError:
            if woken.done() and not woken.cancelled():  # given the slot, then cancelled
                self._release()
            raise  # a cancelled waiter is left in the heap, done: _release skips it

    def _release(self) -> None:
        while self._waiting:
            woken = heapq.heappop(self._waiting)[2]
            if not woken.done():
                woken.set_result(None)
                return
        self._free += 1

    def done(self, slots: int = 1) -> None:
        self.held -= slots
        for _ in range(slots):
            self._release()

    def run(
        self,
        work: Callable[[], Any],
        then: Callable[[Any, BaseException | None], None],
        size: float = 0,
    ) -> None:
        """Run ``work()`` on a lane's thread, then ``then(result, error)`` on the calling event
        loop (``error`` is what ``work`` raised, or None); ``size``: the call's padded tokens, the
        smallest in line running first. Raises if a lane's thread cannot start (then the work is
        not queued). Threads start with the first call, daemons: a call still running at
        interpreter exit is not waited for."""
        while len(self._threads) < self.count:  # one that failed to start is tried again
            thread = threading.Thread(
                target=self._serve, name=f"{self.name}_{len(self._threads)}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        self._work.put((size, next(self._arrivals), (work, then, asyncio.get_running_loop())))

    def close(self) -> None:
        """Stop the threads once the work queued before is done (for lanes no longer used)."""
        for _ in self._threads:
            self._work.put((math.inf, next(self._arrivals), None))
        for thread in self._threads:
            thread.join()
        self._threads.clear()

    def _serve(self) -> None:
        item = self._work.get()[2]
        while item is not None:
            work, then, loop = item
            try:
                result, error = work(), None
            except BaseException as exc:  # handed to the loop, which answers the call's requests
                result, error = None, exc
            # The call in line is taken before this call's slot is freed (by ``then``): a call
            # placed in the freed slot cannot overtake it: the call that waited in line runs
            # next, whatever the threads' timing.
            try:
                following = self._work.get_nowait()[2]
            except queue.Empty:
                following = _NOTHING
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody left to answer
                loop.call_soon_threadsafe(then, result, error)
            # Not kept while waiting for the next call: the last call's batcher, engine, requests
            # and rows (an evicted tenant's session among them) would live on until then.
            del item, work, then, loop, result, error
            item = self._work.get()[2] if following is _NOTHING else following


@dataclass(frozen=True)
class _Call:
    members: list[tuple[Pending, int]]  # (request, row) of each sequence, in the call's order
    padded: int  # rows x the longest row's tokens
    real: int  # real (unpadded) tokens


class Batcher:
    def __init__(
        self,
        engine: Engine,
        policy: Policy,
        *,
        lanes: Lanes | None = None,
        solo: Engine | None = None,
        recorder: NullRecorder | None = None,
        pad_id: int = 0,
        token_types: bool = True,
        tokens_per_s: float | None = None,
    ) -> None:
        """``lanes``: shared with the instance's other batchers (default: one of its own).
        ``solo``: the engine for a call that runs alone, using every lane's core (default:
        ``engine``). ``pad_id``, ``token_types``: how the model's inputs are padded (its spec).
        ``tokens_per_s`` seeds the speed estimate used for admission until calls are measured
        (the runners calibrate it at start; default: Admission's)."""
        self.engine = engine
        self.solo = solo or engine
        self.policy = policy
        self.pad_id = pad_id
        self.token_types = token_types
        self.recorder = recorder or NullRecorder()
        self._own_lanes = lanes is None  # closed with this batcher; shared ones are not
        self.lanes = lanes or Lanes()
        admission = Admission(
            policy.max_queue_tokens, policy.deadline_s, on_shed=self.recorder.shed
        )
        if tokens_per_s is not None:
            admission.tokens_per_s = tokens_per_s
        self.queue = TokenQueue(admission, self.recorder)
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._running = 0  # calls handed to the lanes and not yet answered
        # Rows taken from the queue and not yet in a call (counted as started by admission), the
        # oldest first, and their tokens.
        self._held: list[tuple[Pending, int]] = []
        self._held_tokens = 0
        self._rest: list[list[tuple[Pending, int]]] = []  # the last plan's other calls, held
        self._answered = asyncio.Event()  # set whenever a call is answered
        self._closing = False
        self._loop_clock: int | None = None  # the event loop thread's CPU clock

    # -- public ---------------------------------------------------------------------------

    @property
    def admission(self) -> Admission:
        return self.queue.admission

    @property
    def tokens_per_s(self) -> float:
        """Measured engine speed (real tokens per second of engine time, moving average)."""
        return self.admission.tokens_per_s

    async def submit(
        self,
        sequences: Sequence[Sequence[int]],
        deadline_s: float | None = None,
        segments: Sequence[int] | None = None,
    ) -> tuple[np.ndarray, Timing]:
        """Run ``sequences`` (``segments``: where each pair's second text starts); returns one
        output row per sequence, in order, and the timing."""
        pending = self.queue.put(sequences, deadline_s, segments)
        self._ensure_running()
        self._wakeup.set()
        # Awaiting the future directly: if the caller is cancelled, so is the future, and the
        # call skips the request instead of computing it for nobody.
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
        while self._running:  # calls placed: answered
            self._answered.clear()
            await self._answered.wait()
        self._fail_held("runner is shutting down")
        self.queue.fail_all("runner is shutting down")
        self.recorder.flush()  # what the last calls observed, not left to a timer
        if self._own_lanes:
            self.lanes.close()

    # -- the loop -------------------------------------------------------------------------

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            # The thread of the loop that runs the batcher: a solo call's engine CPU excludes it.
            if hasattr(time, "pthread_getcpuclockid"):  # not on every Unix
                self._loop_clock = time.pthread_getcpuclockid(threading.get_ident())
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="batcher")

    async def _loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self.queue or self._held:
                # A call is chosen only once a lane slot is held: until then, requests arriving
                # join the rows it is chosen from.
                await self.lanes.place(tokens=self.admission.waiting + self._held_tokens)
                call = self._next_call()
                if call is None:
                    self.lanes.done()
                    continue
                await self._place(call)
            if self._closing:
                return

    def _next_call(self) -> _Call | None:
        """The next engine call: the rows held back from earlier rounds and a round newly taken
        from the queue, planned together; the call that holds the oldest row goes, the others'
        rows are held for the next free lane. So a call is cut from the rows held and the new
        round together, not only from those that arrived while the last round's calls were
        placed: the engine serves more from larger planned rounds. The calls are no larger for
        it: a runner call from the tokenizer brings several times the rows of an engine call,
        and the planner cuts them as ``grouping.CALL_OVERHEAD_TOKENS`` weighs a call
        (docs/decisions/0002-batcher-planning.md, 0001-call-weight.md). None when every row has
        gone.

        The plan runs on the event loop's thread, taking its CPU from every request, so it is kept
        when nothing was added or dropped since (the rest of the last plan is still a plan of the
        rows held), and the queue tops up the rows held only once they fall below half of
        ``round_tokens``: with a deep queue, rows are planned about once for each half round
        taken, not once for each call (the first version, which took from the queue and planned
        again at every call, cost the main thread far more CPU a bulk request). The rows planned
        together can exceed ``round_tokens`` by at most a request: ``take`` hands over a request
        larger than the room left when it is the first."""
        p = self.policy
        taken = []
        if 2 * self._held_tokens < p.round_tokens:
            taken = self.queue.take(p.round_tokens - self._held_tokens)
        rows = self._held + [m for r in taken for m in r.rows_of()]
        tokens = self._held_tokens + sum(r.tokens for r in taken)
        # Each request is looked at once, not once a row: its rows share its future and deadline,
        # and one call from the tokenizer holds a few dozen chat sentences.
        now = clock()
        gone = False
        for request in dict.fromkeys(map(itemgetter(0), rows)):
            if request.future.done():
                gone = True
            elif now > request.deadline:
                gone = True
                self.recorder.shed("deadline")
                request.future.set_exception(DeadlineExceeded(1, "deadline passed while queued"))
        live = rows
        if gone:  # started when taken, never run: no longer the instance's work
            live = [(r, row) for r, row in rows if not r.future.done()]
            left = sum(len(r.sequences[row]) for r, row in live)
            self.admission.finished(tokens - left)
            tokens = left
        if not live:
            self._held, self._held_tokens, self._rest = [], 0, []
            return None
        if taken or gone or not self._rest:
            lengths = [len(r.sequences[row]) for r, row in live]
            groups = plan(lengths, p.max_batch_tokens, p.max_batch_rows, p.call_overhead_tokens)
            cuts = [[live[k] for k in g.indices] for g in groups]  # each sorted by length
        else:
            cuts = self._rest
        first = next(cut for cut in cuts if live[0] in cut)  # live[0] is the oldest row
        chosen = set(first)
        self._rest = [cut for cut in cuts if cut is not first]
        self._held = [m for m in live if m not in chosen]
        widths = [len(r.sequences[row]) for r, row in first]
        real = sum(widths)
        self._held_tokens = tokens - real
        return _Call(first, len(first) * max(widths), real)

    async def _place(self, call: _Call) -> None:
        """Hand ``call`` to a lane (its first slot already held), or to the solo engine."""
        held = 1
        if self._alone():  # the solo engine: every core, nothing beside
            try:
                await self.lanes.place(self.lanes.slots - 1)
            except asyncio.CancelledError:  # closing: its rows are held, close() answers them
                self.lanes.done()
                self._held[:0] = call.members
                self._held_tokens += call.real
                self._rest.append(call.members)
                raise
            held = self.lanes.slots
        engine = self.solo if held > 1 else self.engine
        self._running += 1
        try:
            self.lanes.run(
                partial(self._compute, call, engine), partial(self._answer, call, held), call.padded
            )
        except Exception as exc:  # no lane thread could start: answered, slots freed
            self._answer(call, held, None, exc)

    def _alone(self) -> bool:
        """Nothing else placed, held or waiting, and a solo engine to run the call on."""
        return (
            not self._held
            and self.lanes.held == 1
            and not self.queue
            and self.solo is not self.engine
        )

    def _fail_held(self, reason: str) -> None:
        """Refuse the rows held back and not placed (closing): their requests are answered."""
        if self._held_tokens:
            self.admission.finished(self._held_tokens)
        fail(list(dict.fromkeys(map(itemgetter(0), self._held))), DeadlineExceeded(1, reason))
        self._held, self._held_tokens, self._rest = [], 0, []

    def _answer(
        self,
        call: _Call,
        held: int,
        result: tuple[np.ndarray | None, float, float, float] | None,
        error: BaseException | None,
    ) -> None:
        """On the event loop, once the call's lane has run it: answer its requests."""
        self._running -= 1
        self._answered.set()
        self.lanes.done(held)
        self.admission.finished(call.real)
        requests = list(dict.fromkeys(map(itemgetter(0), call.members)))  # each once, in order
        if error is not None:  # the engine failed: fail this call's requests, keep serving
            fail(requests, error)
            return
        assert result is not None  # the lane returns _compute's tuple whenever it raised nothing
        out, began, ended, engine_cpu = result
        try:
            if out is None:  # every request of the call had gone, or its deadline passed in line
                late = [r for r in requests if not r.future.done()]
                for _ in late:
                    self.recorder.shed("deadline")
                fail(late, DeadlineExceeded(1, "deadline passed while queued"))
                return
            self.admission.overlapped(call.real, began, ended)
            self.recorder.engine_call(
                len(call.members), call.padded, call.real, ended - began, engine_cpu
            )
            done = clock()
            # A request answered by this call has run from its round's start until now; one with
            # rows in a later call is overwritten there.
            for request in requests:
                request.timing.engine_calls += 1
                request.timing.inference_s = done - request.taken
            deliver(call.members, out)
        except Exception as exc:  # a wrong answer from the engine (row count): fail, not hang
            fail(requests, exc)

    def _compute(
        self, call: _Call, engine: Engine
    ) -> tuple[np.ndarray | None, float, float, float]:
        """On a lane's thread: pad and run, unless every request of the call has gone or run out
        of time meanwhile (a call may wait in line behind the running ones). Returns the rows,
        when the call began and ended (``clock``), and the CPU seconds inside the engine: this
        thread's, all of the engine's CPU where the engine runs on the calling thread (the ONNX
        runner's one-thread sessions on its lanes); for a solo call, which holds every lane, the
        CPU of every thread but the event loop's (its session's threads too). Otherwise an
        engine's own threads are not in it (TensorFlow's, a one-lane ONNX session's): only the
        calling thread's share. What the lane spends around the engine (these checks, padding,
        the hand-off) is not in it: the benchmark counts it as the runner's own CPU, beside the
        event loop's."""
        began = clock()
        if all(r.future.done() or began > r.deadline for r, _ in call.members):
            return None, began, began, 0.0
        rows = [request.sequences[row] for request, row in call.members]
        segments = None
        if self.token_types and any(r.segments is not None for r, _ in call.members):
            segments = [request.segment(row) for request, row in call.members]
        feeds = pad(rows, self.pad_id, self.token_types, segments)
        cpu = time.thread_time()
        # A solo call holds every lane: no other engine call of the instance runs beside it, so
        # the CPU of every thread but the event loop's is the engine's, its session's own
        # threads included (on the calling thread alone they would count as the runner's: at
        # one client, most of what it spends). Also in it: whatever else the process's other
        # threads do meanwhile (the last call's lane handing its answer back: microseconds).
        solo = engine is self.solo and engine is not self.engine
        outside = self._outside_loop() if solo else None
        out = engine(feeds)
        cpu = time.thread_time() - cpu
        if outside is not None and (now := self._outside_loop()) is not None:
            # The process's clock may lag the threads running on other cores by up to a
            # scheduler tick, the loop thread's does not: a call shorter than that can read
            # below zero (a counter takes no negative increment).
            cpu = max(now - outside, 0.0)
        return out, began, clock(), cpu

    def _outside_loop(self) -> float | None:
        """The process's CPU seconds so far less its event loop thread's; None when that thread
        is unknown or gone (a test's loop that has ended)."""
        if self._loop_clock is None:
            return None
        try:
            loop = time.clock_gettime(self._loop_clock)
        except OSError:
            return None
        return time.process_time() - loop
