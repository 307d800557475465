"""Bounded benchmark-like runs, and the fuzzing of the public API (a hunt with a fresh seed each
run, not a fixed check)."""

from __future__ import annotations

import os
import random

# The fuzzing tests' seed: fresh each run, shown in the report header; FUZZ_SEED=N replays a run.
FUZZ_SEED = int(os.environ.get("FUZZ_SEED") or random.SystemRandom().randrange(2**32))


def pytest_report_header() -> str:
    return f"fuzz seed: {FUZZ_SEED} (FUZZ_SEED={FUZZ_SEED} replays it)"
