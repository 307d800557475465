"""The suite's process guard (tests/conftest.py) catches a server worker orphaned by its arbiter's
death, the way a BentoML worker (which calls setsid) is orphaned when only the arbiter is killed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from testkit.processes import ROOT

LEAKY_TEST = """
import os, signal, subprocess, time
from pathlib import Path

def test_leaves_an_orphan(tmp_path):
    # An "arbiter" that starts a "worker" in a session of its own, then dies alone.
    arbiter = subprocess.Popen(["sh", "-c", "setsid sleep 300 & echo $! > {pidfile}; exec sleep 300"])
    while not Path("{pidfile}").exists() or not Path("{pidfile}").read_text().strip():
        time.sleep(0.05)
    arbiter.kill()
    arbiter.wait()
"""


def test_a_worker_orphaned_by_its_arbiter_fails_the_run_and_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "worker.pid"
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.conftest"]\n')
    (tmp_path / "test_leak.py").write_text(LEAKY_TEST.format(pidfile=pidfile))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    worker = int(pidfile.read_text())
    assert "1 passed" in proc.stdout, proc.stdout[-2000:]  # the test itself passed …
    assert proc.returncode == 1, proc.stdout[-2000:]  # … and the run failed on what it left
    assert f"{worker} sleep 300" in proc.stdout
    deadline = time.monotonic() + 10
    while psutil.pid_exists(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(worker), "the orphan was named but not killed"


def test_a_command_past_its_time_is_stopped_with_its_servers(tmp_path: Path) -> None:
    """run_tree (how the suite runs the benchmark): past the limit, the command and the "server"
    it started in a session of its own are killed by PID, then TimeoutExpired is raised."""
    import pytest

    from testkit.processes import run_tree

    pidfile = tmp_path / "worker.pid"
    script = f"setsid sleep 300 & echo $! > {pidfile}; exec sleep 300"
    with pytest.raises(subprocess.TimeoutExpired):
        run_tree(["sh", "-c", script], 3)
    worker = int(pidfile.read_text())
    assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE
    done = run_tree([sys.executable, "-c", "print('ok')"], 30)
    assert done.returncode == 0 and done.stdout.strip() == "ok"
