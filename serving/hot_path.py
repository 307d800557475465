"""The lean path of a service's hot routes: BentoML's answer, without BentoML's per-request layers.

BentoML 1.4.39 sends every request through ten layers before an API runs: Starlette's error
middleware, its metrics middleware, OpenTelemetry's (which rebuilds the URL to test its exclusion
list even for excluded routes), the access log, a timeout middleware that starts a task per request,
the service's own middlewares, a context middleware, Starlette's exception middleware and router,
and an endpoint wrapper that calls ``inspect.signature`` per request. For a one-sentence request
that machinery was most of the tokenizer's CPU (loadtests/README.md measures both paths).

``HotPath`` sits in front of the app BentoML builds and answers the *hot routes* itself: the POST
routes a service keeps out of tracing (``ServiceSettings.trace_requests`` off, the default) — its
APIs, and the fixed POST routes of Starlette apps mounted in it (OpenAI's ``/v1/embeddings``).
What it keeps is what BentoML's layers do for such a request, mostly with BentoML's own objects:
- the request metrics (the metric objects BentoML's middleware made: the same series, measured
  from the request's arrival and written with others a moment later, serving/tallies.py) and the
  access log when it is on (a copy of BentoML's middleware), from the request's arrival;
- the traffic timeout, from arrival to the first byte sent (504, BentoML's body), as one timer
  instead of a task per request;
- for an API: BentoML's request context (``ServiceContext.in_request``, as its context middleware
  does), the body parsed by the API's input spec and serde (JSON; pickle on internal services
  only, as BentoML allows), the function called and its output written as ``api_endpoint`` does
  (ctx status, headers, cookies), BentoML's endpoint wrapper's error mapping, ``Server`` header
  and background tasks;
- the service's own middlewares, each of which declares ``lean_path_safe`` with why the lean path
  leaves its answers unchanged; ``ConformingErrors`` itself runs around the lean answers.

What the lean path would answer differently goes to BentoML, below the layers the lean path has
already recorded the request with: a media type other than JSON (pickle on internal services), a
body that does not validate (BentoML writes the 400). A service with traced hot routes,
``max_concurrency``, CORS, or a middleware that does not declare itself safe keeps BentoML's path
for every request.

It also tunes Python's cyclic collector once the app's start-up is complete (``_frozen_at_startup``):
the objects start-up made are frozen (``gc.freeze``), so full collections stop scanning them, and
young collections start later, so they stop scanning the requests in flight every few requests.

Installed by an upstream-style override: ``bentoml.service(service_class=HotPathService)`` (a
parameter of BentoML's own decorator) whose ``to_asgi`` — what every ``bentoml serve`` and
``start-http-server`` worker calls — returns ``HotPath(app)``. ``tests/unit/test_hot_path.py`` pins
that both paths answer alike.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from timeit import default_timer
from typing import Any

from _bentoml_impl.serde import JSONSerde, Payload, PickleSerde, Serde
from _bentoml_sdk import Service, get_current_service
from _bentoml_sdk.io_models import ARGS, KWARGS, IORootModel, IterableResponse
from bentoml._internal.server.http_app import log_exception
from bentoml._internal.utils.http import set_cookies
from bentoml.exceptions import BentoMLException
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from serving.error_bodies import ConformingErrors
from serving.tallies import Flushes, HistogramTally, flush_all

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]
_UNEXPECTED = {"error": "An unexpected error has occurred, please check the server log."}


class HotPathService(Service):
    """A BentoML service whose workers put ``HotPath`` in front of the app BentoML builds."""

    def to_asgi(self, is_main: bool = True) -> ASGIApp:
        return HotPath(super().to_asgi(is_main), self, is_main=is_main)


class HotPath:
    def __init__(self, app: Starlette, service: Service, *, is_main: bool) -> None:
        self.app = app
        self.service = service
        self.is_main = is_main
        self.timeout: float | None = None
        self._inner: ASGIApp = app  # BentoML's stack below the layers that record a request
        self._routes: dict[str, ASGIApp] | None = None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            route = self.routes().get(scope["path"])
            if route is not None:
                await route(scope, receive, send)
                return
        elif scope["type"] == "lifespan":
            send = _flushed_at_shutdown(_frozen_at_startup(send))
        await self.app(scope, receive, send)

    def routes(self) -> dict[str, ASGIApp]:
        """Path -> its lean handler. Built at the first request: BentoML builds its middlewares at
        start-up, and the lean path takes their settings from them. Empty: BentoML's path only."""
        if self._routes is None:
            if getattr(self.app, "middleware_stack", None) is None:
                return {}  # not started: BentoML's path, and look again next time
            self._routes = self._build()
        return self._routes

    def _build(self) -> dict[str, ASGIApp]:
        from bentoml._internal.server.http.access import AccessLogMiddleware
        from bentoml._internal.server.http.instruments import RunnerTrafficMetricsMiddleware
        from bentoml._internal.server.http.traffic import (
            MaxConcurrencyMiddleware,
            TimeoutMiddleware,
        )
        from bentoml._internal.utils.uri import join_paths
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
        from starlette.middleware.cors import CORSMiddleware
        from starlette.middleware.errors import ServerErrorMiddleware

        layers: dict[type, Any] = {}
        layer = self.app.middleware_stack
        recording = (
            ServerErrorMiddleware,
            RunnerTrafficMetricsMiddleware,
            OpenTelemetryMiddleware,
            AccessLogMiddleware,
        )
        while layer is not None:
            layers[type(layer)] = layer
            if self._inner is self.app and not isinstance(layer, recording):
                self._inner = layer  # the first layer below those the lean path records with
            layer = getattr(layer, "app", None)
        unsafe = [
            cls for cls, _ in self.service.middlewares if not getattr(cls, "lean_path_safe", False)
        ]
        if MaxConcurrencyMiddleware in layers or CORSMiddleware in layers or unsafe:
            return {}  # the lean path would skip them
        if TimeoutMiddleware in layers:
            self.timeout = layers[TimeoutMiddleware].timeout
        tracing = layers.get(OpenTelemetryMiddleware)
        metrics = layers.get(RunnerTrafficMetricsMiddleware)
        access = layers.get(AccessLogMiddleware)
        conforming = layers.get(ConformingErrors)

        def untraced(path: str) -> bool:
            return tracing is not None and tracing.excluded_urls.url_disabled(
                f"http://localhost{path}"
            )

        def conformed(app: ASGIApp) -> ASGIApp:
            """The service's ConformingErrors (a copy), around an answer the lean path writes."""
            if conforming is None:
                return app
            clone = copy.copy(conforming)
            clone.app = app
            return clone

        arrivals = _Arrivals(metrics) if metrics is not None else None

        def recorded(app: ASGIApp, path: str) -> ASGIApp:
            """What BentoML's outer layers record of a request: its access log line, its metrics."""
            if access is not None:
                logged = copy.copy(access)
                logged.app = app
                app = logged
            return _Metrics(metrics, path, app, arrivals) if metrics is not None else app

        routes: dict[str, ASGIApp] = {}
        for name, method in self.service.apis.items():
            path = join_paths(self.service.path_prefix, method.route)
            if untraced(path) and hot_api(self.service, name):
                routes[path] = recorded(self._api(_Api(self.service, name), conformed), path)
        for app, mount, _ in self.service.mount_apps:
            for path in _posted_routes(app, mount):
                if untraced(path) and path not in routes:
                    routes[path] = recorded(conformed(self._mounted(app, mount)), path)
        return routes

    # -- an API -------------------------------------------------------------------------------

    def _api(self, api: _Api, conformed: Callable[[ASGIApp], ASGIApp]) -> ASGIApp:
        context = self.service.context

        server = Headers({"Server": f"BentoML Service/{self.service.name}"})

        async def answer(scope: Scope, receive: Any, send: Any) -> None:
            serde, data, body = scope.pop("bundle.parsed")
            # BentoML's context middleware: the API's ctx, for this request.
            with context.in_request(Request(scope, replay(body), send)):
                try:
                    output = await api.call(data, context)
                    response = await api.response(output, serde, context)
                except Exception as exc:
                    response = _refused(scope, exc)
                # BentoML's endpoint wrapper: the Server header, ctx's background tasks.
                _add_headers(response, server)
                if response.background is not None:
                    context.response.background.tasks.append(response.background)
                response.background = context.response.background
                await _send(response, scope, receive, send)

        written = conformed(answer)

        async def handle(scope: Scope, receive: Any, send: Any) -> None:
            serde = self._serde(scope)
            if serde is None:  # not a media type BentoML reads as the lean path does
                await self._inner(scope, receive, send)
                return
            timer = asyncio.timeout_at(self._deadline())
            replied = False

            async def sent(message: dict[str, Any]) -> None:
                nonlocal replied
                if not replied:  # BentoML's timeout ends with the first message sent
                    replied = True
                    timer.reschedule(None)
                await send(message)

            try:
                async with timer:
                    body = await _read(receive)
                    if body is None:
                        return  # the client went before sending its body: no one to answer
                    try:
                        data = api.parse(serde, body, scope)
                    except Exception:  # invalid JSON or fields, a bad pickle: BentoML answers
                        await self._inner(scope, replay(body), sent)
                        return
                    scope["bundle.parsed"] = (serde, data, body)
                    await written(scope, receive, sent)
            except TimeoutError:
                if replied or not timer.expired():
                    raise
                await _send(self._timed_out(), scope, receive, send)

        return handle

    def _serde(self, scope: Scope) -> Serde | None:
        content_type = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
        if is_json(content_type):
            return JSONSerde()
        if media_of(content_type) == PickleSerde.media_type.encode() and not self.is_main:
            return PickleSerde()  # BentoML refuses pickle on the public port; so do we
        return None

    # -- a mounted app --------------------------------------------------------------------------

    def _mounted(self, app: ASGIApp, mount: str) -> ASGIApp:
        root_of_mount = mount.rstrip("/")  # as Starlette's Mount strips it

        async def handle(scope: Scope, receive: Any, send: Any) -> None:
            root = scope.get("root_path", "")
            child = {
                **scope,
                "path_params": {},
                "app_root_path": scope.get("app_root_path", root),
                "root_path": root + root_of_mount,
            }
            timer = asyncio.timeout_at(self._deadline())

            async def sent(message: dict[str, Any]) -> None:
                timer.reschedule(None)  # BentoML's timeout ends with the first message sent
                await send(message)

            try:
                async with timer:
                    await app(child, receive, sent)
            except TimeoutError:
                if not timer.expired():
                    raise
                await _send(self._timed_out(), scope, receive, send)

        return handle

    # -- the traffic timeout --------------------------------------------------------------------

    def _deadline(self) -> float | None:
        if self.timeout is None:
            return None
        return asyncio.get_running_loop().time() + self.timeout

    def _timed_out(self) -> Response:
        """BentoML's timeout middleware's answer (no Server header: it answers outside the API)."""
        message = f"Not able to process the request in {self.timeout} seconds"
        return JSONResponse({"error": message}, status_code=504)


