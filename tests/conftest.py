"""Test tiers by folder, and a guard that no process the suite started outlives it.

Tiers: unit (fake engines), http (the services' ASGI apps in-process, with real engines),
integration (real models in-process), e2e (real servers; one graph for the session, ``graph``),
load (benchmark-like runs), containers (the compose stack), swarm (the same stack on Docker
Swarm). Each test is marked with its folder's tier, so ``pytest -m unit`` runs the fast ones alone.
``make check`` runs unit and http, ``make test`` those and integration and e2e, ``make test-load``
load.

The guard: this process becomes the reaper of its orphaned descendants (a BentoML worker whose
arbiter died is re-parented here, not to init), and when the session ends every descendant must be
gone. Any that is not is named, killed by PID, and the run fails.
"""

from __future__ import annotations

import contextlib
import multiprocessing.resource_tracker
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from testkit.processes import Server, adopt_orphans, bentoml_serve, log_path, stop_processes

TIERS = {"unit", "http", "integration", "e2e", "load", "containers", "swarm"}


def pytest_configure(config: pytest.Config) -> None:
    adopt_orphans()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
        if (
            not GRAPH_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))
            and _module(item.nodeid) not in GRAPH_MODULES
        ):
            raise pytest.UsageError(
                f"{item.nodeid} uses the session's graph: list its module in GRAPH_MODULES "
                "(tests/conftest.py), so that one worker runs every test of that graph"
            )
    # The session's graph, once started, stays up until the session ends: in the load tier the
    # tests that start servers of their own, or time starts, run before it does; the profile, which
    # needs one worker of each service, first of those on it; and chaos, which kills its workers,
    # last of all. Under pytest-xdist the longest modules go first (FIRST).
    items.sort(key=lambda item: (LAST.index(m) + 1 if (m := _module(item.nodeid)) in LAST else 0,
                                 FIRST.index(m) if m in FIRST else len(FIRST)))  # fmt: skip


# Under pytest-xdist (`make test`: `WORKERS` workers), the modules whose tests share the session's graph run in
# one worker, so that one graph serves them all; the tests of any other module stay in one worker,
# so that what its module-scoped fixtures start, build or cache (a unit module's toy servers and
# subprocesses among them) is made once, not once a worker.
GRAPH_MODULES = frozenset(
    {
        "tests/e2e/test_graph.py",
        "tests/e2e/test_tenants.py",
        "tests/e2e/test_readme_examples.py",
        "tests/load/test_profile.py",
        "tests/load/test_locust_smoke.py",
        "tests/load/test_soak.py",
        "tests/load/test_chaos.py",
    }
)
GRAPH_FIXTURES = frozenset({"graph", "graph_server"})
LAST = (
    "tests/load/test_profile.py",
    "tests/load/test_locust_smoke.py",
    "tests/load/test_soak.py",
    "tests/load/test_chaos.py",
)
# Modules of `make test` that took long in a measured run (tests/README.md, "Where the time goes"),
# longest first: handed to the workers first, so that none of them starts one late and runs on
# alone at the end while the others have finished. The scheduler takes the modules in this order, not by
# their number of tests (pytest-xdist's default).
FIRST = (
    "tests/e2e/test_catalogue.py",
    "tests/integration/test_models.py",
    "tests/integration/test_bentos.py",
    "tests/e2e/test_graph.py",  # the session graph's modules, one worker's (GRAPH_MODULES)
    "tests/e2e/test_security.py",
    "tests/unit/test_hot_path.py",
    "tests/e2e/test_openai.py",
    "tests/e2e/test_runner.py",
    "tests/unit/test_deploy.py",
    "tests/unit/test_lean_path.py",
)


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    class ByServer(LoadScopeScheduling):
        def __init__(self, config: pytest.Config, log: object = None) -> None:
            config.option.loadscopereorder = False  # the collection's order: FIRST, then the rest
            super().__init__(config, log)

        def _split_scope(self, nodeid: str) -> str:
            module = _module(nodeid)
            return "graph" if module in GRAPH_MODULES else module

    return ByServer(config, log)


@pytest.fixture(scope="session")
def tenant_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh tenant store for the session (each pytest-xdist worker has its own)."""
    return tmp_path_factory.mktemp("tenants")


@pytest.fixture(scope="session")
def graph_server(tenant_store: Path) -> Iterator[Server]:
    """The whole graph (tokenizer + ONNX, TF and tenant runners) as `make serve` runs it: one for
    the session, shared by every test that can share it (``graph``: its URL)."""
    env = {"BUNDLE_TENANTS_STORE": str(tenant_store)}
    with bentoml_serve(".", log_path("graph.log"), env=env) as server:
        yield server


@pytest.fixture(scope="session")
def graph(graph_server: Server) -> str:
    return graph_server.url


@pytest.fixture(scope="session")
def client(graph: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=graph, timeout=60) as c:
        yield c


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
