"""A small BentoML service for tests/unit/test_hot_path.py, built with its routes kept out of tracing
(the lean path takes them) or traced (BentoML's path takes everything), and driven in a process of
its own: BentoML registers its request metrics once per process.

    python -m tests.unit.hot_path_toy requests|slow|logged|public-pickle|internal-pickle lean|full
"""

from __future__ import annotations

import asyncio
import json
import pickle
import sys
from typing import Any

import bentoml
from pydantic import BaseModel
from starlette.testclient import TestClient

from serving.error_bodies import ConformingErrors
from serving.errors import ApiError, QueueFull, replies_on_error
from serving.hot_path import HotPath, HotPathService
from serving.replies import reply
from serving.settings import ServiceSettings

ROUTES = ["/model", "/reply", "/refused", "/shed", "/crash", "/slow", "/invalid", "/kwargs"]


class Text(BaseModel):
    text: str


class Upper(BaseModel):
    text: str
    length: int


class Toy:
    """Each kind of answer an API gives: a model (BentoML's output spec writes it), a Response,
    an error reply, an exception, a late answer, a validation error raised inside, keyword args."""

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


def toy(name: str, traced: bool, access_log: bool = False) -> HotPathService:
    """``Toy`` as a service: its routes kept out of tracing unless ``traced``."""
    settings = ServiceSettings(trace_requests=traced)
    decorate = bentoml.service(
        name=name,
        service_class=HotPathService,
        tracing=settings.tracing(ROUTES),
        traffic={"timeout": 1},
        logging={"access": {"enabled": access_log}},
    )
    service = decorate(type(name, (Toy,), {}))
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
    # BentoML answers these on both paths: invalid fields, invalid JSON, another media type
    ("/model", {"text": 5}, "application/json"),
    ("/model", b"{not json", "application/json"),
    ("/model", {"text": "plain"}, "text/plain"),
    ("/kwargs", {}, "application/json"),
]
HEADERS = ("content-type", "content-length", "server", "x-seen", "retry-after", "x-total-time")


def answers(service: HotPathService) -> dict[str, Any]:
    """Each request's status, JSON body and headers; the metrics after them; the lean routes."""
    from _bentoml_impl.server.app import ServiceAppFactory

    # Requests BentoML's own endpoint wrapper answers (the lean path answers the others).
    wrapper, wrapped = ServiceAppFactory.api_endpoint_wrapper, []

    async def counted(factory: Any, name: str, request: Any) -> Any:
        wrapped.append(name)
        return await wrapper(factory, name, request)

    ServiceAppFactory.api_endpoint_wrapper = counted  # type: ignore[method-assign]
    app = service.to_asgi(is_main=True)
    assert isinstance(app, HotPath)
    out = []
    with TestClient(app, raise_server_exceptions=False) as client:
        for path, body, media in REQUESTS:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            resp = client.post(path, content=data, headers={"content-type": media})
            out.append([resp.status_code, resp.json(), {h: resp.headers.get(h) for h in HEADERS}])
        metrics = client.get("/metrics").text
    return {
        "answers": out,
        "metrics": metrics,
        "routes": sorted(app.routes()),
        "bentoml_answered": len(wrapped),
    }


def slow(service: HotPathService) -> dict[str, Any]:
    with TestClient(service.to_asgi(is_main=True)) as client:
        resp = client.post("/slow", json={"text": "x"})
    return {"status": resp.status_code, "body": resp.json()}


def pickled(service: HotPathService, main: bool) -> list[Any]:
    """A pickle body, as the services send each other, to the public port or an internal one."""
    body = pickle.dumps({"ids": [[1, 2]], "variant": "int8"})
    media = {"content-type": "application/vnd.bentoml+pickle"}
    with TestClient(service.to_asgi(is_main=main)) as client:
        resp = client.post("/kwargs", content=body, headers=media)
    return [
        resp.status_code,
        pickle.loads(resp.content) if resp.status_code == 200 else resp.json(),
    ]


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


if __name__ == "__main__":
    scenario, variant = sys.argv[1:3]
    service = toy(f"toy_{variant}", traced=variant == "full", access_log=scenario == "logged")
    run = {
        "requests": answers,
        "slow": slow,
        "logged": logged,
        "public-pickle": lambda s: pickled(s, main=True),
        "internal-pickle": lambda s: pickled(s, main=False),
    }[scenario]
    print(json.dumps(run(service)))
