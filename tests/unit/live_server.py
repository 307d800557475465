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
    if uds is None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    config = uvicorn.Config(
        app,
        uds=uds,
        host="127.0.0.1",
        port=0 if uds else port,
        http="httptools",
        lifespan="off",
        log_level="warning",
        timeout_keep_alive=keep_alive_s,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield uds if uds else f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        assert not thread.is_alive(), "the test server did not stop"
