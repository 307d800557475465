"""Length-aware grouping: split a set of sequences into engine calls under a padded-token budget.

Pure functions, no I/O. An engine call costs a fixed amount plus an amount per padded token
(``CALL_OVERHEAD_TOKENS`` weighs the two), and past a size a larger call gains no throughput and
delays every request behind it (docs/decisions/0014-engine-call-size.md). So the sequences are
sorted by length and cut into contiguous groups that minimise  sum(call_overhead + rows x width)
with rows x width <= max_tokens: few calls, little padding. A single sequence longer than the
budget still gets a group of its own (it is served).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# One call's weight in padded tokens, against the padding a larger call carries: plan()'s default,
# and the ONNX runner's (the TF and tenant runners keep 32, runners/settings.py, which suits an
# engine on several threads). On the ONNX runner's one-thread lanes a lighter call served at least
# as much as 32, offline and in the whole graph, and the engine's own fixed cost a call is small.
# 16 rather than 8: about the same throughput in fewer calls, and each call also costs the runner's
# event loop and lanes CPU around the engine, which a fit of the engine's cost leaves out
# (docs/decisions/0001-call-weight.md has the figures and how to measure them again).
CALL_OVERHEAD_TOKENS = 16


@dataclass(frozen=True)
class Group:
    """One engine call: indices into the planned sequences, and its padded shape."""

    indices: tuple[int, ...]
    width: int  # longest sequence: every row is padded to it

    @property
    def padded_tokens(self) -> int:
        return len(self.indices) * self.width


def plan(
    lengths: Sequence[int], max_tokens: int, max_rows: int, overhead: int = CALL_OVERHEAD_TOKENS
) -> list[Group]:
    """Cheapest split of the sorted sequences into engine calls (dynamic programme, O(n x max_rows)).

    Plain Python, not NumPy: it runs on the runner's event loop whenever rows join or leave the
    ones waiting (serving/batching/batcher.py), and they are few, where NumPy's cost per call on
    small arrays dominated; under chat load planning had been a visible share of the ONNX runner's
    main thread (docs/decisions/0002-batcher-planning.md). The plans are the same: at equal cost
    the longer group ending at a sequence wins (fewer calls), as ``np.argmin``'s first minimum
    did."""
    if max_tokens < 1 or max_rows < 1:
        raise ValueError("max_tokens and max_rows must be positive")
    order = sorted(range(len(lengths)), key=lengths.__getitem__)  # stable: ties keep arrival order
    widths = [int(lengths[k]) for k in order]
    n = len(widths)
    best = [0] * (n + 1)  # best[i]: cheapest cover of the i shortest
    cut = [0] * (n + 1)
    for i in range(1, n + 1):
        width = widths[i - 1]  # the longest of any group ending at i
        low = i - max(1, min(max_rows, i, max_tokens // width))
        # group = sorted[start:i]; at equal cost the earliest start (the longer group) wins
        start, cost = low, best[low] + (i - low) * width
        for s in range(low + 1, i):
            c = best[s] + (i - s) * width
            if c < cost:
                start, cost = s, c
        best[i], cut[i] = cost + overhead, start
    groups: list[Group] = []
    end = n
    while end > 0:
        start = cut[end]
        groups.append(Group(tuple(order[start:end]), widths[end - 1]))
        end = start
    groups.reverse()
    return groups


def efficiency(lengths: Sequence[int], groups: Sequence[Group]) -> float:
    """Real tokens / padded tokens over a plan (1.0 means no padding at all)."""
    padded = sum(g.padded_tokens for g in groups)
    return sum(lengths) / padded if padded else 1.0