class _Api:
    """One API on the lean path: its request parsed and its function called as BentoML's
    ``api_endpoint`` does."""

    def __init__(self, service: Service, name: str) -> None:
        method = service.apis[name]
        self.func = method.func
        self.spec = method.input_spec
        self.output = method.output_spec
        self.ctx_param = method.ctx_param
        self.root = getattr(self.spec, "__root_input__", False)

    def parse(self, serde: Serde, body: bytes, scope: Scope) -> Any:
        if isinstance(serde, JSONSerde):
            return self.spec.model_validate_json(body or b"{}")
        return serde.deserialize_model(Payload((body,), metadata=Headers(scope=scope)), self.spec)

    async def call(self, data: Any, ctx: Any) -> Any:
        args: tuple[Any, ...] = ()
        kwargs: dict[str, Any] = {}
        if self.root:
            args = (data.root,) if isinstance(data, IORootModel) else (data,)
        else:
            # From the class: on the instance pydantic (2.11+) warns on every request, and V3 drops it.
            kwargs = {k: getattr(data, k) for k in type(data).model_fields}
        if self.ctx_param is not None:
            kwargs[self.ctx_param] = ctx
        # The running instance, read per request as BentoML does (a restarted app has a new one).
        return await self.func(get_current_service(), *args, **kwargs)

    async def response(self, output: Any, serde: Serde, ctx: Any) -> Response:
        """The reply, with ctx's status, headers and cookies when the API takes ctx."""
        if isinstance(output, Response):
            response = output
        else:
            response = await self.output.to_http_response(output, serde)
        if self.ctx_param is not None:
            response.status_code = ctx.response.status_code
            _add_headers(response, ctx.response.metadata)
            set_cookies(response, ctx.response.cookies)
        return response


