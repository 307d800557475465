"""Start a server on a free loopback port, wait until it is ready, stop it by PID with its children.

Used by the end-to-end tests and the benchmark. Stopping signals the server's PID and the PIDs of
its descendants, collected from the process tree (BentoML starts each worker in a session of its
own, so a process-group signal would miss them); nothing is ever matched by name. Descendants are
remembered as they are seen, so they are stopped even when the server itself has already died; and
``adopt_orphans`` makes the calling process the reaper of orphaned descendants, so a worker whose
arbiter was killed stays findable under it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# What a server's own BentoML home (``own_home``) takes from the shared one: the model store, the
# bento store, the default tenant store (runners/tenants/settings.py).
SHARED_IN_HOME = ("models", "bentos", "tenants")


# Where the tests' servers write their logs (pytest's output names them on a failure).
LOGS = ROOT / "build" / "test-logs"


def log_path(name: str) -> Path:
    return LOGS / name


_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def adopt_orphans() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``):
    a BentoML worker whose arbiter died is re-parented here instead of to init, so it is still
    this process's descendant, found by PID. Returns whether the kernel accepted it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def stop_processes(
    processes: Sequence[psutil.Process], timeout_s: float = 5
) -> list[psutil.Process]:
    """SIGKILL each process by PID and wait for it (reaping our children); returns any still alive."""
    for proc in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    return alive


def run_tree(
    argv: Sequence[str], timeout_s: float, **popen: object
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` for a command that starts servers of its own (the benchmark): on a
    timeout, or if waiting fails, the command and every descendant seen are SIGKILLed by PID and
    checked gone, so no server outlives it. Output goes through files, not pipes: a process that
    inherited them cannot keep this waiting."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True, **popen)  # type: ignore[call-overload]
        seen: dict[int, psutil.Process] = {}

        def look() -> None:  # remembered, so a server whose parent died is still stopped
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in psutil.Process(proc.pid).children(recursive=True):
                    seen.setdefault(child.pid, child)

        deadline = time.monotonic() + timeout_s
        try:
            while proc.poll() is None:
                look()
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(argv, timeout_s)
                time.sleep(0.5)
        except BaseException:
            look()
            proc.kill()  # first: it cannot restart anything then
            proc.wait()
            left = stop_processes([p for p in seen.values() if p.is_running()])
            assert not left, f"still alive after SIGKILL: {[p.pid for p in left]}"
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, proc.returncode, out.read(), err.read())


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
        descendants_grace_s: float = 5,
    ) -> None:
        self.argv = list(argv)
        # How long ``stop`` lets the descendants exit by themselves once the server has: BentoML's
        # workers shut down on their arbiter's signal; a test's toy whose worker never exits by
        # itself passes less, as the wait would only delay its SIGKILL.
        self.descendants_grace_s = descendants_grace_s
        self.ready_path = ready_path
        self.port = port
        self.log = log
        self.env = {**os.environ, "BENTOML_DO_NOT_TRACK": "True", **(env or {})}
        self.proc: subprocess.Popen | None = None
        self._seen: dict[int, psutil.Process] = {}  # every descendant seen, by PID

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 180, append: bool = False) -> Server:
        return self.launch(append).ready(timeout_s)

    def launch(self, append: bool = False) -> Server:
        """Start the process and return at once (``ready`` waits for it)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab" if append else "wb") as out:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def ready(self, timeout_s: float = 180) -> Server:
        """Wait until the server answers its readiness probe; stopped (by PID, with its
        descendants) and an error raised if it exits or is not ready in time."""
        assert self.proc is not None, "not launched"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.descendants()  # remembered now: a server that dies while starting orphans them
            if self.proc.poll() is not None:
                self.stop()  # the workers it had started, by the PIDs seen
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

    def process(self) -> psutil.Process:
        assert self.proc is not None, "not started"
        return psutil.Process(self.proc.pid)

    def descendants(self) -> list[psutil.Process]:
        """The server's live descendants: those in its tree now, and any seen before that are
        still running (``is_running`` compares start times, so a reused PID is not mistaken)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in psutil.Process(self.proc.pid).children(recursive=True):
                    self._seen.setdefault(child.pid, child)
        return [p for p in self._seen.values() if p.is_running()]

    def stop(self, grace_s: float = 8) -> None:
        """SIGTERM (the server shuts its workers down itself), then SIGKILL by PID whatever is left
        after ``grace_s``, the server's descendants included even if the server itself has gone.
        A graph stops in about a second, but a tokenizer stopped within BentoML's traffic timeout
        of its start waits out the readiness probes that failed while its runners started:
        BentoML's timeout middleware holds a request whose app ended without an answer until the
        timeout. The grace does not wait for those."""
        if self.proc is None:
            return
        children = self.descendants()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        _, alive = psutil.wait_procs(children, timeout=self.descendants_grace_s)
        left = stop_processes(alive)
        if left:
            raise RuntimeError(
                f"processes of {self.argv[:3]} survived SIGKILL: {[p.pid for p in left]}"
            )

    def restart(self, timeout_s: float = 180) -> Server:
        """Stop (every descendant by PID, checked gone) and start again on the same port, the log
        kept."""
        self.stop()
        self._seen.clear()
        return self.start(timeout_s, append=True)

    def kill(self) -> list[int]:
        """A crash, not a shutdown: SIGKILL the server and every descendant by PID, reap them, and
        check they are gone. Returns the PIDs killed (the server's first)."""
        assert self.proc is not None, "not started"
        children = self.descendants()
        self.proc.kill()  # first, so that no worker is restarted
        self.proc.wait()
        left = stop_processes(children)
        assert not left, f"still alive after SIGKILL: {[p.pid for p in left]}"
        return [self.proc.pid, *(p.pid for p in children)]

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


class Servers(contextlib.ExitStack):
    """Several servers started at once (each launched, then each awaited) and each stopped on exit,
    whatever stopping another raised."""

    def __init__(self, servers: dict[str, Server], timeout_s: float = 300) -> None:
        super().__init__()
        self.servers = servers
        self.timeout_s = timeout_s

    def __enter__(self) -> dict[str, Server]:  # type: ignore[override]
        super().__enter__()
        try:
            for server in self.servers.values():
                self.callback(server.stop)
                server.launch()
            for server in self.servers.values():
                server.ready(self.timeout_s)
        except BaseException:
            self.close()
            raise
        return self.servers


def own_home(log: Path) -> dict[str, str]:
    """``BENTOML_HOME`` for one ``bentoml serve``: a directory of its own beside its log, whose
    model store, bentos and default tenant store are links to the shared home's
    (``$BENTOML_HOME``, default ``~/bentoml``), so the server reads and writes what it did on the
    shared home. Only its metrics are its own: ``bentoml serve`` empties
    ``$BENTOML_HOME/prometheus_multiproc_dir`` as it starts, and every worker of every graph on
    one home writes its metrics there, so a graph started beside another takes the other's metric
    files away and that graph's ``/metrics`` loses its runners' series (the benchmark reads their
    engine CPU there, cpu.py). A caller's own ``BENTOML_HOME`` in ``env`` wins."""
    shared = Path(os.environ.get("BENTOML_HOME") or Path.home() / "bentoml").resolve()
    home = log.with_suffix(".bentoml-home")
    home.mkdir(parents=True, exist_ok=True)
    for name in SHARED_IN_HOME:
        (shared / name).mkdir(parents=True, exist_ok=True)
        link = home / name
        if link.is_symlink() and link.readlink() != shared / name:  # another shared home now
            link.unlink()
        if not link.is_symlink():
            link.symlink_to(shared / name, target_is_directory=True)
    return {"BENTOML_HOME": str(home)}


def bentoml_serve(
    target: str, log: Path, env: dict[str, str] | None = None, port: int | None = None
) -> Server:
    """``bentoml serve TARGET`` on 127.0.0.1 (TARGET: '.' for the whole graph, or module:Class),
    with a BentoML home of its own (``own_home``)."""
    port = port or free_port()
    argv = [str(BIN / "bentoml"), "serve", target, "--host", "127.0.0.1", "--port", str(port)]
    return Server(argv, port, log, {**own_home(log), **(env or {})})


def uvicorn(app: str, log: Path, env: dict[str, str] | None = None) -> Server:
    """One uvicorn process serving ``app`` (module:attribute) on 127.0.0.1 with httptools and
    uvloop, its access log off: how the hand-written baselines are served."""
    port = free_port()
    argv = [
        str(BIN / "uvicorn"),
        app,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
        "--http",
        "httptools",
        "--loop",
        "uvloop",
    ]
    return Server(argv, port, log, env, ready_path="/health")
