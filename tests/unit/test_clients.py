"""The typed runner clients answer the same types whichever way the runner is reached: a dependency
in the same graph hands back the models themselves, a runner reached by URL hands back JSON."""

from __future__ import annotations

import asyncio
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from http import HTTPStatus
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from bentoml.exceptions import BentoMLException

from services.tokenizer.clients import (
    NoReplica,
    OnnxRunnerClient,
    RunnerUnavailable,
    TenantRunnerClient,
    TFRunnerClient,
)
from services.tokenizer.replica_wait import ReplicaWait
from serving.errors import ApiError, Overloaded
from serving.protocol import Classified, Deleted, EmbedResult, Registered, TenantInfo
from testkit.processes import ROOT
from tests.unit.live_server import serving

CLASSIFIED = Classified(intents=["greeting"], scores=[0.9], version="v1", cache="hit")
REGISTERED = Registered(tenant="acme", version="v2", labels=["a", "b"], bytes=10, metrics={})
INFO = TenantInfo(
    tenant="acme", version="v2", format="onnx", labels=["a", "b"], source="train",
    created="2026-11-23T00:00:00+00:00", metrics={"train_accuracy": 1.0}, bytes=10, versions=["v2"],
)  # fmt: skip
EMBEDDED = EmbedResult(
    embeddings=np.array([[0.5, -0.25]], dtype=np.float32), queue_ms=1.5, inference_ms=2.5, engine_calls=1
)  # fmt: skip


class FakeProxy:
    """What ``bentoml.depends`` gives: ``proxy.to_async.<api>(**kwargs)``. ``json=True`` answers as
    a runner reached by URL does (plain JSON data), otherwise as one in the same graph (models)."""

    def __init__(self, json: bool, fail: list[Exception] | None = None) -> None:
        self.to_async = self
        self.json = json
        self.fail = fail or []
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.headers: list[dict[str, str]] = []
        self.endpoints = {
            api: api for api in ("embed", "classify", "train", "upload", "show", "delete")
        }

    async def _call(
        self, endpoint: str, args: tuple, kwargs: dict[str, Any], *, headers: dict[str, str]
    ) -> Any:
        # BentoML's client's own signature (an endpoint, then the arguments and headers).
        self.headers.append(headers)
        return await getattr(self, endpoint)(*args, **kwargs)

    def _answer(self, api: str, value: Any, **kwargs: Any) -> Any:
        self.calls.append((api, kwargs))
        if self.fail:
            raise self.fail.pop(0)
        if self.json and hasattr(value, "model_dump"):
            dumped = value.model_dump(mode="json")
            if isinstance(value, EmbedResult):
                dumped["embeddings"] = value.embeddings.tolist()
            return dumped
        return value

    async def embed(self, **kw: Any) -> Any:
        return self._answer("embed", EMBEDDED, **kw)

    async def classify(self, **kw: Any) -> Any:
        return self._answer("classify", CLASSIFIED, **kw)

    async def train(self, **kw: Any) -> Any:
        return self._answer("train", REGISTERED, **kw)

    async def upload(self, **kw: Any) -> Any:
        return self._answer("upload", REGISTERED, **kw)

    async def list_tenants(self, **kw: Any) -> Any:
        return self._answer("list_tenants", ["acme", "initech"], **kw)

    async def show(self, **kw: Any) -> Any:
        return self._answer("show", INFO, **kw)

    async def delete(self, **kw: Any) -> Any:
        return self._answer("delete", Deleted(tenant="acme", deleted=True), **kw)


@pytest.mark.parametrize("json", [False, True], ids=["same graph", "by URL"])
def test_tenant_registry_answers_typed_models_either_way(json: bool) -> None:
    client = TenantRunnerClient(FakeProxy(json))

    async def main() -> list[Any]:
        return [
            await client.train("acme", ["a", "b"], "onnx", ids=[[5], [6]]),
            await client.upload("acme", Path("model.tar.gz")),
            await client.list_tenants(),
            await client.show("acme"),
            await client.delete("acme"),
        ]

    proxy = client.proxy
    trained, uploaded, names, info, deleted = asyncio.run(main())
    # Every call of one tenant names it for the proxy; listing names none (any replica answers).
    assert proxy.headers == [{"X-Bundle-Tenant": "acme"}] * 4
    assert [api for api, _ in proxy.calls] == ["train", "upload", "list_tenants", "show", "delete"]
    assert type(trained) is Registered and trained == REGISTERED and uploaded == REGISTERED
    assert names == ["acme", "initech"]
    assert type(info) is TenantInfo and info == INFO
    assert deleted == Deleted(tenant="acme", deleted=True)