class _Arrivals:
    """BentoML's last-request time of a service, shared by its hot routes (one series): the latest
    arrival on any of them, written a moment later (serving/tallies.py). BentoML's own path writes
    the same series at once for the requests it answers, so the gauge can step back by up to
    ``FLUSH_S`` when both serve at the same moment: it is a last-request time to within that."""

    def __init__(self, middleware: Any) -> None:
        from bentoml._internal.context import server_context as context

        self.gauge = middleware.metrics_last_request_timestamp.labels(
            service_name=context.bento_name,
            service_version=context.bento_version,
            runner_name=context.service_name,
        )
        self.at: float | None = None  # not yet written
        self.flushes = Flushes(self._write)

    def arrived(self) -> None:
        self.at = time.time()  # as the gauge's set_to_current_time
        self.flushes.soon()

    def _write(self) -> None:
        if self.at is not None:
            self.gauge.set(self.at)
            self.at = None


class _Metrics:
    """BentoML's request metrics for one hot route: the metric objects its middleware created
    (the same series), with their labelled children looked up once instead of per request, and
    each request's observations written with others a moment later (serving/tallies.py)."""

    def __init__(self, middleware: Any, path: str, app: ASGIApp, arrivals: _Arrivals) -> None:
        from bentoml._internal.context import server_context as context

        self.app = app
        self.arrivals = arrivals
        labels = {
            "endpoint": path,
            "service_name": context.bento_name,
            "service_version": context.bento_version,
            "runner_name": context.service_name,
        }
        self.total = lambda status: middleware.metrics_request_total.labels(
            **labels, http_response_code=status
        )
        self.duration = lambda status: middleware.metrics_request_duration.labels(
            **labels, http_response_code=status
        )
        self.in_progress = middleware.metrics_request_in_progress.labels(**labels)
        # Written in bulk a moment later (serving/tallies.py) instead of six writes to the
        # multiprocess files a request: the tokenizer's CPU a chat request at 64 users went
        # 0.321 -> 0.315 ms (python -m loadtests.ab, six rounds: within noise, as the writes'
        # cost predicts; the runner's batch metrics, the same change, were ~9 % of its thread).
        self.by_status: dict[int, tuple[Any, HistogramTally]] = {}
        self.answered: dict[int, int] = {}  # by status, not yet written
        self.live = self.live_written = 0  # requests in progress: now, and as last written
        self.flushes = Flushes(self._write)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        self.arrivals.arrived()
        started = default_timer()
        status = 0

        async def sent(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                if status not in self.by_status:
                    self.by_status[status] = (
                        self.total(status),
                        HistogramTally(self.duration(status)),
                    )
                    self.answered[status] = 0
                self.answered[status] += 1
                self.by_status[status][1].add(max(default_timer() - started, 0))
            await send(message)

        self.live += 1
        self.flushes.soon()
        try:
            await self.app(scope, receive, sent)
        finally:
            self.live -= 1
            self.flushes.soon()

    def _write(self) -> None:
        if self.live != self.live_written:
            self.in_progress.inc(self.live - self.live_written)
            self.live_written = self.live
        for status, (total, duration) in self.by_status.items():
            if self.answered[status]:
                total.inc(self.answered[status])
                self.answered[status] = 0
            duration.flush()


def hot_api(service: Service, name: str) -> bool:
    """Whether an API can take the lean path: a coroutine with a plain body (no files, no
    batching, no task queue, no ``*args``/``**kwargs``)."""
    method = service.apis[name]
    fields = getattr(method.input_spec, "model_fields", {})
    return (
        inspect.iscoroutinefunction(inspect.unwrap(method.func))
        and not method.batchable
        and not method.is_task
        and not getattr(method.input_spec, "multipart_fields", None)
        and ARGS not in fields
        and KWARGS not in fields
    )


def _posted_routes(app: Any, mount: str) -> list[str]:
    """The fixed POST paths of a Starlette app mounted at ``mount`` (no path parameters)."""
    if not isinstance(app, Starlette):
        return []
    return [
        mount.rstrip("/") + route.path
        for route in app.routes
        if isinstance(route, Route)
        and not route.param_convertors
        and "POST" in (route.methods or ())
    ]


async def _send(response: Response, scope: Scope, receive: Any, send: Any) -> None:
    """A response as one start message and one body, then its background tasks."""
    if isinstance(response, IterableResponse):
        body = b"".join(response.body_iterator)
    elif hasattr(response, "body"):
        body = response.body
    else:  # a stream: Starlette sends it
        await response(scope, receive, send)
        return
    start = {"type": "http.response.start", "status": response.status_code}
    await send({**start, "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": body})
    if response.background is not None:
        await response.background()


def _failed(scope: Scope) -> Response:
    log_exception(Request(scope))
    return JSONResponse(_UNEXPECTED, status_code=500)


def _refused(scope: Scope, exc: Exception) -> Response:
    """BentoML's ``api_endpoint_wrapper`` for an exception an API raised."""
    if not isinstance(exc, ValidationError | BentoMLException):
        return _failed(scope)
    log_exception(Request(scope))
    if isinstance(exc, ValidationError):
        data: Any = {
            "error": f"{exc.error_count()} validation error for {exc.title}",
            "detail": exc.errors(include_context=False, include_input=False),
        }
        return JSONResponse(data, status_code=400)
    status = exc.error_code.value
    if status in (401, 403):
        data = {"error": "Authorization error"}
    elif status >= 500:
        data = _UNEXPECTED
    else:
        # A one-element list, as BentoML writes it (its trailing comma makes a tuple): the same
        # body whichever path answers.
        data = ({"error": str(exc)},)
    return JSONResponse(data, status_code=status)


async def _read(receive: Any) -> bytes | None:
    """The whole body, or None if the client went away before sending it."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# Young collections start when the objects made since the last one, less those freed, pass
# this. In a busy worker those are mostly the objects of the requests in flight: the tokenizer
# serving chat at 64 users held ~7,500 and, at CPython's default of 700, ran a young collection
# every few requests (214 in 20 s at ~290 requests/s), each scanning the requests in flight. With
# 50,000 it ran none in 20 s, and the count fell back to ~1,000 when the load stopped: what those
# requests made was freed by reference counting. Cycles that requests do make (an error's
# traceback, say) wait longer for a collection: with it, tests/e2e/test_soak.py (every endpoint
# mixed, 60 s) saw every process's resident memory within +0.6 % after warm-up.
YOUNG_COLLECTION_THRESHOLD = 50_000


def _frozen_at_startup(send: Any) -> Any:
    """The lifespan's ``send``, which, when the app says its start-up is complete, collects what
    start-up left unreachable and freezes the rest (``gc.freeze``): the service instance, its
    models, sessions and tokenizers, BentoML's and the libraries' own. Full collections then scan
    only what was made since. In the tokenizer serving chat at 64 users they had each scanned the
    whole heap (~100 ms a collection, 0.035 ms a request) and took ~0.7 ms after the freeze; all
    collections together, 0.052 -> 0.016 ms a request (gc.callbacks timings). Young collections
    start later too (``YOUNG_COLLECTION_THRESHOLD``)."""

    async def sent(message: dict[str, Any]) -> None:
        if message["type"] == "lifespan.startup.complete":
            gc.collect()  # a cycle frozen unreachable would never be freed
            gc.freeze()
            gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *gc.get_threshold()[1:])
        await send(message)

    return sent


def _add_headers(response: Response, headers: Mapping[str, str]) -> None:
    """``response.headers.update(headers)``, faster in the usual case: Starlette's ``update``
    sets one header at a time, each lower-cased, encoded and looked for in the whole list (five a
    request on the tokenizer: ctx's timing headers, ``Server``). When ``headers`` are Starlette
    ``Headers`` (as ctx's are, unless an API replaced them) with lower-case names, none already
    in the response and none twice, their raw pairs are appended as they are; anything else goes
    to ``update``. ``python -m loadtests.ab HEAD --users 1,64 --rounds 6``: at one client p50 5.91
    -> 5.62 ms and the runner's main thread 0.854 -> 0.803 ms a request, at 64 users the tokenizer
    0.267 -> 0.264: the same direction everywhere, each within the runs' noise."""
    raw = headers.raw if isinstance(headers, Headers) else None
    if raw is not None:
        names = {name for name, _ in raw}
        if (
            len(names) == len(raw)
            and all(name == name.lower() for name in names)
            and not any(name in names for name, _ in response.raw_headers)
        ):
            response.raw_headers.extend(raw)
            return
    response.headers.update(headers)


def _flushed_at_shutdown(send: Any) -> Any:
    """The lifespan's ``send``, which, when the app says its shutdown is over (complete or
    failed), makes the metric writes still pending (serving/tallies.py): the last requests' are
    not lost."""

    async def sent(message: dict[str, Any]) -> None:
        if message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            flush_all()
        await send(message)

    return sent


def media_of(content_type: bytes) -> bytes:
    """A Content-Type header's media type: lower case, without its parameters."""
    return content_type.split(b";")[0].strip().lower()


def is_json(content_type: bytes) -> bool:
    """Whether a Content-Type header names JSON (``application/json`` or any ``+json`` type)."""
    media = media_of(content_type)
    return media == b"application/json" or media.endswith(b"+json")


def replay(body: bytes) -> Any:
    """An ASGI receive that hands over ``body`` once (it was read already), then a disconnect."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive
