"""The lean path of a service's hot routes: BentoML's answer, without BentoML's per-request layers.

BentoML 1.4.39 sends every request through ten layers before an API runs: Starlette's error
middleware, its metrics middleware, OpenTelemetry's (which rebuilds the URL to test its exclusion
list even for excluded routes), the access log, a timeout middleware that starts a task per request,
the service's own middlewares, a context middleware, Starlette's exception middleware and router,
and an endpoint wrapper that calls ``inspect.signature`` per request. For a one-sentence request
that machinery is a large share of the tokenizer's CPU
(docs/decisions/0015-lean-path-and-upgrades.md).

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

Installed by an upstream-style override: ``bentoml.service(service_class=lean_service(mode))`` (a
parameter of BentoML's own decorator) whose ``to_asgi`` — what every ``bentoml serve`` and
``start-http-server`` worker calls — returns ``HotPath(app)``. ``tests/unit/test_hot_path.py`` pins
that both paths answer alike.

Everything private it touches is reached through serving/internals.py. It falls back to BentoML's
own path, with one warning naming what it met, whenever that is not what it was written for: a
BentoML version it does not know (unless ``lean_path`` is ``on``), a private module that does not
import, an attribute it cannot read when it builds its routes, or a layer in BentoML's stack that it
does not know. ``lean_path=off`` turns it off outright.
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

from bentoml import Service, get_current_service
from bentoml.exceptions import BentoMLException
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from serving import internals
from serving.error_bodies import ConformingErrors
from serving.tallies import Flushes, HistogramTally, flush_all

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]
_UNEXPECTED = {"error": "An unexpected error has occurred, please check the server log."}


class HotPathService(Service):
    """A BentoML service whose workers put ``HotPath`` in front of the app BentoML builds.
    ``lean_path``: the service's setting (``auto``, ``on``, ``off``; serving/settings.py)."""

    lean_path = "auto"

    def to_asgi(self, is_main: bool = True) -> ASGIApp:
        app = super().to_asgi(is_main)
        problem = internals.lean_path_problem(self.lean_path)
        if problem is not None:
            if self.lean_path != "off":
                internals.warn_once(f"the lean path of {self.name}", problem)
            return app
        return HotPath(app, self, is_main=is_main)


def lean_service(mode: str) -> type[HotPathService]:
    """The ``service_class`` for ``@bentoml.service``: ``HotPathService`` with ``mode`` as its
    ``lean_path``."""
    return type("HotPathService", (HotPathService,), {"lean_path": mode})


