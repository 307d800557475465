"""Before each benchmark point every server is drained; one that has not worked off its queue in
time is restarted by PID (descendants included) on its port, and the point records it. A server
that dies while starting leaves no worker behind, and a run that stops with an error keeps the
points it measured."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import psutil
import pytest

from loadtests import bench
from loadtests.bench import kept_on_failure, settle
from loadtests.points import STACK, Point
from testkit.processes import Server, free_port

# A one-endpoint server that answers /embed in 1 s in its first life when told "slow-first", in
# every life when told "slow", at once otherwise. It counts its lives in a file, says which life
# it is in its log, and starts a child in a session of its own, as BentoML's workers are.
TOY = """
import http.server, pathlib, subprocess, sys, time
lives = pathlib.Path(sys.argv[2])
life = int(lives.read_text()) + 1 if lives.exists() else 1
lives.write_text(str(life))
print(f"life {life}", flush=True)
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
pathlib.Path(sys.argv[2] + ".worker").write_text(str(worker.pid))
if sys.argv[3] == "die":  # while starting, after its worker has started (and been seen)
    time.sleep(1.5)
    sys.exit(3)
slow = sys.argv[3] == "slow" or (sys.argv[3] == "slow-first" and life == 1)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.answer()

    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        if slow:
            time.sleep(1)
        self.answer()

    def answer(self):
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def toy(tmp: Path, name: str, mode: str) -> tuple[Server, Path]:
    script, lives, port = tmp / "toy.py", tmp / f"{name}.lives", free_port()
    script.write_text(TOY)
    argv = [sys.executable, str(script), str(port), str(lives), mode]
    # its worker outlives SIGTERM by design: stop's SIGKILL ends it, no need to wait for it first
    server = Server(argv, port, tmp / f"{name}.log", ready_path="/", descendants_grace_s=0.5)
    return server, lives


def test_a_server_that_does_not_drain_is_restarted_and_named(tmp_path: Path) -> None:
    (slow, slow_lives), (fast, fast_lives) = (
        toy(tmp_path, "slow", "slow-first"),
        toy(tmp_path, "fast", "never"),
    )
    with slow, fast:
        first = [slow.process(), *slow.descendants()]
        assert len(first) == 2  # the server and its worker
        assert settle({"slow": slow, "fast": fast}, timeout_s=2) == ["slow"]
        assert not any(p.is_running() for p in first), "the first life was not stopped"
        assert slow.process().pid != first[0].pid
        assert (slow_lives.read_text(), fast_lives.read_text()) == ("2", "1")
        assert slow.log.read_text().split() == ["life", "1", "life", "2"]  # kept, appended to
        assert settle({"slow": slow, "fast": fast}, timeout_s=2) == []  # drained now


def test_a_server_still_slow_after_its_restart_stops_the_run(tmp_path: Path) -> None:
    slow, lives = toy(tmp_path, "slow", "slow")
    with slow:
        with pytest.raises(RuntimeError, match="slow still slow after a restart"):
            settle({"slow": slow}, timeout_s=2)
        assert lives.read_text() == "2"
    assert slow.proc is not None and slow.proc.poll() is not None and not slow.descendants()


def test_a_server_that_exited_is_not_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast, lives = toy(tmp_path, "fast", "never")

    def drain(url: str, timeout_s: float) -> bool:
        raise AssertionError("an exited server was drained first (a minute of refused connections)")

    with fast:
        fast.kill()
        monkeypatch.setattr(bench, "drain", drain)
        with pytest.raises(RuntimeError, match="fast exited with -9"):
            settle({"fast": fast}, timeout_s=2)
    assert lives.read_text() == "1"


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_server_that_dies_while_starting_leaves_no_worker(tmp_path: Path) -> None:
    dying, lives = toy(tmp_path, "dying", "die")
    with pytest.raises(RuntimeError, match="exited with 3"):
        dying.start()
    worker = int(Path(f"{lives}.worker").read_text())
    assert gone(worker), f"worker {worker} of a server that died while starting is still running"


def test_a_run_that_stops_with_an_error_keeps_its_points(tmp_path: Path) -> None:
    partial, raw = tmp_path / "partial.json", {"fp32": {"sentences_per_s": 300.0}}
    measured = Point(STACK, "chat", 1, 0, 100.0, 100.0, 5.0, 9.0, 1000, 0, 0, 0.01)
    points: list[Point] = []
    with kept_on_failure(partial, raw, points=points):
        points.append(measured)
    assert not partial.exists()  # a run that ends well writes its results, not this
    with pytest.raises(RuntimeError, match="stuck"), kept_on_failure(partial, raw, points=points):
        raise RuntimeError("stuck")
    data = json.loads(partial.read_text())
    assert data["raw"] == raw
    assert [Point(**p) for p in data["points"]] == [measured]
