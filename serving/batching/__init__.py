"""Batching by token budget: admission (admission.py) → the token queue (queue.py) → engine calls
planned by length (grouping.py, batcher.py), observed by metrics.py."""

from serving.batching.admission import Admission
from serving.batching.batcher import Batcher, Engine, Lanes, Policy
from serving.batching.grouping import Group, efficiency, plan
from serving.batching.queue import Pending, Timing, TokenQueue, deliver, fail

__all__ = [
    "Admission",
    "Batcher",
    "Engine",
    "Group",
    "Lanes",
    "Pending",
    "Policy",
    "Timing",
    "TokenQueue",
    "deliver",
    "efficiency",
    "fail",
    "plan",
]