def runner_app(service: Any, answers: dict[str, Any], seen: list[tuple[str, str, Any]]) -> Any:
    """A runner's endpoints as BentoML's server reads and answers them: the body parsed by the
    serde of its media type into the API's input spec, the answer written by its output spec."""
    from _bentoml_impl.serde import ALL_SERDE
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    def api(name: str) -> Any:
        method = service.apis[name]

        async def endpoint(request: Request) -> Any:
            serde = ALL_SERDE[request.headers["content-type"]]()
            data = await method.input_spec.from_http_request(request, serde)
            # What a proxy routes by: the tenant of a tenant call, the model of an embed call.
            routed = request.headers.get("x-bundle-tenant", request.headers.get("x-bundle-model"))
            seen.append((name, routed, data.model_dump()))
            return await method.output_spec.to_http_response(answers[name], serde)

        return Route(f"/{name}", endpoint, methods=["POST"])

    async def schema(_: Request) -> JSONResponse:
        return JSONResponse(service.schema())

    return Starlette(routes=[*(api(n) for n in answers), Route("/schema.json", schema)])


# How the tokenizer reaches a runner: in the graph on its Unix socket (pickle, the lean hop); by URL
# (JSON over TCP, the lean hop); an in-process app (pickle, BentoML's own session).
TRANSPORTS = ["unix", "tcp", "app"]


@contextmanager
def proxy_of(service: Any, app: Any, transport: str) -> Iterator[Any]:
    """The client ``bentoml.depends`` gives the tokenizer, to ``app`` served on a real socket (or
    in-process): in the graph, the runner's service and pickle; by URL, JSON and the endpoints
    from the runner's schema."""
    from _bentoml_impl.client import RemoteProxy
    from bentoml._internal.utils.uri import path_to_uri

    from services.tokenizer.clients import PICKLE

    service.inject_config()  # BentoML reads the runner's timeout from its config
    if transport == "app":
        yield RemoteProxy("http://runner", service=service, media_type=PICKLE, app=app)
    elif transport == "unix":
        with (
            tempfile.TemporaryDirectory(prefix="hop") as tmp,
            serving(app, f"{tmp}/r.sock") as sock,
        ):
            yield RemoteProxy(path_to_uri(sock), service=service, media_type=PICKLE)
    else:
        with serving(app) as url:
            yield RemoteProxy(url, media_type="application/json")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_hot_calls_are_read_by_the_runner_and_answer_as_bentomls_client(transport: str) -> None:
    """The embed and classify calls skip BentoML's generic client (``HotCalls``): the runner's own
    serde reads exactly the arguments BentoML's client sends, and the answers are the same."""
    from runners.onnx.service import OnnxRunner
    from runners.tenants.service import TenantRunner
    from runners.tf.service import TFRunner

    seen: list[tuple[str, str, Any]] = []
    vectors = np.full((1, 384), 0.5, np.float32)
    model = "some-encoder"

    hops: list[Any] = []  # each client's hop pool after its call: None on BentoML's session

    async def main(onnx: Any, tf: Any, tenants: Any) -> list[Any]:
        clients = [
            OnnxRunnerClient(onnx, model, "int8"), TFRunnerClient(tf, model),
            TenantRunnerClient(tenants),
        ]  # fmt: skip
        async with onnx.to_async, tf.to_async, tenants.to_async:
            ours = [
                await clients[0].embed([[101, 102]], 2.0),
                await clients[1].embed([[101, 102]], -1.0),
                await clients[2].classify("acme", [[5, 6]], None),
                await clients[2].classify("acme", None, vectors, model),
            ]
            await clients[0].embed([[101, 7, 102]], 2.0, [2])  # a pair: its second text at 2
            theirs = await onnx.to_async.embed(
                ids=[[101, 102]], model=model, variant="int8", deadline_s=2.0
            )
        hops.extend(client.hot._hop for client in clients)
        return [*ours, theirs]

    with (
        proxy_of(OnnxRunner, runner_app(OnnxRunner, {"embed": EMBEDDED}, seen), transport) as onnx,
        proxy_of(TFRunner, runner_app(TFRunner, {"embed": EMBEDDED}, seen), transport) as tf,
        proxy_of(
            TenantRunner, runner_app(TenantRunner, {"classify": CLASSIFIED}, seen), transport
        ) as tenants,
    ):
        onnx, tf, by_ids, by_vectors, theirs = asyncio.run(main(onnx, tf, tenants))
    if transport == "app":
        assert hops == [None] * 3
    else:  # the lean hop carried the calls: one connection each, on the transport named
        assert [(hop.opened, hop.unix_path is not None) for hop in hops] == [
            (1, transport == "unix")
        ] * 3
    for result in (onnx, tf):
        assert result.vectors.dtype == np.float32
        np.testing.assert_array_equal(result.vectors, EMBEDDED.embeddings)
        assert (result.queue_ms, result.inference_ms) == (1.5, 2.5)
    embeddings = theirs["embeddings"] if isinstance(theirs, dict) else theirs.embeddings
    np.testing.assert_array_equal(np.asarray(embeddings, np.float32), onnx.vectors)
    assert type(by_ids) is Classified and by_ids == by_vectors == CLASSIFIED
    ids = {
        "ids": [[101, 102]], "model": model, "variant": "int8", "deadline_s": 2.0, "segments": None
    }  # fmt: skip
    pair = {**ids, "ids": [[101, 7, 102]], "segments": [2]}
    by_vectors = {"tenant": "acme", "ids": None, "vectors": vectors.tolist(), "encoder": model}
    assert seen == [
        ("embed", model, ids),
        # a spent budget still goes
        (
            "embed",
            model,
            {"ids": [[101, 102]], "model": model, "deadline_s": 0.001, "segments": None},
        ),
        ("classify", "acme", {"tenant": "acme", "ids": [[5, 6]], "vectors": None, "encoder": None}),
        ("classify", "acme", by_vectors),
        ("embed", model, pair),
        ("embed", None, ids),  # BentoML's own client: the same arguments (no header)
    ]


