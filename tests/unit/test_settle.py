"""Before each benchmark point every server is drained; one that has not worked off its queue in
time is restarted by PID (descendants included) on its port, and the point records it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from loadtests.bench import settle
from loadtests.processes import Server, free_port

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
    return Server(argv, port, tmp / f"{name}.log", ready_path="/"), lives


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


def test_a_server_that_exited_is_not_restarted(tmp_path: Path) -> None:
    fast, lives = toy(tmp_path, "fast", "never")
    with fast:
        fast.kill()
        with pytest.raises(RuntimeError, match="fast exited with -9"):
            settle({"fast": fast}, timeout_s=2)
    assert lives.read_text() == "1"
