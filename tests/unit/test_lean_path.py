"""Each lean-path choice of the serving path, pinned. What tracing and the access log cost a
request is measured by `make bench` (loadtests/README.md); the other choices are pinned here for
what they do."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest
from opentelemetry.util.http import ExcludeList

from testkit.processes import ROOT

SERVICES = {
    "services.tokenizer.service:Tokenizer": (
        "BUNDLE_TOKENIZER_",
        ["/embed", "/similarity", "/tokenize", "/inference", "/classify", "/v1/embeddings"],
    ),
    "runners.onnx.service:OnnxRunner": (
        "BUNDLE_ONNX_",
        [
            "/embed",
            "/v1/models/all-MiniLM-L6-v2:predict",
            "/v1/models/all-MiniLM-L6-v2/versions/1:predict",
            "/v1/models/all-MiniLM-L6-v2-int8/labels/stable:predict",
        ],
    ),
    "runners.tf.service:TFRunner": (
        "BUNDLE_TF_",
        ["/embed", "/v1/models/all-MiniLM-L6-v2:predict"],
    ),
    "runners.tenants.service:TenantRunner": ("BUNDLE_TENANTS_", ["/classify"]),
}


def service_config(target: str, env: dict[str, str]) -> dict:
    """A service's BentoML config as `bentoml serve` would build it (fresh process: settings are
    read at import)."""
    return built(target, tuple(sorted(env.items())))["config"]


@functools.cache
def built(target: str, env: tuple[tuple[str, str], ...]) -> dict:
    """A service imported in a fresh process with ``env`` (settings are read at import): its
    BentoML config, and the paths its worker app answers on the lean path as built at its first
    request (its middlewares built and BentoML's metrics set up, as its lifespan would). One
    process per service and settings, shared by the tests that read either."""
    module, name = target.split(":")
    code = f"""
import json
from bentoml._internal.server.http.instruments import RunnerTrafficMetricsMiddleware
from {module} import {name} as service
config = json.dumps(service.config, default=str)
app = service.to_asgi(is_main=True)
layer = app.app.middleware_stack = app.app.build_middleware_stack()
while layer is not None:
    if isinstance(layer, RunnerTrafficMetricsMiddleware):
        layer._setup()
    layer = getattr(layer, "app", None)
print(json.dumps({{"config": json.loads(config), "kind": type(app).__name__,
                  "routes": sorted(app.routes())}}))
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **dict(env)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def excluded(config: dict, path: str) -> bool:
    patterns = config.get("tracing", {}).get("excluded_urls")
    return bool(patterns) and ExcludeList(patterns).url_disabled(f"http://127.0.0.1:3000{path}")


@pytest.mark.parametrize("target", SERVICES)
def test_hot_routes_are_not_traced_by_default(target: str) -> None:
    _, hot = SERVICES[target]
    config = service_config(target, {})
    for path in hot:
        assert excluded(config, path), (target, path)
    for path in ("/metrics", "/readyz", "/docs.json", f"{hot[0]}_other"):
        assert not excluded(config, path), (target, path)


@pytest.mark.parametrize("target", SERVICES)
def test_the_setting_turns_tracing_back_on(target: str) -> None:
    prefix, hot = SERVICES[target]
    config = service_config(target, {f"{prefix}TRACE_REQUESTS": "true"})
    assert not any(excluded(config, path) for path in hot), config.get("tracing")


# The routes each service answers on the lean path: its untraced APIs and fixed POST routes.
# TF Serving's predict route (/v1/models/{name}...:predict) has path parameters: untraced, but
# answered by BentoML's own stack.
LEAN = {
    "services.tokenizer.service:Tokenizer": [
        "/classify", "/embed", "/inference", "/similarity", "/tokenize", "/v1/embeddings",
    ],
    "runners.onnx.service:OnnxRunner": ["/embed"],
    "runners.tf.service:TFRunner": ["/embed"],
    "runners.tenants.service:TenantRunner": ["/classify"],
}  # fmt: skip


def lean_routes(target: str, env: dict[str, str]) -> list[str]:
    """The paths a service's worker app answers on the lean path."""
    app = built(target, tuple(sorted(env.items())))
    assert app["kind"] == "HotPath"
    return app["routes"]


@pytest.mark.parametrize("target", SERVICES)
def test_every_service_answers_its_hot_routes_on_the_lean_path(target: str) -> None:
    """Nothing in a service's config turns the lean path off (max concurrency, CORS, a middleware
    not declared safe for it): its worker answers these routes there (serving/hot_path.py, whose
    own tests pin that it answers as BentoML does)."""
    assert lean_routes(target, {}) == LEAN[target]


@pytest.mark.parametrize("target", SERVICES)
def test_traced_routes_take_bentoml_s_own_path(target: str) -> None:
    prefix, _ = SERVICES[target]
    assert lean_routes(target, {f"{prefix}TRACE_REQUESTS": "true"}) == []


def _raw(pairs: list[tuple[bytes, bytes]]):
    from starlette.datastructures import MutableHeaders

    return MutableHeaders(raw=list(pairs))


@pytest.mark.parametrize(
    "added",
    [
        _raw([(b"x-queue-time", b"1.00"), (b"x-inference-time", b"2.00")]),  # new: appended
        _raw([(b"content-type", b"text/plain"), (b"x-a", b"1")]),  # one already there: replaced
        _raw([(b"x-a", b"1"), (b"x-a", b"2")]),  # a name twice: the last, as update leaves it
        _raw([(b"Content-Type", b"text/plain")]),  # a name not lower-case (raw built by hand)
        _raw([(b"X-B", b"1"), (b"x-b", b"2")]),
        {"X-Total-Time": "3.00", "content-length": "2"},  # an API that set ctx's headers to a dict
        _raw([]),
    ],
)
def test_headers_are_added_as_starlettes_update_adds_them(added) -> None:
    from starlette.responses import Response

    from serving.hot_path import _add_headers

    ours, theirs = (Response(b"{}", media_type="application/json") for _ in range(2))
    _add_headers(ours, added)
    theirs.headers.update(added)
    assert ours.raw_headers == theirs.raw_headers  # names, values and order


def test_the_in_progress_gauge_counts_a_request_while_it_runs() -> None:
    """BentoML's request metrics on the lean path, written a moment later (FLUSH_S): the
    in-progress gauge reads 1 while a request runs and 0 once it is answered; the count and the
    duration with it."""
    import asyncio
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    from serving.hot_path import _Arrivals, _Metrics
    from serving.tallies import FLUSH_S

    # The series BentoML's RunnerTrafficMetricsMiddleware makes (the lean path reads its metric
    # objects), as plain prometheus_client ones in a registry of this test's own.
    registry, service = CollectorRegistry(), ["service_name", "service_version", "runner_name"]
    labelled = ["endpoint", *service]
    middleware = SimpleNamespace(
        metrics_request_total=Counter(
            "t_total", "", [*labelled, "http_response_code"], registry=registry
        ),
        metrics_request_duration=Histogram(
            "t_seconds", "", [*labelled, "http_response_code"], registry=registry
        ),
        metrics_request_in_progress=Gauge("t_in_progress", "", labelled, registry=registry),
        metrics_last_request_timestamp=Gauge("t_last", "", service, registry=registry),
    )

    def value(name: str, **labels: str) -> float:
        samples = [
            s.value
            for metric in registry.collect()
            for s in metric.samples
            if s.name == name and labels.items() <= s.labels.items()
        ]
        return sum(samples)

    async def scenario() -> list[tuple[float, float, float]]:
        release = asyncio.Event()

        async def app(scope: dict, receive: object, send) -> None:
            await release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        async def send(message: dict) -> None:
            pass

        metrics = _Metrics(middleware, "/embed", app, _Arrivals(middleware))
        seen = []

        def read() -> None:
            seen.append(
                (
                    value("t_in_progress", endpoint="/embed"),
                    value("t_total", endpoint="/embed", http_response_code="200"),
                    value("t_seconds_count", endpoint="/embed", http_response_code="200"),
                )
            )

        request = asyncio.create_task(metrics({"type": "http"}, None, send))
        await asyncio.sleep(0)
        read()  # running, not yet written
        await asyncio.sleep(3 * FLUSH_S)
        read()  # running, written
        release.set()
        await request
        await asyncio.sleep(3 * FLUSH_S)
        read()  # answered
        return seen

    assert asyncio.run(scenario()) == [(0.0, 0.0, 0.0), (1.0, 0.0, 0.0), (0.0, 1.0, 1.0)]
    assert value("t_last") > 0  # the arrival's time, written too
