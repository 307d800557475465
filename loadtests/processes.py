"""Start a server on a free loopback port, wait until it is ready, stop it by PID with its children.

Used by the end-to-end tests and the benchmark. Stopping signals the server's PID and the PIDs of
its descendants, collected from the process tree (BentoML starts each worker in a session of its
own, so a process-group signal would miss them); nothing is ever matched by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    def __init__(
        self,
        argv: Sequence[str],
        port: int,
        log: Path,
        env: dict[str, str] | None = None,
        ready_path: str = "/readyz",
    ) -> None:
        self.argv = list(argv)
        self.ready_path = ready_path
        self.port = port
        self.log = log
        self.env = {**os.environ, "BENTOML_DO_NOT_TRACK": "True", **(env or {})}
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 180) -> Server:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.argv[:3]} exited with {self.proc.returncode}:\n{self.tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + self.ready_path, timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(
            f"{self.argv[:3]} not ready on port {self.port} after {timeout_s} s:\n{self.tail()}"
        )

    def descendants(self) -> list[psutil.Process]:
        if self.proc is None:
            return []
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, grace_s: float = 20) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        children = self.descendants()
        self.proc.send_signal(signal.SIGTERM)  # the server shuts its workers down itself
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        _, alive = psutil.wait_procs(children, timeout=5)
        for child in alive:  # whatever outlived the server, by PID
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def bentoml_serve(
    target: str, log: Path, env: dict[str, str] | None = None, port: int | None = None
) -> Server:
    """``bentoml serve TARGET`` on 127.0.0.1 (TARGET: '.' for the whole graph, or module:Class)."""
    port = port or free_port()
    argv = [str(BIN / "bentoml"), "serve", target, "--host", "127.0.0.1", "--port", str(port)]
    return Server(argv, port, log, env)
