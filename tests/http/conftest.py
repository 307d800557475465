"""The services' ASGI apps in this process, with real engines and BentoML's own app around them,
driven over HTTP by Starlette's TestClient (which runs their lifespan: the service instance and its
engines are made as a worker makes them). No server, no socket, and no Prometheus multiprocess
directory (`bentoml serve` makes one): /metrics is the e2e tests' to check."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient


@pytest.fixture(scope="session")
def onnx_runner() -> Iterator[TestClient]:
    """The ONNX runner as `bentoml serve runners.onnx.service:OnnxRunner` serves it."""
    from runners.onnx.service import OnnxRunner

    with TestClient(OnnxRunner.to_asgi(is_main=True)) as client:
        yield client