class UnknownStack(Exception):
    """BentoML's middleware stack holds a layer the lean path does not know."""


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
        if scope["type"] == "http" and self._routes is None:
            # Built at the first request of any kind (a readiness probe, say), so that the first
            # request to a hot route does not wait for the build.
            self.routes()

    def routes(self) -> dict[str, ASGIApp]:
        """Path -> its lean handler. Built at the first request (a hot POST, or just after any
        other): the lean path takes its settings from BentoML's middlewares, built by then. Empty: BentoML's path only,
        which is also what anything unexpected while building gives (one warning names it)."""
        if self._routes is None:
            layers = internals.started_layers(self.app)
            if layers is None:
                return {}  # not started: BentoML's path, and look again next time
            try:
                self._routes = self._build(layers)
            except Exception as exc:  # BentoML is not what this was written for
                internals.warn_once(
                    f"the lean path of {self.service.name}", f"{type(exc).__name__}: {exc}"
                )
                self._inner = self.app
                self._routes = {}
        return self._routes

    def _build(self, stack: list[Any]) -> dict[str, ASGIApp]:
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
        from starlette.middleware.cors import CORSMiddleware
        from starlette.middleware.errors import ServerErrorMiddleware

        # The service's own middlewares, each declaring whether the lean path leaves its answers
        # unchanged; BentoML's and Starlette's layers the lean path knows; anything else is new.
        own = {cls: getattr(cls, "lean_path_safe", False) for cls, _ in self.service.middlewares}
        known = set(internals.known_layer_types())
        unknown = [t for t in map(type, stack) if t not in own and t not in known]
        if unknown and unknown != [CORSMiddleware]:
            names = ", ".join(f"{t.__module__}.{t.__qualname__}" for t in unknown)
            raise UnknownStack(f"unknown layer(s) in BentoML's middleware stack: {names}")
        layers = {type(layer): layer for layer in stack}
        recording = (
            ServerErrorMiddleware,
            internals.RunnerTrafficMetricsMiddleware,
            OpenTelemetryMiddleware,
            internals.AccessLogMiddleware,
        )
        inner = next((layer for layer in stack if not isinstance(layer, recording)), self.app)
        if (
            internals.MaxConcurrencyMiddleware in layers
            or CORSMiddleware in layers
            or not all(own.values())
        ):
            return {}  # the lean path would skip them
        timeout = layers.get(internals.TimeoutMiddleware)
        tracing = layers.get(OpenTelemetryMiddleware)
        metrics = layers.get(internals.RunnerTrafficMetricsMiddleware)
        access = layers.get(internals.AccessLogMiddleware)
        conforming = layers.get(ConformingErrors)

        def untraced(path: str) -> bool:
            return tracing is not None and internals.url_excluded(
                tracing, f"http://localhost{path}"
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
            if metrics is None or arrivals is None:
                return app
            return _Metrics(metrics, path, app, arrivals)

        # Everything BentoML's objects are read for is read here, before any request: a renamed
        # attribute falls back now, not on a user's request.
        internals.check_context(self.service.context)
        routes: dict[str, ASGIApp] = {}
        for method in self.service.apis.values():
            parts = internals.api_parts(method)
            path = internals.join_paths(self.service.path_prefix, parts.route)
            if untraced(path) and hot_api(parts):
                routes[path] = recorded(self._api(_Api(parts), conformed), path)
        for app, mount, _ in self.service.mount_apps:
            for path in _posted_routes(app, mount):
                if untraced(path) and path not in routes:
                    routes[path] = recorded(conformed(self._mounted(app, mount)), path)
        self.timeout = internals.timeout_of(timeout) if timeout is not None else None
        self._inner = inner
        return routes

    # -- an API -------------------------------------------------------------------------------

    def _api(self, api: _Api, conformed: Callable[[ASGIApp], ASGIApp]) -> ASGIApp:
        context = self.service.context
        in_request = internals.request_context(context)
        server = Headers({"Server": f"BentoML Service/{self.service.name}"})

        async def answer(scope: Scope, receive: Any, send: Any) -> None:
            serde, data, body = scope.pop("bundle.parsed")
            # BentoML's context middleware: the API's ctx, for this request.
            with in_request(Request(scope, replay(body), send)):
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

    def _serde(self, scope: Scope) -> Any:
        content_type = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
        if is_json(content_type):
            return internals.JSONSerde()
        pickled = internals.PickleSerde.media_type.encode()
        if media_of(content_type) == pickled and not self.is_main:
            return internals.PickleSerde()  # BentoML refuses pickle on the public port; so do we
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

    def __init__(self, parts: internals.ApiParts) -> None:
        self.func = parts.func
        self.spec = parts.input_spec
        self.output = parts.output_spec
        self.ctx_param = parts.ctx_param
        self.root = parts.root_input

    def parse(self, serde: Any, body: bytes, scope: Scope) -> Any:
        if isinstance(serde, internals.JSONSerde):
            return self.spec.model_validate_json(body or b"{}")
        payload = internals.Payload((body,), metadata=Headers(scope=scope))
        return serde.deserialize_model(payload, self.spec)

    async def call(self, data: Any, ctx: Any) -> Any:
        args: tuple[Any, ...] = ()
        kwargs: dict[str, Any] = {}
        if self.root:
            args = (data.root,) if isinstance(data, internals.IORootModel) else (data,)
        else:
            # From the class: on the instance pydantic (2.11+) warns on every request, and V3 drops it.
            kwargs = {k: getattr(data, k) for k in type(data).model_fields}
        if self.ctx_param is not None:
            kwargs[self.ctx_param] = ctx
        # The running instance, read per request as BentoML does (a restarted app has a new one).
        return await self.func(get_current_service(), *args, **kwargs)

    async def response(self, output: Any, serde: Any, ctx: Any) -> Response:
        """The reply, with ctx's status, headers and cookies when the API takes ctx."""
        if isinstance(output, Response):
            response = output
        else:
            response = await self.output.to_http_response(output, serde)
        if self.ctx_param is not None:
            status, headers, cookies = internals.context_response(ctx)
            response.status_code = status
            _add_headers(response, headers)
            internals.set_cookies(response, cookies)
        return response


class _Arrivals:
    """BentoML's last-request time of a service, shared by its hot routes (one series): the latest
    arrival on any of them, written a moment later (serving/tallies.py). BentoML's own path writes
    the same series at once for the requests it answers, so the gauge can step back by up to
    ``FLUSH_S`` when both serve at the same moment: it is a last-request time to within that."""

    def __init__(self, middleware: Any) -> None:
        last_request = internals.request_metrics(middleware)[3]
        self.gauge = last_request.labels(**internals.metric_labels())
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
        self.app = app
        self.arrivals = arrivals
        labels = {"endpoint": path, **internals.metric_labels()}
        total, duration, in_progress, _ = internals.request_metrics(middleware)
        self.total = lambda status: total.labels(**labels, http_response_code=status)
        self.duration = lambda status: duration.labels(**labels, http_response_code=status)
        self.in_progress = in_progress.labels(**labels)
        # Written in bulk a moment later (serving/tallies.py) instead of six writes to the
        # multiprocess files a request, as the runner's batch metrics are
        # (docs/decisions/0006-metrics-tallies.md).
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


def hot_api(parts: internals.ApiParts) -> bool:
    """Whether an API can take the lean path: a coroutine with a plain body (no files, no
    batching, no task queue, no ``*args``/``**kwargs``)."""
    return (
        inspect.iscoroutinefunction(inspect.unwrap(parts.func))
        and not parts.batchable
        and not parts.is_task
        and not parts.multipart
        and not parts.star_args
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
    body: bytes | memoryview
    if isinstance(response, internals.IterableResponse):
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
    internals.log_exception(Request(scope))
    return JSONResponse(_UNEXPECTED, status_code=500)


def _refused(scope: Scope, exc: Exception) -> Response:
    """BentoML's ``api_endpoint_wrapper`` for an exception an API raised."""
    if not isinstance(exc, ValidationError | BentoMLException):
        return _failed(scope)
    internals.log_exception(Request(scope))
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
# this. In a busy worker those are mostly the objects of the requests in flight, several times
# CPython's default of 700: at that default a young collection ran every few requests, each
# scanning the requests in flight. What requests make is freed by reference counting; the cycles
# they do make (an error's traceback, say) wait longer for a collection, and the soak test checks
# that no process's memory grows (docs/decisions/0008-gc-at-start-up.md).
YOUNG_COLLECTION_THRESHOLD = 50_000


def _frozen_at_startup(send: Any) -> Any:
    """The lifespan's ``send``, which, when the app says its start-up is complete, collects what
    start-up left unreachable and freezes the rest (``gc.freeze``): the service instance, its
    models, sessions and tokenizers, BentoML's and the libraries' own. Full collections then scan
    only what was made since, where each had scanned the whole heap. Young collections start later
    too (``YOUNG_COLLECTION_THRESHOLD``)."""

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
    to ``update`` (docs/decisions/0007-per-request-trims.md)."""
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
