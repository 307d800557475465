"""The one batching core shared by every runner (see core.py for how a request flows)."""

from runners.batching.core import Batcher, Policy, Timing
from runners.batching.errors import DeadlineExceeded, Overloaded, QueueFull
from runners.batching.grouping import Group, efficiency, plan

__all__ = [
    "Batcher",
    "DeadlineExceeded",
    "Group",
    "Overloaded",
    "Policy",
    "QueueFull",
    "Timing",
    "efficiency",
    "plan",
    "replies_on_overload",
]
