"""A small BentoML service for tests/unit/test_hot_path.py, built with its routes kept out of tracing
(the lean path takes them) or traced (BentoML's path takes everything), and driven in a process of
its own: BentoML registers its request metrics once per process.

    python -m tests.unit.hot_path_toy SCENARIO lean|bentoml

Variants: lean (the lean path in front) or bentoml (the same service as BentoML serves it, its
routes untraced alike). Scenarios: requests, slow, stalled, logged, public-pickle, internal-pickle,
traced, unsafe, frozen; and the requests with BentoML broken on purpose, as an upgrade could break
what the lean path reads (``BREAKS``): a module moved, an attribute renamed, a layer added to its
stack, a version it was not written for (auto, and with the lean path forced on).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import pickle
import sys
import time
import warnings
import weakref
from http import HTTPStatus
from typing import Any

import bentoml
from bentoml.exceptions import BentoMLException, NotFound, ServiceUnavailable
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from serving.error_bodies import ConformingErrors
from serving.errors import ApiError, QueueFull, replies_on_error
from serving.hot_path import HotPath, HotPathService
from serving.replies import reply
from serving.settings import ServiceSettings
from serving.tallies import FLUSH_S

ROUTES = [
    "/model", "/reply", "/refused", "/shed", "/crash", "/missing", "/forbidden", "/unavailable",
    "/slow", "/invalid", "/kwargs", "/context", "/mounted/echo", "/mounted/stream", "/mounted/refused",
]  # fmt: skip
BACKGROUND: list[str] = []  # what background tasks ran, in order


class Text(BaseModel):
    text: str


class Upper(BaseModel):
    text: str
    length: int


async def remember(text: str) -> None:
    BACKGROUND.append(text)


class Toy:
    """Each kind of answer an API gives: a model (BentoML's output spec writes it), a Response,
    an error reply, an exception, a late answer, a validation error raised inside, keyword args,
    and what an API does with its ctx."""

    # `make test-newest-bentoml` forces it on: the lean path runs on whatever BentoML that is.
    lean_path = os.environ.get("HOT_PATH_TOY_LEAN_PATH", "auto")

    @bentoml.api
    async def model(self, request: Text, /, ctx: bentoml.Context) -> Upper:
        ctx.response.headers["X-Seen"] = request.text
        return Upper(text=request.text.upper(), length=len(request.text))

    @bentoml.api
    @replies_on_error
    async def reply(self, request: Text, /, ctx: bentoml.Context) -> Upper:
        ctx.response.headers.update({"X-Queue-Time": "0.10", "X-Total-Time": "1.00"})
        return reply({"text": request.text, "length": len(request.text)})

    @bentoml.api
    @replies_on_error
    async def refused(self, request: Text, /, ctx: bentoml.Context) -> Upper:
        raise ApiError(f"unknown tenant {request.text!r}", 404)

    @bentoml.api
    @replies_on_error
    async def shed(self, request: Text, /, ctx: bentoml.Context) -> Upper:
        raise QueueFull(2.5, "queue full")

    @bentoml.api
    async def missing(self, request: Text, /) -> Upper:
        raise NotFound(f"no {request.text!r}")  # BentoML's own 4xx: its one-element list body

    @bentoml.api
    async def forbidden(self, request: Text, /) -> Upper:
        raise BentoMLException("who are you", error_code=HTTPStatus.UNAUTHORIZED)

    @bentoml.api
    async def unavailable(self, request: Text, /) -> Upper:
        raise ServiceUnavailable("down for a moment")

    @bentoml.api
    async def crash(self, request: Text, /) -> Upper:
        raise RuntimeError("a bug")

    @bentoml.api
    async def slow(self, request: Text, /) -> Upper:
        await asyncio.sleep(5)
        raise AssertionError("the timeout should have answered")

    @bentoml.api
    async def invalid(self, request: Text, /) -> Upper:
        return Upper.model_validate({"text": request.text})  # a ValidationError inside the API

    @bentoml.api
    async def kwargs(self, ids: list[list[int]], variant: str = "fp32") -> dict[str, Any]:
        return {"rows": len(ids), "variant": variant}

    @bentoml.api
    async def context(self, request: Text, /, ctx: bentoml.Context) -> dict[str, Any]:
        """Status, headers of either case, a Server header of its own, a cookie, shared state, the
        request's headers, a background task."""
        ctx.state["calls"] = ctx.state.get("calls", 0) + 1
        ctx.response.status_code = 201
        ctx.response.headers["X-A"] = "1"
        ctx.response.headers["x-a"] = "2"
        ctx.response.headers["Server"] = "mine"
        ctx.response.set_cookie("seen", request.text)
        ctx.response.background.add_task(remember, request.text)
        return {"calls": ctx.state["calls"], "agent": ctx.request.headers["x-agent"]}


async def echo(request: Request) -> JSONResponse:
    return JSONResponse(
        {"echo": (await request.json())["text"], "root": request.scope["root_path"]}
    )


async def stream(_: Request) -> StreamingResponse:
    async def chunks():
        for i in range(4):
            yield f"{i}".encode()
            await asyncio.sleep(0.4)  # 1.6 s in all: longer than the timeout, after the start

    return StreamingResponse(chunks(), media_type="text/plain")


async def mounted_refusal(_: Request) -> JSONResponse:
    return JSONResponse([{"error": "no", "detail": ": body"}], status_code=422)


MOUNTED = Starlette(
    routes=[
        Route("/echo", echo, methods=["POST"]),
        Route("/stream", stream, methods=["POST"]),
        Route("/refused", mounted_refusal, methods=["POST"]),
    ]
)


class Plain:
    """A middleware of a service's own that does not declare the lean path safe for it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


def toy(name: str, lean: bool, traced: bool = False, access_log: bool = False) -> Any:
    """``Toy`` as a service, with the lean path in front (``lean``, as ``Toy.lean_path`` says) or
    as BentoML serves it; its routes kept out of tracing unless ``traced``."""
    settings = ServiceSettings(trace_requests=traced, lean_path=Toy.lean_path)
    decorate = bentoml.service(
        name=name,
        service_class=settings.service_class() if lean else bentoml.Service,
        tracing=settings.tracing(ROUTES),
        traffic={"timeout": 1},
        logging={"access": {"enabled": access_log}},
    )
    service = decorate(type(name, (Toy,), {}))
    service.mount_asgi_app(MOUNTED, path="/mounted/")
    service.add_asgi_middleware(ConformingErrors)  # as every service of the project does
    return service


REQUESTS: list[tuple[str, Any, str]] = [
    ("/model", {"text": "hello"}, "application/json"),
    ("/model", {"text": "hello"}, "application/json; charset=utf-8"),
    ("/reply", {"text": "hello"}, "application/json"),
    ("/refused", {"text": "acme"}, "application/json"),
    ("/shed", {"text": "x"}, "application/json"),
    ("/crash", {"text": "x"}, "application/json"),
    ("/invalid", {"text": "x"}, "application/json"),
    ("/kwargs", {"ids": [[1, 2], [3]]}, "application/json"),
    ("/kwargs", {"ids": [[1]], "variant": "int8"}, "application/json"),
    ("/context", {"text": "first"}, "application/json"),
    ("/context", {"text": "second"}, "application/json"),
    ("/mounted/echo", {"text": "hi"}, "application/json"),
    ("/mounted/refused", {}, "application/json"),
    # BentoML answers these on both paths: invalid fields, invalid JSON, another media type
    ("/model", {"text": 5}, "application/json"),
    ("/model", b"{not json", "application/json"),
    ("/model", {"text": "plain"}, "text/plain"),
    ("/kwargs", {}, "application/json"),
    # BentoML's own exceptions raised in an API: its 4xx (a one-element list body), its
    # authorization error and a 5xx (bodies it replaces)
    ("/missing", {"text": "x"}, "application/json"),
    ("/forbidden", {"text": "x"}, "application/json"),
    ("/unavailable", {"text": "x"}, "application/json"),
]
DELEGATED = (
    4  # the four after "answers these on both paths": BentoML answers them on the lean path too
)


class Unknown:
    """A layer BentoML's stack might gain in a release the lean path does not know."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


def moved_module() -> None:
    """A private module the lean path imports from loses a name (moved elsewhere)."""
    import importlib

    import bentoml._internal.server.http.access as access

    from serving import internals

    del access.AccessLogMiddleware
    importlib.reload(internals)


def unknown_version(mode: str) -> None:
    bentoml.__version__ = "9.9.9"
    Toy.lean_path = mode


def renamed_attribute(service: Any, app: Any) -> None:
    """Once BentoML has built its routes, an attribute of its API methods that the lean path reads
    is gone (renamed)."""
    for method in service.apis.values():
        del method.is_task


def added_layer(service: Any, app: Any) -> None:
    """Once started, BentoML's stack has a layer on top that the lean path does not know."""
    app.app.middleware_stack = Unknown(app.app.middleware_stack)


# Each break: what it does before the service is built, and once its app has started.
BREAKS: dict[str, tuple[Any, Any]] = {
    "moved-module": (moved_module, None),
    "renamed-attribute": (None, renamed_attribute),
    "added-layer": (None, added_layer),
    "unknown-version": (lambda: unknown_version("auto"), None),
    "unknown-version-forced": (lambda: unknown_version("on"), None),
}


def answers(service: HotPathService, started: Any = None) -> dict[str, Any]:
    """Each request's status, body and every header but the date; the metrics after them; the
    lean routes; how many requests BentoML's own endpoint answered; the background tasks run;
    the lean path's warnings. ``started(service, app)`` runs once the app has started."""
    import logging

    from _bentoml_impl.server.app import ServiceAppFactory

    logged: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(record.getMessage())

    logging.getLogger("bento_bundle.internals").addHandler(Keep())
    wrapper, wrapped = ServiceAppFactory.api_endpoint_wrapper, []

    async def counted(factory: Any, name: str, request: Any) -> Any:
        wrapped.append(name)
        return await wrapper(factory, name, request)

    ServiceAppFactory.api_endpoint_wrapper = counted  # type: ignore[method-assign]
    app = service.to_asgi(is_main=True)
    out = []
    with (
        TestClient(app, raise_server_exceptions=False) as client,
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        if started is not None:
            started(service, app)
        for path, body, media in REQUESTS:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            resp = client.post(path, content=data, headers={"content-type": media, "x-agent": "t"})
            headers = sorted((k, v) for k, v in resp.headers.multi_items() if k != "date")
            out.append([resp.status_code, resp.content.decode(), headers])
        time.sleep(2 * FLUSH_S)  # the lean path writes its request metrics a moment later
        metrics = client.get("/metrics").text
    return {
        "answers": out,
        "metrics": metrics,
        "routes": sorted(app.routes()) if isinstance(app, HotPath) else None,
        "bentoml_answered": len(wrapped),
        "background": BACKGROUND,
        "warnings": sorted({f"{w.category.__name__}: {w.message}" for w in caught}),
        "logged": logged,
    }


def slow(service: HotPathService) -> dict[str, Any]:
    """An API slower than the timeout; a mounted stream that starts in time and ends after it."""
    with TestClient(service.to_asgi(is_main=True)) as client:
        api = client.post("/slow", json={"text": "x"})
        streamed = client.post("/mounted/stream", json={})
    return {
        "api": [api.status_code, api.json(), api.headers.get("server")],
        "stream": [streamed.status_code, streamed.text],
    }


def stalled(service: HotPathService) -> list[Any]:
    """A client that sends half its body and then nothing: answered at the timeout."""
    app = service.to_asgi(is_main=True)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if not sent:
            sent.append({})
            return {"type": "http.request", "body": b'{"text": ', "more_body": True}
        await asyncio.sleep(30)
        return {"type": "http.disconnect"}

    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/model", "raw_path": b"/model", "query_string": b"",
        "root_path": "", "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 3000),
    }  # fmt: skip
    with TestClient(app) as client:  # started: its lifespan has run
        client.portal.call(app, scope, receive, send)
    start = next(m for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return [start["status"], json.loads(body)]


def pickled(service: HotPathService, main: bool) -> list[Any]:
    """A pickle body, as the services send each other, to the public port or an internal one."""
    from _bentoml_impl.server.app import ServiceAppFactory

    wrapper, wrapped = ServiceAppFactory.api_endpoint_wrapper, []

    async def counted(factory: Any, name: str, request: Any) -> Any:
        wrapped.append(name)
        return await wrapper(factory, name, request)

    ServiceAppFactory.api_endpoint_wrapper = counted  # type: ignore[method-assign]
    body = pickle.dumps({"ids": [[1, 2]], "variant": "int8"})
    media = {"content-type": "application/vnd.bentoml+pickle"}
    with TestClient(service.to_asgi(is_main=main)) as client:
        resp = client.post("/kwargs", content=body, headers=media)
    answer = pickle.loads(resp.content) if resp.status_code == 200 else resp.json()
    return [resp.status_code, answer, len(wrapped)]


def logged(service: HotPathService) -> list[str]:
    """The access log's lines for two requests (the latency, which varies, left out)."""
    import logging

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage().rsplit(" ", 1)[0])

    access = logging.getLogger("bentoml.access")
    access.setLevel(logging.INFO)
    access.addHandler(Keep())
    with TestClient(service.to_asgi(is_main=True)) as client:
        client.post("/model", json={"text": "hello"})
        client.post("/refused", json={"text": "acme"})
    return lines


def traced(service: HotPathService) -> list[str]:
    """The lean routes of a service whose routes are traced."""
    app = service.to_asgi(is_main=True)
    with TestClient(app) as client:
        client.post("/model", json={"text": "hello"})
        return sorted(app.routes())


def unsafe(service: HotPathService) -> list[str]:
    """The lean routes of a service with a middleware that does not declare itself safe."""
    service.add_asgi_middleware(Plain)
    app = service.to_asgi(is_main=True)
    with TestClient(app) as client:
        client.post("/model", json={"text": "hello"})
        return sorted(app.routes())


def probed(service: HotPathService) -> dict[str, Any]:
    """The lean routes before any request, and after one readiness probe (no POST yet)."""
    app = service.to_asgi(is_main=True)
    with TestClient(app) as client:
        before = app._routes  # what the first POST would otherwise build
        status = client.get("/readyz").status_code
        return {"before": before, "probe": status, "after": sorted(app._routes or {})}


def frozen(service: HotPathService) -> dict[str, Any]:
    """What ``gc.freeze`` holds before the app starts and once its start-up is complete, whether
    the service instance, made at start-up, is among the frozen objects then (objects frozen are
    out of every generation ``gc.get_objects`` lists), whether garbage made before was collected,
    and the collector's thresholds."""
    from _bentoml_sdk import get_current_service

    class Node:
        pass

    # Garbage in a cycle, made before start-up completes, with no automatic collection to free it
    # first: only a collection before the freeze keeps it from being frozen for good.
    gc.disable()
    garbage = Node()
    garbage.itself = garbage  # type: ignore[attr-defined]
    left = weakref.ref(garbage)
    del garbage
    before, thresholds = gc.get_freeze_count(), gc.get_threshold()
    with TestClient(service.to_asgi(is_main=True)):
        instance = id(get_current_service())
        return {
            "before": before,
            "after": gc.get_freeze_count(),
            "instance_frozen": instance not in {id(o) for o in gc.get_objects()},
            "garbage_collected": left() is None,
            "thresholds": [thresholds, gc.get_threshold()],
        }


if __name__ == "__main__":
    scenario, variant = sys.argv[1:3]
    before, once_started = BREAKS.get(scenario, (None, None))
    if before is not None:
        before()
    service = toy(
        f"toy_{variant}",
        lean=variant == "lean",
        traced=scenario == "traced",
        access_log=scenario == "logged",
    )
    run = {
        "requests": answers,
        "slow": slow,
        "stalled": stalled,
        "logged": logged,
        "public-pickle": lambda s: pickled(s, main=True),
        "internal-pickle": lambda s: pickled(s, main=False),
        "traced": traced,
        "unsafe": unsafe,
        "frozen": frozen,
        "probed": probed,
        **{name: lambda s: answers(s, once_started) for name in BREAKS},
    }[scenario]
    print(json.dumps(run(service)))
