"""What every service's settings share: the cores it may use and the limits of its queue.

Each service has one settings object (``RunnerSettings`` subclasses, ``TokenizerSettings``) with its
own environment prefix; the queue limits are declared here once, so their defaults live in one place.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings


def available_cores() -> int:
    """Cores this process may use, honouring cgroup CPU quotas (containers, Kubernetes limits)."""
    # BentoML's resource probe reads cgroup v1/v2 quotas; os.cpu_count() would see the whole host.
    from serving.internals import system_cpus

    return max(1, int(system_cpus()))


class QueueSettings(BaseSettings):
    """Admission limits of a token-budget queue (serving/batching/queue.py)."""

    max_queue_tokens: int = Field(
        131072,
        ge=1,
        description="Tokens allowed to wait per queue; beyond this requests get 429 with Retry-After. "
        "Sized to a little less than deadline_s of work for a small CPU instance: scale it with "
        "the instance's speed.",
    )
    deadline_s: float = Field(
        10.0,
        gt=0,
        description="Time a request may take from admission to its answer (queue + engine); one that "
        "cannot make it at the measured speed gets 503 with Retry-After at once.",
    )


class ServiceSettings(QueueSettings):
    """What every service's settings have: its queue limits and whether its hot routes are traced."""

    trace_requests: bool = Field(
        False,
        description="OpenTelemetry spans for every request on the hot routes (the APIs). Off: those "
        "routes are excluded from tracing, and those that are fixed POST routes are answered on the "
        "lean path (serving/hot_path.py): no span, no X-BentoML-Request-ID header; probes, docs "
        "and metrics stay traced. On: they go through BentoML's own path, which records a span "
        "per request and per ASGI message even when nothing samples them.",
    )
    lean_path: Literal["auto", "on", "off"] = Field(
        "auto",
        description="The lean path (serving/hot_path.py) in front of BentoML's app, answering the "
        "untraced hot routes. auto: on where the installed BentoML is a version it was written "
        "against, BentoML's own path otherwise; on: on any BentoML whose private objects it finds "
        "(it still falls back, with a warning, on what it does not know); off: BentoML's own path "
        "for every request.",
    )

    def service_class(self) -> type:
        """The ``service_class`` for ``@bentoml.service``: a service that puts the lean path in
        front as ``lean_path`` says."""
        from serving.hot_path import lean_service

        return lean_service(self.lean_path)

    def tracing(self, hot_routes: Iterable[str]) -> dict[str, Any]:
        """The ``@bentoml.service(tracing=...)`` config: the hot routes excluded unless traced.

        OpenTelemetry searches each pattern in ``scheme://host/path``; anchored, a route matches
        itself only (``/embed`` must not exclude ``/embed_x``). ``{name}`` path parameters match one
        path segment."""
        if self.trace_requests:
            return {}
        patterns = [
            "^[a-z]+://[^/]+" + re.sub(r"\\\{[^/]*?\\\}", "[^/]+", re.escape(route)) + "$"
            for route in hot_routes
        ]
        return {"excluded_urls": patterns}
