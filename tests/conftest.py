"""Test tiers by folder, and a guard that no process the suite started outlives it.

Tiers: unit (fake engines), integration (real models in-process), e2e (real servers), containers
(the compose stack), swarm (the same stack on Docker Swarm).
Each test is marked with its folder's tier, so ``pytest -m unit`` runs the fast ones alone.

The guard: this process becomes the reaper of its orphaned descendants (a BentoML worker whose
arbiter died is re-parented here, not to init), and when the session ends every descendant must be
gone. Any that is not is named, killed by PID, and the run fails.
"""

from __future__ import annotations

import contextlib
import multiprocessing.resource_tracker
from pathlib import Path

import psutil
import pytest

from loadtests.processes import adopt_orphans, stop_processes

TIERS = {"unit", "integration", "e2e", "containers", "swarm"}


def pytest_configure(config: pytest.Config) -> None:
    adopt_orphans()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


def leftover_processes() -> list[psutil.Process]:
    """Descendants of this process still alive, but for multiprocessing's resource tracker (it
    lives as long as the interpreter that started it, by design)."""
    tracker = getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)
    found = psutil.Process().children(recursive=True)
    return [
        p
        for p in found
        if p.pid != tracker and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]


def reap_zombies() -> None:
    """Collect the exit status of dead descendants re-parented here (they are gone, but a zombie
    entry stays until its parent reaps it)."""
    for proc in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if proc.status() == psutil.STATUS_ZOMBIE:
                proc.wait(0)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reap_zombies()
    left = leftover_processes()
    if not left:
        return
    described = []
    for proc in left:
        try:
            described.append(f"{proc.pid} {' '.join(proc.cmdline())[:160]}")
        except psutil.Error:
            described.append(str(proc.pid))
    stop_processes(left)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = "processes started by the tests outlived them (now killed by PID):\n  " + "\n  ".join(
        described
    )
    if reporter is not None:
        reporter.write_line(message, red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
