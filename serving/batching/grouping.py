"""Length-aware grouping: split a set of sequences into engine calls under a padded-token budget.

Pure functions, no I/O. An engine call costs a fixed amount plus an amount per padded token
(``CALL_OVERHEAD_TOKENS`` weighs the two), and throughput falls for calls much over ~1024 padded
tokens. So the sequences are sorted by length and cut into
contiguous groups that minimise  sum(call_overhead + rows x width)  with rows x width <=
max_tokens: few calls, little padding. A single sequence longer than the budget still gets a group
of its own (it is served).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# One call's weight in padded tokens, against the padding a larger call carries: plan()'s default,
# and the ONNX runner's (the TF and tenant runners keep 32, runners/settings.py). It was 32, from an
# early 2-core host's engine on 2 threads (1.7 ms a call x 19k tokens/s). 16 since 2026-11-28,
# measured on that day's Intel host with the ONNX runner's default one-thread lanes:
# - offline: at 64 chat users the tokenizer brought the runner 21-31 sentences a call, median ~23
#   (make ab prints "rows a runner call"; ~30 since its OVERLAP_SHARE of 0.1), and rounds of 29
#   (BUNDLE_ONNX_CALL_OVERHEAD_TOKENS=<w> python -m loadtests.round_size --rounds 29, medians of
#   3) served fp32 449, 450 and 426-433 (two runs) and int8 1148, 1137 and 1089 sentences/s at
#   weights 8, 16 and 32, in calls of 3.4, 4.4 and 5.7 rows (its table);
# - the weight alone in the whole graph against 32 (python -m loadtests.ab fa1ef03 --users 64
#   --workloads chat,bulk --rounds 3, the weight edited in the checkout): 8 served 1.029x at chat
#   and 1.053x at bulk, 16 1.016x and 1.065x (a run when the host was faster: its base served 407
#   chat sentences/s against 355);
# - the engine alone: a one-thread lane's CPU a call fitted a fixed part of 9-21 padded tokens for
#   fp32 and 8-10 for int8 (round_size --call-cost, three runs each: the fixed part is noisy);
# - 16 rather than 8: about the same throughput in fewer calls, and each call also costs the
#   runner's event loop and lanes CPU around the engine, which the fit leaves out.
# With the batcher's change to _next_call of the same commit, against 32 (the same ab, with
# --users 1,64 then 64): chat 1.016x and 1.032x the sentences/s at 64 users, every round ahead;
# bulk 1.020x and 1.000x. The runner's CPU outside the engine a request: chat 1.028x and 0.967x,
# bulk 1.069x and 1.136x (likely the calls: 15 rows each at bulk against 20; at chat, 4.9 against
# 6.2, it rose once and fell once).
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
    ones waiting (serving/batching/batcher.py), and they are few (~17 in a chat round at 64
    users, ~340 in a bulk round, before the batcher held rows across rounds), where NumPy's cost per
    call on small arrays dominated: 17 sequences 88 -> 17 us, 64 317 -> 112 us, 340 1.6 -> 0.9 ms
    (timeit, corpus lengths). Under chat load it had been ~13 % of the ONNX runner's main thread's
    busy samples (py-spy --native, one run). The plans are the same: at equal cost the longer
    group ending at a sequence wins (fewer calls), as ``np.argmin``'s first minimum did."""
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
