"""The tokenizer's lean hop client (services/tokenizer/hop.py) against real sockets: uvicorn serving
on a Unix socket as a runner in the graph does, and raw servers that drop or never answer."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from _bentoml_impl.client import RemoteProxy
from _bentoml_impl.client.proxy2 import SessionManager
from bentoml._internal.utils.uri import path_to_uri
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.tokenizer.clients import PICKLE, OnnxRunnerClient, RunnerUnavailable
from services.tokenizer.hop import HopClient, hop_for
from tests.unit.live_server import serving


@pytest.fixture
def sock() -> Iterator[str]:
    # A short directory: a Unix socket's path must fit in 108 bytes.
    with tempfile.TemporaryDirectory(prefix="hop") as tmp:
        yield str(Path(tmp) / "runner.sock")


def echo_app(delay_s: float, seen: list[bytes]) -> Starlette:
    """A runner that takes ``delay_s`` to answer each call with its body (and records it)."""

    async def echo(request: Request) -> Response:
        body = await request.body()
        seen.append(body)
        await asyncio.sleep(delay_s)
        return Response(body, headers={"x-seen": request.headers.get("x-tag", "")})

    return Starlette(routes=[Route("/echo", echo, methods=["POST"])])


async def workers(post: Any, count: int, calls: int) -> list[Any]:
    """``count`` callers, each making ``calls`` calls one after another (bodies 'w.k'), started 3 ms
    apart so that calls are in flight whenever one starts (as the tokenizer's calls are)."""

    async def worker(w: int) -> list[Any]:
        await asyncio.sleep(w * 0.003)
        return [await post(f"{w}.{k}".encode()) for k in range(calls)]

    return [r for rs in await asyncio.gather(*(worker(w) for w in range(count))) for r in rs]


def test_every_call_reaches_the_runner_once_while_connections_retire(sock: str) -> None:
    """Connections retire after BentoML's ``max_requests`` (here 3), but only once idle: 8 callers x
    5 calls are 40 answers and 40 requests read. BentoML's own session, refreshed at the same limit,
    closes the connections still waiting for an answer: calls fail after the runner has read them,
    and a caller that resends them makes the runner compute them twice (why hop.py exists)."""
    ours: list[bytes] = []
    with serving(echo_app(0.02, ours), uds=sock):

        async def lean() -> tuple[list[Any], int]:
            hop = HopClient(unix_path=sock, max_requests=3)
            replies = await workers(lambda body: hop.post("/echo", body, {"x-tag": "t"}), 8, 5)
            hop.close()
            return replies, hop.opened

        replies, opened = asyncio.run(lean())
    sent = sorted(f"{w}.{k}".encode() for w in range(8) for k in range(5))
    assert sorted(ours) == sent  # each call read once
    assert [r.status for r in replies] == [200] * 40
    assert sorted(r.body for r in replies) == sent and {r.headers["x-seen"] for r in replies} == {
        "t"
    }
    assert 8 < opened < 40  # connections were both reused and retired

    theirs: list[bytes] = []
    with serving(echo_app(0.02, theirs), uds=sock):

        async def bentomls() -> list[Any]:
            manager = SessionManager(path_to_uri(sock), timeout=10, headers={}, max_requests=3)

            async def post(body: bytes) -> Any:
                session = await manager.get_session()
                try:
                    async with session.post("/echo", data=body) as resp:
                        return await resp.read()
                except (aiohttp.ClientError, RuntimeError) as exc:  # RuntimeError: session closed
                    return exc

            try:
                return await workers(post, 8, 5)
            finally:
                await manager.close()

        answers = asyncio.run(bentomls())
    cut = [a for a in answers if isinstance(a, Exception)]
    assert cut, "BentoML's session no longer cuts calls in flight: hop.py's reason is gone"
    assert len(theirs) > len(answers) - len(cut)  # the runner read calls whose answer was lost


def test_an_idle_connection_the_runner_closed_is_not_reused(sock: str) -> None:
    seen: list[bytes] = []
    with serving(echo_app(0, seen), uds=sock, keep_alive_s=1):

        async def main() -> tuple[list[int], int]:
            hop = HopClient(unix_path=sock)
            first = await hop.post("/echo", b"a", {})
            await asyncio.sleep(1.5)  # past the runner's keep-alive: it closes the connection
            second = await hop.post("/echo", b"b", {})
            hop.close()
            return [first.status, second.status], hop.opened

        statuses, opened = asyncio.run(main())
    assert statuses == [200, 200] and seen == [b"a", b"b"] and opened == 2


def test_a_dropped_or_silent_runner_fails_the_call_and_its_connection(sock: str) -> None:
    async def main() -> tuple[BaseException, BaseException, int]:
        behaviour = {"mode": "drop"}

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            if behaviour["mode"] == "silent":
                await asyncio.sleep(5)
            writer.close()

        server = await asyncio.start_unix_server(handle, sock)
        async with server:
            hop = HopClient(unix_path=sock, timeout=0.3)
            with pytest.raises(ConnectionError) as dropped:
                await hop.post("/echo", b"a", {})
            behaviour["mode"] = "silent"
            started = time.monotonic()
            with pytest.raises(TimeoutError) as late:
                await hop.post("/echo", b"b", {})
            assert time.monotonic() - started < 3  # the client's timeout, not the server's close
            assert hop._idle == []  # a failed call's connection is never reused
            opened = hop.opened
            hop.close()
        return dropped.value, late.value, opened

    dropped, late, opened = asyncio.run(main())
    assert isinstance(dropped, ConnectionResetError) and isinstance(late, TimeoutError)
    assert opened == 2


def test_a_runner_that_is_down_is_a_connection_error_naming_it(sock: str) -> None:
    with pytest.raises(ConnectionError, match=r"cannot reach the runner at .*runner\.sock"):
        asyncio.run(HopClient(unix_path=sock).post("/echo", b"a", {}))


def test_the_tokenizer_retries_a_dropped_call_once_then_answers_503(sock: str) -> None:
    """Through the ONNX runner's client, as the tokenizer calls it in the graph: a runner that
    drops every call is tried twice (a dead keep-alive is worth one retry), then reported."""
    from runners.onnx.service import OnnxRunner

    OnnxRunner.inject_config()
    calls = []

    async def main() -> RunnerUnavailable:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            calls.append(await reader.readuntil(b"\r\n\r\n"))
            writer.close()

        server = await asyncio.start_unix_server(handle, sock)
        async with server:
            proxy = RemoteProxy(path_to_uri(sock), service=OnnxRunner, media_type=PICKLE)
            with pytest.raises(RunnerUnavailable) as info:
                await OnnxRunnerClient(proxy, "fp32").embed([[101, 102]], 2.0)
        return info.value

    unavailable = asyncio.run(main())
    assert unavailable.status == 503 and unavailable.headers() == {"Retry-After": "1"}
    assert len(calls) == 2 and all(c.startswith(b"POST /embed HTTP/1.1\r\n") for c in calls)


def test_the_hop_goes_where_bentomls_client_would_with_its_limits(sock: str) -> None:
    """hop_for reads BentoML's client (bentoml is pinned): the graph's Unix socket with the
    runner's timeout and BentoML's refresh limits; a plain http URL; https and an in-process app
    keep BentoML's own session."""
    from runners.onnx.service import OnnxRunner

    OnnxRunner.inject_config()
    in_graph = RemoteProxy(path_to_uri(sock), service=OnnxRunner, media_type=PICKLE).to_async
    hop = hop_for(in_graph)
    assert hop is not None and hop.unix_path == sock
    manager = in_graph._session_manager
    assert (hop.timeout, hop.max_age, hop.max_requests) == (
        manager._timeout.total, manager.max_age, manager.max_requests,
    )  # fmt: skip
    assert hop.timeout == pytest.approx(OnnxRunner.config["traffic"]["timeout"] * 1.01)
    assert "Runner-Name: onnx_runner\r\n" in hop._fixed  # BentoML's default headers, sent too

    by_url = RemoteProxy("http://runner.internal:3001", service=OnnxRunner, media_type=PICKLE)
    url_hop = hop_for(by_url.to_async)
    assert url_hop is not None and (url_hop.host, url_hop.port) == ("runner.internal", 3001)
    assert url_hop.unix_path is None and "host: runner.internal:3001" in url_hop._fixed

    tls = RemoteProxy("https://runner.internal", service=OnnxRunner, media_type=PICKLE)
    assert hop_for(tls.to_async) is None
    app = RemoteProxy("http://runner", service=OnnxRunner, media_type=PICKLE, app=Starlette())
    assert hop_for(app.to_async) is None
