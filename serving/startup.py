"""How long a service's process took to start, in three parts: import (from the process's start to
the service's ``__init__``: the interpreter, BentoML, the service's modules), model load (the
runtime's import with it: the engines import ONNX Runtime or TensorFlow as they load), and warm-up.

Each service logs its parts once, as one line: ``MARK``, then JSON. A runner logs it when its
warm-up (requests through its own batchers, a startup hook) ends, and BentoML answers its /readyz
only after that. The tokenizer logs it when it first reports ready: once a request has been through
each of its embedding runners (its warm-up, which includes waiting for the slowest to answer).
``make cold-start`` (loadtests/cold_start.py) reads these lines from the server's log.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil

MARK = "bundle-startup"

logger = logging.getLogger("bento_bundle.startup")
# BentoML's server logging passes warnings only (its root logger's level); the services' few info
# lines (this one, read at every start, and what a start loaded) are meant to be read, in the
# server's log and the container's.
logging.getLogger("bento_bundle").setLevel(logging.INFO)


def process_started() -> float:
    """When this process started, as a Unix time: the kernel's record of it (so the import part
    includes the interpreter's own start). psutil's create time adds that record, counted from boot,
    to the boot time in whole seconds (/proc/stat), so it is early by the boot time's fraction;
    counted back from the boot clock instead, it is exact to the kernel's tick."""
    boot_clock = getattr(time, "CLOCK_BOOTTIME", None)
    if boot_clock is None:  # not Linux: psutil's own figure
        return float(psutil.Process().create_time())
    since_boot = psutil.Process().create_time() - psutil.boot_time()
    # The boot clock read first: a pause between the two reads makes the start late, never early.
    age = time.clock_gettime(boot_clock) - since_boot
    return time.time() - age


class Startup:
    """The parts of one process's start, timed from its own start (``process_started``)."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.began = process_started()
        self.parts: dict[str, float] = {"import_s": time.time() - self.began}

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Time the block as ``name`` (seconds, added to what the part already has)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            key = f"{name}_s"
            self.parts[key] = self.parts.get(key, 0.0) + time.perf_counter() - started

    def done(self) -> dict[str, Any]:
        """Log the parts (and when the process started and finished starting, as Unix times)."""
        now = time.time()
        record = {
            "service": self.service,
            **{key: round(value, 3) for key, value in self.parts.items()},
            "total_s": round(now - self.began, 3),
            "started_at": round(self.began, 3),
            "ready_at": round(now, 3),
        }
        logger.info("%s %s", MARK, json.dumps(record))
        return record


def parse(lines: str) -> list[dict[str, Any]]:
    """Every startup record in a log's text, in order."""
    records = []
    decoder = json.JSONDecoder()
    for line in lines.splitlines():
        _, found, rest = line.partition(MARK + " ")
        if found:
            try:  # BentoML's log format may follow the record with the request's trace
                records.append(decoder.raw_decode(rest.strip())[0])
            except json.JSONDecodeError:  # a line cut by another process's output
                continue
    return records
