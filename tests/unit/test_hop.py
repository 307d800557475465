"""The tokenizer's lean hop client (services/tokenizer/hop.py) against real sockets: uvicorn serving
on a Unix socket as a runner in the graph does, and raw servers that drop or never answer."""

from __future__ import annotations

import asyncio
import socket
import tempfile
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
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from services.tokenizer.clients import PICKLE, OnnxRunnerClient, RunnerUnavailable
from services.tokenizer.hop import HopClient, Unreachable, hop_for
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
    """``count`` callers, each making ``calls`` calls one after another (bodies 'w.k'), started
    25 ms apart so that calls are in flight whenever one starts (as the tokenizer's calls are)."""

    async def worker(w: int) -> list[Any]:
        await asyncio.sleep(w * 0.025)
        return [await post(f"{w}.{k}".encode()) for k in range(calls)]

    return [r for rs in await asyncio.gather(*(worker(w) for w in range(count))) for r in rs]


def test_every_call_reaches_the_runner_once_while_connections_retire(sock: str) -> None:
    """Connections retire after BentoML's ``max_requests`` (here 3), but only once idle: 8 callers x
    5 calls are 40 answers and 40 requests read. BentoML's own session, refreshed at the same limit,
    closes the connections still waiting for an answer: calls fail after the runner has read them,
    and a caller that resends them makes the runner compute them twice. (In the graph the runners
    turn BentoML's refresh off; by URL its defaults, 100 calls or 300 s, apply.)"""
    ours: list[bytes] = []
    with serving(echo_app(0.25, ours), uds=sock):

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
    with serving(echo_app(0.25, theirs), uds=sock):

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
            # The runner's keep-alive (1 s) runs out and it closes the idle connection.
            idle = hop._idle[0]
            async with asyncio.timeout(10):
                while not idle.lost:
                    await asyncio.sleep(0.05)
            second = await hop.post("/echo", b"b", {})
            hop.close()
            return [first.status, second.status], hop.opened

        statuses, opened = asyncio.run(main())
    assert statuses == [200, 200] and seen == [b"a", b"b"] and opened == 2


@pytest.mark.parametrize(
    ("limits", "opened"),
    [({}, 1), ({"max_requests": 2}, 2), ({"max_age": 0}, 3)],
    ids=["defaults", "max_requests 2", "max_age 0"],
)
def test_a_connection_serves_calls_until_its_limits(
    sock: str, limits: dict[str, float], opened: int
) -> None:
    """Three calls in a row: one connection for all by default; BentoML's max_requests and
    max_age (seconds since it opened) retire it."""
    seen: list[bytes] = []
    with serving(echo_app(0, seen), uds=sock):

        async def main() -> int:
            hop = HopClient(unix_path=sock, **limits)
            for body in (b"a", b"b", b"c"):
                assert (await hop.post("/echo", body, {})).body == body
            hop.close()
            return hop.opened

        assert asyncio.run(main()) == opened
    assert seen == [b"a", b"b", b"c"]


def test_a_dropped_or_silent_runner_fails_the_call_and_its_connection(sock: str) -> None:
    async def main() -> tuple[BaseException, BaseException, int]:
        behaviour = {"mode": "drop"}
        hung_up = asyncio.Event()  # the client closed the silent call's connection

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            if behaviour["mode"] == "silent":
                await reader.read()  # until the client closes its end
                hung_up.set()
            writer.close()

        server = await asyncio.start_unix_server(handle, sock)
        async with server:
            hop = HopClient(unix_path=sock, timeout=0.3)
            with pytest.raises(ConnectionError) as dropped:
                await hop.post("/echo", b"a", {})
            behaviour["mode"] = "silent"
            with pytest.raises(TimeoutError) as late:
                await hop.post("/echo", b"b", {})
            await asyncio.wait_for(hung_up.wait(), 5)  # closed, not kept for another call
            assert hop._idle == []
            opened = hop.opened
            hop.close()
        return dropped.value, late.value, opened

    dropped, late, opened = asyncio.run(main())
    assert isinstance(dropped, ConnectionResetError) and isinstance(late, TimeoutError)
    assert opened == 2


