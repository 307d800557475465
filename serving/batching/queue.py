"""The token-budget queue: the one queue of every stage that batches (the tokenizer's coalescer,
each runner's batcher).

A request is a list of token-id sequences. ``put`` admits it or refuses it at once (admission.py:
429 when the queue is full, 503 when it cannot finish in time) and returns its ``Pending`` entry;
``take`` hands the consumer a *round* from the head, at most ``max_tokens`` real tokens (a larger
lone request still goes), dropping entries whose caller has gone and failing those whose deadline
passed; ``deliver`` scatters result rows back to their requests and answers each one, rows in
request order, once its last row has arrived. One clock throughout: ``time.monotonic``.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from serving.batching.admission import Admission
from serving.batching.metrics import NullRecorder
from serving.errors import DeadlineExceeded

clock = time.monotonic


@dataclass
class Timing:
    queue_s: float = 0.0  # admitted -> taken in a round (plus any queue downstream)
    inference_s: float = 0.0  # round started -> its last row computed
    engine_calls: int = 0  # engine calls that held at least one of its rows


@dataclass(eq=False)
class Pending:
    """One admitted request: its sequences, its deadline, and the future its caller awaits."""

    sequences: Sequence[Sequence[int]]
    tokens: int
    deadline: float
    enqueued: float
    future: asyncio.Future
    timing: Timing = field(default_factory=Timing)
    rows: np.ndarray | None = None
    remaining: int = 0
    taken: float = 0.0  # when a round took it from the queue (``clock``)
    # Where each sequence's second text starts (a pair's), or None: single texts.
    segments: Sequence[int] | None = None

    def segment(self, row: int) -> int:
        """Where ``row``'s second text starts (its length: it has none)."""
        return len(self.sequences[row]) if self.segments is None else self.segments[row]

    def rows_of(self) -> Iterable[tuple[Pending, int]]:
        """(this request, row index) for each of its sequences: how a round lists its rows."""
        return ((self, row) for row in range(len(self.sequences)))


class TokenQueue:
    def __init__(self, admission: Admission, recorder: NullRecorder | None = None) -> None:
        self.admission = admission
        self.recorder = recorder or NullRecorder()
        self._items: collections.deque[Pending] = collections.deque()

    def __bool__(self) -> bool:
        return bool(self._items)

    def put(
        self,
        sequences: Sequence[Sequence[int]],
        deadline_s: float | None = None,
        segments: Sequence[int] | None = None,
    ) -> Pending:
        """Admit a request (or raise QueueFull / DeadlineExceeded); the caller awaits ``.future``.

        ``deadline_s``: the request's own budget (what is left of an upstream deadline); default:
        the queue's. ``segments``: where each sequence's second text starts (pairs)."""
        if not sequences or any(len(s) == 0 for s in sequences):
            raise ValueError("sequences must be a non-empty list of non-empty sequences")
        if segments is not None and (
            len(segments) != len(sequences)
            or any(not 0 <= at <= len(s) for at, s in zip(segments, sequences, strict=True))
        ):
            raise ValueError("segments must give one start within each sequence")
        tokens = sum(len(s) for s in sequences)
        budget = self.admission.admit(tokens, deadline_s)
        now = clock()
        pending = Pending(
            sequences=sequences,
            tokens=tokens,
            deadline=now + budget,
            enqueued=now,
            future=asyncio.get_running_loop().create_future(),
            remaining=len(sequences),
            segments=segments,
        )
        self._items.append(pending)
        self.recorder.queue_depth(self.admission.waiting)
        return pending

    def take(self, max_tokens: int, max_rows: int | None = None) -> list[Pending]:
        """The next round, FIFO, under ``max_tokens`` real tokens and ``max_rows`` sequences (a
        larger lone request still goes); each taken entry counts as started."""
        now = clock()
        taken: list[Pending] = []
        tokens = rows = 0
        while self._items and (
            not taken
            or (
                tokens + self._items[0].tokens <= max_tokens
                and (max_rows is None or rows + len(self._items[0].sequences) <= max_rows)
            )
        ):
            pending = self._items.popleft()
            if pending.future.done():  # its caller has gone (cancelled): no work for nobody
                self.admission.cancelled(pending.tokens)
                continue
            if now > pending.deadline:
                pending.future.set_exception(self.admission.expired(pending.tokens))
                continue
            self.admission.started(pending.tokens)
            pending.taken = now
            pending.timing.queue_s = now - pending.enqueued
            self.recorder.queued(pending.timing.queue_s)
            taken.append(pending)
            tokens += pending.tokens
            rows += len(pending.sequences)
        self.recorder.queue_depth(self.admission.waiting)
        return taken

    def fail_all(self, reason: str) -> None:
        """Refuse everything still waiting (shutting down)."""
        while self._items:
            pending = self._items.popleft()
            self.admission.cancelled(pending.tokens)
            if not pending.future.done():
                pending.future.set_exception(DeadlineExceeded(1, reason))
        self.recorder.queue_depth(self.admission.waiting)


def fail(requests: Sequence[Pending], exc: BaseException) -> None:
    """A call that held these requests failed (shed downstream, unavailable, an engine error): each
    request still waiting gets the error."""
    for pending in requests:
        if not pending.future.done():
            pending.future.set_exception(exc)


def deliver(members: Sequence[tuple[Pending, int]], rows: np.ndarray) -> None:
    """Scatter result rows to their requests (``members[i]`` owns ``rows[i]``); answer each request
    whose last row this was. Requests whose caller has gone are skipped."""
    for (pending, row), vector in zip(members, rows, strict=True):
        if pending.future.done():
            continue
        if pending.rows is None:
            pending.rows = np.empty((len(pending.sequences), *vector.shape), dtype=vector.dtype)
        pending.rows[row] = vector
        pending.remaining -= 1
        if pending.remaining == 0:
            pending.future.set_result(pending.rows)
