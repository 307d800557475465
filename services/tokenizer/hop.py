"""The tokenizer's hot calls to a runner, on a lean HTTP/1.1 client (httptools, the parser uvicorn
itself uses) instead of BentoML's aiohttp session.

Why not BentoML's session, as it comes:
- Cost: at one client the tokenizer makes one runner call a request, and aiohttp's request
  machinery costs its one thread far more than this client, which writes the request in one go and
  reads the answer with httptools' C parser (docs/decisions/0012-runner-hop.md).
- Its refresh cuts calls in flight: BentoML's ``SessionManager`` replaces the session after
  ``max_requests`` calls (counted over all its connections) or ``max_age`` seconds, and closes the
  old one, and aiohttp's ``close`` closes the connections still waiting for an answer too: calls the
  runner has read fail, and are sent again. In the graph the runners' config turns the refresh off
  (``runner_connection`` in runners/settings.py); for a runner reached by URL (one container each)
  BentoML has no config to read, so its defaults apply: 100 calls or 300 s. Here each connection
  retires after that many calls or seconds of its own, and only once it is idle, so every call
  reaches the runner once (tests/unit/test_hop.py). (Retiring connections matters where a balancer
  picks a replica per connection, a Kubernetes Service; HAProxy, in http mode, picks per request.)

The addressing, limits and timeout are BentoML's own for the dependency (``hop_for``); a runner
on https, behind a URL with a path, or served in-process keeps BentoML's session. Only the hot
calls use it: the tenant registry's calls (rare, with files) stay on BentoML's client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httptools

from serving import internals


class Unreachable(ConnectionError):
    """No connection could be opened: nothing listens there, or the name does not resolve (a
    runner service with no replica, reached without a proxy). The call never left."""


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]  # names lower-cased
    body: bytes


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one call at a time, its answer read by httptools."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.opened = time.monotonic()
        self.calls = 0
        self.lost = False
        self.keep_alive = True
        self._answer: asyncio.Future[Reply] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []

    # asyncio's side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._fail(ConnectionError(f"unreadable answer from the runner: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        # The runner closed it: while idle (a keep-alive timeout, a restart) it is dropped before
        # reuse; during a call, the call fails as a dead connection (retried once by the caller).
        self.lost = True
        self._fail(ConnectionResetError("the runner closed the connection"))

    # httptools' side
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            self._headers, self._body = {}, []
            return
        # Asked here: the parser forgets the answer's keep-alive once it has returned.
        self.keep_alive = self.parser.should_keep_alive()
        reply = Reply(status, self._headers, b"".join(self._body))
        self._headers, self._body = {}, []
        if self._answer is not None and not self._answer.done():
            self._answer.set_result(reply)

    # the pool's side
    async def call(self, request: list[bytes]) -> Reply:
        assert self.transport is not None
        self._answer = asyncio.get_running_loop().create_future()
        self.calls += 1
        self.transport.writelines(request)
        try:
            return await self._answer
        finally:
            self._answer = None

    def reusable(self, max_age: float, max_requests: int) -> bool:
        return (
            not self.lost
            and self.keep_alive
            and self.calls < max_requests
            and time.monotonic() - self.opened < max_age
        )

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: Exception) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(exc)


class HopClient:
    """POSTs to one runner over a pool of keep-alive connections (a Unix socket or host:port).

    Each call takes an idle connection or opens one, and gives it back when the answer is read
    whole; a call that fails, times out or is cancelled closes its connection (an answer may still
    be on its way). A connection retires after ``max_requests`` calls or ``max_age`` seconds, once
    idle. Errors: ``Unreachable`` when no connection opens, ``ConnectionError`` when the runner
    drops one, ``TimeoutError`` after ``timeout`` seconds, waiting for a free connection and
    connecting included (as aiohttp's total timeout).
    """

    def __init__(
        self,
        *,
        unix_path: str | None = None,
        host: str = "127.0.0.1",
        port: int = 80,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = 60.0,
        max_age: float = 300.0,
        max_requests: int = 100,
        max_connections: int = 100,
    ) -> None:
        self.unix_path, self.host, self.port = unix_path, host, port
        self.timeout, self.max_age, self.max_requests = timeout, max_age, max_requests
        self.opened = 0  # connections opened so far (tests and diagnostics)
        self._idle: list[_Connection] = []
        # At most this many calls in flight on this pool, as aiohttp's default limit per session.
        self._slots = asyncio.Semaphore(max_connections)
        # BentoML's server answers on a Unix socket whatever the Host; it sends the same one.
        authority = "127.0.0.1:3000" if unix_path else f"{host}:{port}"
        fixed = {"host": authority, **(headers or {})}
        self._fixed = "".join(f"{name}: {value}\r\n" for name, value in fixed.items())

    async def post(self, route: str, body: bytes, headers: Mapping[str, str]) -> Reply:
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        head = f"POST {route} HTTP/1.1\r\n{self._fixed}{extra}content-length: {len(body)}\r\n\r\n"
        async with asyncio.timeout(self.timeout), self._slots:
            connection = self._take()
            try:
                if connection is None:
                    connection = await self._open()
                reply = await connection.call([head.encode("latin-1"), body])
            except BaseException:
                if connection is not None:
                    connection.close()
                raise
            if connection.reusable(self.max_age, self.max_requests):
                self._idle.append(connection)
            else:
                connection.close()
            return reply

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()

    def _take(self) -> _Connection | None:
        # The most recently used first: the one least likely to have hit the runner's idle timeout.
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable(self.max_age, self.max_requests):
                return connection
            connection.close()
        return None

    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            if self.unix_path:
                _, connection = await loop.create_unix_connection(_Connection, self.unix_path)
            else:
                _, connection = await loop.create_connection(_Connection, self.host, self.port)
        except OSError as exc:  # refused, no such socket, unreachable host, a name unresolved
            where = self.unix_path or f"{self.host}:{self.port}"
            raise Unreachable(f"cannot reach the runner at {where}: {exc}") from exc
        self.opened += 1
        return connection


def hop_for(client: Any, mode: str = "auto") -> HopClient | None:
    """A HopClient to where BentoML's client (``bentoml.depends(...).to_async``) sends its calls,
    with its timeout, refresh limits and default headers; None where it keeps BentoML's own client
    (https, a URL with a path, an in-process app, or a BentoML whose client it does not know, with
    one warning: serving/internals.py). ``mode``: the tokenizer's ``lean_path`` setting.
    tests/unit/test_hop.py pins the fields read."""
    problem = internals.lean_client_problem(mode)
    if problem is None:
        try:
            target = internals.client_target(client)
        except AttributeError as exc:
            problem = f"{type(exc).__name__}: {exc}"
    if problem is not None:
        internals.warn_once("the tokenizer's runner calls", problem)
        return None
    if target.in_process:
        return None
    url = target.url
    limits: dict[str, Any] = {
        "headers": target.headers,
        "timeout": target.timeout,
        "max_age": target.max_age,
        "max_requests": target.max_requests,
    }
    if url.scheme == "file":  # a runner in the same graph, on its Unix socket
        return HopClient(unix_path=internals.socket_path(url.geturl()), **limits)
    if url.scheme == "tcp" or (url.scheme == "http" and url.path in ("", "/")):
        parts = urlsplit(f"http://{url.netloc}")
        return HopClient(host=parts.hostname or "127.0.0.1", port=parts.port or 80, **limits)
    return None
