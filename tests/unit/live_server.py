"""An ASGI app on a real socket for a test: uvicorn (httptools, as BentoML's servers run it) in a
thread of the test's process, on a Unix socket or 127.0.0.1. Stopped and joined on exit, so no
process or thread outlives the test."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


@contextmanager
def serving(app: Any, uds: str | None = None, keep_alive_s: int = 5) -> Iterator[str]:
    """Yields the server's address: the socket's path, or http://127.0.0.1:PORT."""
    config = uvicorn.Config(
        app,
        uds=uds,
        http="httptools",
        lifespan="off",
        log_level="warning",
        timeout_keep_alive=keep_alive_s,
    )
    server = uvicorn.Server(config)
    # A TCP socket bound here and handed over, so the port is ours from the start (no probe).
    listener = None if uds else socket.create_server(("127.0.0.1", 0))
    sockets = [listener] if listener else None
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets)), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield uds if uds else f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        if listener is not None:
            listener.close()
        assert not thread.is_alive(), "the test server did not stop"