def test_an_interim_answer_is_skipped_and_waiting_for_a_connection_counts_in_the_timeout(
    sock: str,
) -> None:
    """A 100 Continue before the answer is not the answer. With every connection busy, a call
    that waits for one times out like any other."""

    async def main() -> tuple[Any, BaseException]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"POST /interim ")
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
            await reader.read()
            writer.close()

        server = await asyncio.start_unix_server(handle, sock)
        async with server:
            hop = HopClient(unix_path=sock, timeout=0.3, max_connections=1)
            answered = await hop.post("/interim", b"", {})
            await hop._slots.acquire()  # the only connection taken, as by a call in flight
            queued = asyncio.create_task(hop.post("/interim", b"", {}))
            done, _ = await asyncio.wait({queued}, timeout=5)
            queued.cancel()
            hop._slots.release()
            hop.close()
        assert done, "a call waiting for a connection outlived its timeout (0.3 s)"
        return answered, queued.exception()

    answered, queued = asyncio.run(main())
    assert (answered.status, answered.body) == (200, b"ok")
    assert isinstance(queued, TimeoutError)


def test_a_runner_that_is_down_is_unreachable_naming_it(sock: str) -> None:
    """No connection opens, on a Unix socket or a TCP port nothing listens on: ``Unreachable``
    (the call never reached a runner, so the tokenizer may wait for a replica and send it again),
    a ConnectionError naming where it went."""
    with pytest.raises(Unreachable, match=r"cannot reach the runner at .*runner\.sock"):
        asyncio.run(HopClient(unix_path=sock).post("/echo", b"a", {}))
    with socket.socket() as probe:  # a port just free: nothing listens on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(Unreachable, match=f"cannot reach the runner at 127.0.0.1:{port}"):
        asyncio.run(HopClient(port=port).post("/echo", b"a", {}))
    assert issubclass(Unreachable, ConnectionError)


def test_the_tokenizer_retries_a_dropped_call_once_then_answers_503(sock: str) -> None:
    """Through the ONNX runner's client, as the tokenizer calls it in the graph: a runner that
    drops every call is tried twice (what one retry is for: a keep-alive connection the runner
    closed as the call went out), then reported as unavailable."""
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
                await OnnxRunnerClient(proxy, "m", "fp32").embed([[101, 102]], 2.0)
        return info.value

    unavailable = asyncio.run(main())
    assert unavailable.status == 503 and unavailable.headers() == {"Retry-After": "1"}
    assert len(calls) == 2 and all(c.startswith(b"POST /embed HTTP/1.1\r\n") for c in calls)


def test_the_hop_goes_where_bentomls_client_would_with_its_limits(sock: str) -> None:
    """hop_for reads BentoML's client (bentoml is pinned). In the graph: the runner's Unix socket,
    its timeout (+1 %) and its runner_connection limits (refresh off). By URL, as
    ``bentoml.depends(url=...)`` makes it: host and port, and BentoML's defaults (60 s, 100 calls,
    300 s). https, a URL with a path and an in-process app keep BentoML's own session."""
    from runners.onnx.service import OnnxRunner

    OnnxRunner.inject_config()
    in_graph = RemoteProxy(path_to_uri(sock), service=OnnxRunner, media_type=PICKLE).to_async
    hop = hop_for(in_graph)
    assert hop is not None and hop.unix_path == sock
    assert hop.timeout == pytest.approx(OnnxRunner.config["traffic"]["timeout"] * 1.01)
    assert (hop.max_requests, hop.max_age) == (2**62, 1e12)
    assert "Runner-Name: onnx_runner\r\n" in hop._fixed  # BentoML's default headers, sent too

    async def schema(_: Request) -> JSONResponse:
        return JSONResponse(OnnxRunner.schema())

    with serving(Starlette(routes=[Route("/schema.json", schema)])) as url:
        by_url = RemoteProxy(url, media_type="application/json").to_async
    url_hop = hop_for(by_url)
    assert url_hop is not None and url_hop.unix_path is None
    assert (
        f"http://{url_hop.host}:{url_hop.port}" == url and f"host: {url[7:]}\r\n" in url_hop._fixed
    )
    assert (url_hop.timeout, url_hop.max_requests, url_hop.max_age) == (60, 100, 300)

    for elsewhere in ("https://runner.internal", "http://runner.internal/v1"):
        proxy = RemoteProxy(elsewhere, service=OnnxRunner, media_type=PICKLE)
        assert hop_for(proxy.to_async) is None
    app = RemoteProxy("http://runner", service=OnnxRunner, media_type=PICKLE, app=Starlette())
    assert hop_for(app.to_async) is None
