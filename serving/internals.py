"""Every private BentoML and Starlette symbol the project touches, in one module, each with why.

BentoML 1.4 has no public hook for what the lean path (serving/hot_path.py) and the tokenizer's
runner hop (services/tokenizer/hop.py, clients.py) do: answer a request with BentoML's own parsing,
metrics and error mapping but without its per-request layers, and call a runner with BentoML's wire
format on a leaner connection. So they use BentoML's objects, and reach them through this module
only. When an upgrade moves a module or renames an attribute, the import or the accessor here
fails; ``lean_path_problem`` and ``lean_client_problem`` name what failed, and the callers take
BentoML's public path instead, logging one warning. A private symbol is never the reason a request
fails.

``WRITTEN_FOR`` lists the BentoML versions these were read against. On any other version the lean
path and the lean client stay off unless a service's ``lean_path`` setting says ``on``;
``make test-load`` runs the differential tests (the lean path against BentoML's own) on the newest
BentoML of the package index, so a new release is checked before users meet it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bentoml

logger = logging.getLogger("bento_bundle.internals")

# The BentoML releases whose private objects this module was read against and tested with.
WRITTEN_FOR = frozenset({"1.4.39", "1.4.40"})


def _problem(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# -- the lean path (serving side) -----------------------------------------------------------------

try:
    # BentoML's request and reply codecs: the lean path reads a body (JSON; pickle between services)
    # and writes an API's output exactly as BentoML's endpoint does.
    from _bentoml_impl.serde import JSONSerde, Payload, PickleSerde, Serde

    # The context layer of BentoML's stack: the lean path sets the API's ctx as it does
    # (``ServiceContext.in_request``), and must recognise it among the layers it replaces.
    from _bentoml_impl.server.app import ContextMiddleware

    # What an API's input model is made of: ``*args``/``**kwargs`` APIs keep BentoML's path, a
    # root-input API gets its body as one argument, a streamed output is sent whole.
    from _bentoml_sdk.io_models import ARGS, KWARGS, IORootModel, IterableResponse

    # The labels BentoML puts on its request metrics (bento name and version, service name): the
    # lean path writes the same series.
    from bentoml._internal.context import server_context

    # BentoML's own layers, recognised in its middleware stack: the ones the lean path does the
    # work of (access log, request metrics, timeout) and the ones it cannot skip (concurrency).
    from bentoml._internal.server.http.access import AccessLogMiddleware
    from bentoml._internal.server.http.instruments import RunnerTrafficMetricsMiddleware
    from bentoml._internal.server.http.traffic import MaxConcurrencyMiddleware, TimeoutMiddleware

    # How BentoML logs an API's exception and sets ctx's cookies: the lean path does the same.
    from bentoml._internal.server.http_app import log_exception
    from bentoml._internal.utils.http import set_cookies

    # How BentoML joins a service's path prefix and an API's route.
    from bentoml._internal.utils.uri import join_paths
except (ImportError, AttributeError) as exc:  # a module moved or a name went: BentoML's path
    _LEAN_IMPORT: str | None = _problem(exc)
else:
    _LEAN_IMPORT = None

# -- the lean client (the tokenizer's calls to the runners) ---------------------------------------

try:
    # BentoML's pickle codec between services: the lean client writes calls and reads answers in
    # BentoML's wire format, so a runner reads them as any BentoML client's.
    from _bentoml_impl.serde import Payload, PickleSerde

    # A ``file://`` dependency address as a socket path: where the lean client connects in the
    # development graph, as BentoML's own session does.
    from bentoml._internal.utils.uri import uri_to_path
except (ImportError, AttributeError) as exc:
    _CLIENT_IMPORT: str | None = _problem(exc)
else:
    _CLIENT_IMPORT = None


def version_known() -> bool:
    return bentoml.__version__ in WRITTEN_FOR


def _version_problem() -> str:
    return (
        f"BentoML {bentoml.__version__} is not a version this code was written against "
        f"({', '.join(sorted(WRITTEN_FOR))}); set lean_path=on to use it anyway"
    )


def lean_path_problem(mode: str = "auto") -> str | None:
    """Why the lean path cannot run here, or None. ``mode``: a service's ``lean_path`` setting
    (``auto``: only on a known BentoML; ``on``: on any version whose objects import; ``off``)."""
    if mode == "off":
        return "turned off by the lean_path setting"
    if _LEAN_IMPORT is not None:
        return _LEAN_IMPORT
    if mode != "on" and not version_known():
        return _version_problem()
    return None


def lean_client_problem(mode: str = "auto") -> str | None:
    """Why the tokenizer's lean runner client cannot run here, or None. ``mode``: the tokenizer's
    ``lean_path`` setting, as for the lean path, but ``off`` leaves the client on: that setting
    measures the lean path alone."""
    if _CLIENT_IMPORT is not None:
        return _CLIENT_IMPORT
    if mode == "auto" and not version_known():
        return _version_problem()
    return None


_warned: set[str] = set()


def warn_once(what: str, problem: str) -> None:
    """One warning per process for each fallback: what falls back, and what it met."""
    key = f"{what}: {problem}"
    if key not in _warned:
        _warned.add(key)
        logger.warning("%s takes BentoML's own path: %s", what, problem)


# -- BentoML's service objects, read by the lean path ---------------------------------------------


@dataclass(frozen=True)
class ApiParts:
    """What the lean path needs of one ``@bentoml.api`` method (BentoML's ``APIMethod``)."""

    func: Callable[..., Any]
    route: str
    input_spec: Any
    output_spec: Any
    ctx_param: str | None
    batchable: bool
    is_task: bool
    multipart: bool
    root_input: bool
    star_args: bool  # takes *args or **kwargs


def api_parts(method: Any) -> ApiParts:
    """The parts of an API method; raises AttributeError when BentoML renamed one."""
    spec = method.input_spec
    fields = spec.model_fields
    return ApiParts(
        func=method.func,
        route=method.route,
        input_spec=spec,
        output_spec=method.output_spec,
        ctx_param=method.ctx_param,
        batchable=method.batchable,
        is_task=method.is_task,
        multipart=bool(getattr(spec, "multipart_fields", None)),
        root_input=bool(getattr(spec, "__root_input__", False)),
        star_args=ARGS in fields or KWARGS in fields,
    )


def started_layers(app: Any) -> list[Any] | None:
    """The layers of a started Starlette app, outermost first, down to its router; None before
    start-up (Starlette builds its middleware stack then)."""
    layer = getattr(app, "middleware_stack", None)
    if layer is None:
        return None
    from starlette.routing import Router

    layers = []
    while layer is not None and not isinstance(layer, Router):
        layers.append(layer)
        layer = layer.app  # every Starlette and BentoML middleware keeps the next layer here
    return layers


def url_excluded(tracing: Any, url: str) -> bool:
    """Whether OpenTelemetry's ASGI middleware skips ``url`` (its exclusion list)."""
    return bool(tracing.excluded_urls.url_disabled(url))


def timeout_of(layer: Any) -> float:
    """BentoML's traffic timeout, in seconds, as configured (its 504 prints it as it is)."""
    timeout: float = layer.timeout
    return timeout


def request_metrics(layer: Any) -> tuple[Any, Any, Any, Any]:
    """BentoML's request metric objects, as its metrics middleware made them: requests total,
    duration, in progress, last request time."""
    return (
        layer.metrics_request_total,
        layer.metrics_request_duration,
        layer.metrics_request_in_progress,
        layer.metrics_last_request_timestamp,
    )


def metric_labels() -> dict[str, str]:
    """The labels BentoML's request metrics carry for this service."""
    return {
        "service_name": str(server_context.bento_name),
        "service_version": str(server_context.bento_version),
        "runner_name": str(server_context.service_name),
    }


def request_context(context: Any) -> Callable[[Any], Any]:
    """BentoML's ``ServiceContext.in_request``: a context manager that makes a request the one an
    API's ctx describes, as BentoML's context middleware does."""
    in_request: Callable[[Any], Any] = context.in_request
    return in_request


def check_context(context: Any) -> None:
    """Raise AttributeError unless an API's ctx has what the lean path reads of it (checked when
    it builds its routes: ctx's response exists only during a request)."""
    response = type(context).ResponseContext()
    for name in ("status_code", "metadata", "cookies", "background"):
        getattr(response, name)
    request_context(context)


def context_response(ctx: Any) -> tuple[Any, Any, Any]:
    """An API ctx's response status code, headers and cookies, as BentoML's endpoint reads them."""
    response = ctx.response
    return response.status_code, response.metadata, response.cookies


# -- BentoML's client, read by the lean client ----------------------------------------------------


@dataclass(frozen=True)
class ClientTarget:
    """Where and how BentoML's client for a dependency sends its calls."""

    url: Any  # urllib's parsed URL
    in_process: bool  # an ASGI app in this process, not a server
    headers: dict[str, str]
    timeout: float | None
    max_age: float
    max_requests: int


def client_target(client: Any) -> ClientTarget:
    """What BentoML's client (``bentoml.depends(...).to_async``) was configured with: its
    session manager's address, default headers, timeout and refresh limits."""
    manager = client._session_manager
    return ClientTarget(
        url=manager._parsed_url,
        in_process=manager._app is not None,
        headers={k: v for k, v in manager._headers.items() if v is not None},
        timeout=manager._timeout.total,
        max_age=manager.max_age,
        max_requests=manager.max_requests,
    )


def socket_path(url: str) -> str:
    return str(uri_to_path(url))


def endpoint_route(client: Any, api: str) -> str:
    """The route BentoML's client posts an API to."""
    return str(client.endpoints[api].route)


def call_with_headers(
    client: Any, api: str, kwargs: dict[str, Any], headers: dict[str, str]
) -> Any:
    """BentoML's client calling ``api`` with extra request headers: its public call takes none.
    Falls back to the public call, without the headers, when the private one is gone."""
    private = getattr(client, "_call", None)
    endpoints = getattr(client, "endpoints", None)
    if private is None or endpoints is None or api not in endpoints:
        warn_once("calls with headers", "BentoML's client has no _call; headers not sent")
        return getattr(client, api)(**kwargs)
    return private(endpoints[api], (), kwargs, headers=headers)


# -- resources and paths --------------------------------------------------------------------------


def system_cpus() -> float:
    """Cores this process may use, cgroup CPU quotas honoured (containers, Kubernetes limits), as
    BentoML's resource probe reads them; without it, the CPUs this process may run on."""
    try:
        from bentoml._internal.resource import system_resources

        return float(system_resources()["cpu"])
    except (ImportError, AttributeError, KeyError) as exc:
        warn_once("the cores probe", _problem(exc))
        return float(len(os.sched_getaffinity(0)))


def bentoml_home() -> Path:
    """BentoML's home directory (its model store lives here), as BentoML resolves it."""
    try:
        from bentoml._internal.configuration.containers import BentoMLContainer

        return Path(BentoMLContainer.bentoml_home.get())
    except (ImportError, AttributeError) as exc:
        warn_once("BentoML's home", _problem(exc))
        return Path(os.environ.get("BENTOML_HOME") or Path.home() / "bentoml")


def known_layer_types() -> Iterator[type]:
    """BentoML's and Starlette's own layers the lean path knows (what each does is in
    serving/hot_path.py)."""
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    from starlette.middleware.errors import ServerErrorMiddleware
    from starlette.middleware.exceptions import ExceptionMiddleware

    yield from (
        ServerErrorMiddleware,
        RunnerTrafficMetricsMiddleware,
        OpenTelemetryMiddleware,
        AccessLogMiddleware,
        TimeoutMiddleware,
        MaxConcurrencyMiddleware,
        ContextMiddleware,
        ExceptionMiddleware,
    )


__all__ = [
    "AccessLogMiddleware",
    "ContextMiddleware",
    "IORootModel",
    "IterableResponse",
    "JSONSerde",
    "MaxConcurrencyMiddleware",
    "Payload",
    "PickleSerde",
    "RunnerTrafficMetricsMiddleware",
    "Serde",
    "TimeoutMiddleware",
    "join_paths",
    "log_exception",
    "set_cookies",
]