def test_overload_and_caller_errors_pass_through_with_their_status() -> None:
    def failing(status: int, body: str) -> TenantRunnerClient:
        return TenantRunnerClient(
            FakeProxy(True, [BentoMLException(body, error_code=HTTPStatus(status))])
        )

    async def outcome(client: TenantRunnerClient) -> BaseException:
        with pytest.raises(ApiError) as info:
            await client.show("acme")
        return info.value

    shed = asyncio.run(outcome(failing(429, '{"error": "queue full", "retry_after": 3}')))
    assert isinstance(shed, Overloaded) and shed.status == 429 and shed.retry_after == 3
    unknown = asyncio.run(outcome(failing(404, '{"error": "unknown tenant \'acme\'"}')))
    assert unknown.status == 404 and unknown.message == "unknown tenant 'acme'"


def test_the_proxys_no_replica_answer_and_a_refused_connection_mean_no_replica() -> None:
    """The proxy's own 503 (its body as deploy/proxy/haproxy.cfg writes it) and a runner no
    connection opens to are NoReplica, which the tokenizer waits out; a dropped connection and a
    runner's own 503 (shedding) are passed on as they are."""
    cfg = (ROOT / "deploy" / "proxy" / "haproxy.cfg").read_text()
    proxys = re.search(r"http-error status 503 .* string '(.+)'", cfg)
    assert proxys is not None
    down = BentoMLException(proxys[1], error_code=HTTPStatus(503))
    refused = aiohttp.ClientConnectorError(None, OSError(111, "refused"))  # type: ignore[arg-type]
    shedding = BentoMLException('{"error": "cannot finish in time", "retry_after": 2}',
                                error_code=HTTPStatus(503))  # fmt: skip

    async def outcome(fail: list[Exception]) -> BaseException:
        with pytest.raises(ApiError) as info:
            await OnnxRunnerClient(FakeProxy(True, fail), "m", "fp32").embed([[101, 102]], 2.0)
        return info.value

    assert type(asyncio.run(outcome([down]))) is NoReplica
    assert type(asyncio.run(outcome([refused, refused]))) is NoReplica
    # A connection dropped mid-call reached a replica: not waited for (it may be the call itself).
    dropped = [aiohttp.ServerDisconnectedError(), aiohttp.ServerDisconnectedError()]
    assert type(asyncio.run(outcome(dropped))) is RunnerUnavailable
    shed = asyncio.run(outcome([shedding]))
    assert type(shed) is Overloaded and shed.retry_after == 2


def test_a_dead_connection_is_retried_once_then_reported_as_503() -> None:
    once = FakeProxy(False, [aiohttp.ServerDisconnectedError()])
    assert asyncio.run(TenantRunnerClient(once).show("acme")) == INFO
    assert len(once.calls) == 2

    dead = FakeProxy(False, [aiohttp.ServerDisconnectedError(), aiohttp.ServerDisconnectedError()])
    with pytest.raises(RunnerUnavailable) as info:
        asyncio.run(TenantRunnerClient(dead).show("acme"))
    assert info.value.status == 503 and info.value.headers() == {"Retry-After": "1"}


