"""Real servers: `bentoml serve` on a free 127.0.0.1 port, awaited by readiness, stopped by PID."""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loadtests.processes import ROOT, bentoml_serve

LOGS = ROOT / "build" / "test-logs"
# The fuzzing tests' seed: fresh each run, shown in the report header; FUZZ_SEED=N replays a run.
FUZZ_SEED = int(os.environ.get("FUZZ_SEED") or random.SystemRandom().randrange(2**32))


def pytest_report_header() -> str:
    return f"fuzz seed: {FUZZ_SEED} (FUZZ_SEED={FUZZ_SEED} replays it)"


@pytest.fixture(scope="session")
def tenant_store() -> Path:
    path = ROOT / "build" / "test-tenants"
    shutil.rmtree(path, ignore_errors=True)
    return path


@pytest.fixture(scope="session")
def graph(tenant_store: Path) -> Iterator[str]:
    """The whole graph (tokenizer + ONNX, TF and tenant runners) as `make serve` runs it."""
    server = bentoml_serve(".", LOGS / "graph.log", env={"BUNDLE_TENANTS_STORE": str(tenant_store)})
    with server:
        yield server.url


@pytest.fixture(scope="session")
def client(graph: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=graph, timeout=60) as c:
        yield c


def log_path(name: str) -> Path:
    return LOGS / name