def test_bentoml_client_sends_the_tenant_header_to_the_runner() -> None:
    """The client `bentoml.depends(url=...)` gives the tokenizer (a RemoteProxy speaking JSON),
    against the tenant runner's own endpoints: the proxy's routing key arrives on the request, with
    the JSON body; arguments not given are absent, not null (BentoML's JSON encoder cannot send a
    null for an optional array)."""
    from _bentoml_impl.client import RemoteProxy
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from runners.tenants.service import TenantRunner

    seen: list[tuple[str, str | None, dict[str, Any]]] = []

    async def classify(request: Request) -> JSONResponse:
        seen.append(
            (request.url.path, request.headers.get("x-bundle-tenant"), await request.json())
        )
        return JSONResponse(CLASSIFIED.model_dump(mode="json"))

    async def schema(_: Request) -> JSONResponse:  # what a tenant runner serves: its own schema
        return JSONResponse(TenantRunner.schema())

    async def main() -> tuple[Classified, Classified]:
        app = Starlette(
            routes=[
                Route("/classify", classify, methods=["POST"]),
                Route("/schema.json", schema, methods=["GET"]),
            ]
        )
        # As bentoml.depends(url=...) makes it: no service class, JSON, endpoints from the schema.
        proxy = RemoteProxy("http://tenant-runner", media_type="application/json", app=app)
        async with proxy.to_async:
            client = TenantRunnerClient(proxy)
            by_ids = await client.classify("acme", [[5, 6]], None)
            vectors = np.full((1, 384), 0.5, np.float32)
            by_vectors = await client.classify("acme", None, vectors, "some-encoder")
        return by_ids, by_vectors

    by_ids, by_vectors = asyncio.run(main())
    assert by_ids.model_dump() == by_vectors.model_dump() == CLASSIFIED.model_dump()
    assert seen == [
        ("/classify", "acme", {"tenant": "acme", "ids": [[5, 6]]}),
        (
            "/classify",
            "acme",
            {"tenant": "acme", "vectors": [[0.5] * 384], "encoder": "some-encoder"},
        ),
    ]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_hot_calls_refusal_passes_through_with_its_status(transport: str) -> None:
    """A runner's 429/503 reaches the tokenizer as its overload (Retry-After kept), a 4xx as the
    caller's mistake, whatever the transport."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from runners.onnx.service import OnnxRunner
    from runners.tenants.service import TenantRunner

    async def shed(_: Request) -> JSONResponse:
        return JSONResponse({"error": "queue full", "retry_after": 3}, status_code=429)

    async def unknown(_: Request) -> JSONResponse:
        return JSONResponse({"error": "unknown tenant 'acme'"}, status_code=404)

    def app(service: Any, path: str, endpoint: Any) -> Starlette:
        async def schema(_: Request) -> JSONResponse:
            return JSONResponse(service.schema())

        return Starlette(
            routes=[Route(path, endpoint, methods=["POST"]), Route("/schema.json", schema)]
        )

    async def main(onnx: Any, tenants: Any) -> tuple[BaseException, BaseException]:
        async with onnx.to_async, tenants.to_async:
            with pytest.raises(Overloaded) as overloaded:
                await OnnxRunnerClient(onnx, "m", "fp32").embed([[101, 102]], 2.0)
            with pytest.raises(ApiError) as refused:
                await TenantRunnerClient(tenants).classify("acme", [[5]], None)
        return overloaded.value, refused.value

    with (
        proxy_of(OnnxRunner, app(OnnxRunner, "/embed", shed), transport) as onnx,
        proxy_of(TenantRunner, app(TenantRunner, "/classify", unknown), transport) as tenants,
    ):
        overloaded, refused = asyncio.run(main(onnx, tenants))
    assert overloaded.status == 429 and overloaded.headers() == {"Retry-After": "3"}
    assert refused.status == 404 and refused.message == "unknown tenant 'acme'"


def test_tenant_classify_calls_wait_for_a_replica_and_registry_writes_do_not() -> None:
    """With a gate, a classify call the proxy answers "no replica" waits and is answered once the
    runner is back (the call sent again, the tenant's header on every try), and so does a tenant's
    look-up, which a classify request may need first; a registry write with the same answer is
    refused at once."""
    cfg = (ROOT / "deploy" / "proxy" / "haproxy.cfg").read_text()
    proxys = re.search(r"http-error status 503 .* string '(.+)'", cfg)
    assert proxys is not None

    def down(times: int) -> list[Exception]:
        return [BentoMLException(proxys[1], error_code=HTTPStatus(503)) for _ in range(times)]

    gate = ReplicaWait("tenant_runner", wait_s=5, max_waiting=10, retry_s=0.05)
    proxy = FakeProxy(True, down(3))
    client = TenantRunnerClient(proxy, replicas=gate)
    answer = asyncio.run(client.classify("acme", [[5, 6]], None))
    assert answer == CLASSIFIED and gate.up
    assert [api for api, _ in proxy.calls] == ["classify"] * 4
    assert proxy.headers == [{"X-Bundle-Tenant": "acme"}] * 4

    looked_up = TenantRunnerClient(FakeProxy(True, down(2)), replicas=gate)
    assert asyncio.run(looked_up.show("acme")) == INFO and gate.up

    registry = TenantRunnerClient(FakeProxy(True, down(1)), replicas=gate)
    with pytest.raises(NoReplica):
        asyncio.run(registry.delete("acme"))
    assert gate.up  # the write's refusal did not close the gate
