"""The compose stack from real images, started once for the container tests and stopped after.

Needs a running Docker engine and the images (`make images`); `make test-containers` provides both
and stops what it started. Without an engine these tests fail, they do not skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from testkit.processes import ROOT, free_port

COMPOSE_DIR = ROOT / "deploy" / "compose"
# What `docker-compose` reads by itself in that folder: the stack, and compose's own additions
# (published ports on loopback, start order).
COMPOSE_FILES = [COMPOSE_DIR / "docker-compose.yml", COMPOSE_DIR / "docker-compose.override.yml"]
FILE_ARGS = [arg for path in COMPOSE_FILES for arg in ("-f", str(path))]
LOGS = ROOT / "build" / "test-logs"
PROBE = Path(__file__).with_name("probe.py")


@dataclass
class Stack:
    project: str
    env: dict[str, str]
    client: httpx.Client

    def compose(self, *args: str, timeout: float = 600) -> str:
        argv = ["docker-compose", "-p", self.project, *FILE_ARGS, *args]
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, f"{' '.join(args)}: {proc.stderr[-3000:]}"
        return proc.stdout

    def inside(self, command: dict) -> dict:
        """tests/containers/probe.py run in the tokenizer's container, on the stack's network."""
        out = self.compose(
            "exec", "-T", "tokenizer", "python", "-c", PROBE.read_text(), json.dumps(command)
        )
        return json.loads(out)


def wait_serving(client: httpx.Client, seconds: float = 240) -> float:
    """Seconds until an embedding comes back through the front door (runners included)."""
    started = time.monotonic()
    while True:
        try:
            if client.post("/embed", json={"texts": ["ready?"]}).status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        if time.monotonic() - started > seconds:
            raise AssertionError(f"the stack did not serve within {seconds:.0f} s")
        time.sleep(1)


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    # /usr/bin first: Debian's docker client (see deploy/engine/engine.sh).
    env = {
        **os.environ,
        "PATH": f"/usr/bin:{os.environ['PATH']}",
        "IMAGE_TAG": os.environ.get("IMAGE_TAG", "latest"),
        "TOKENIZER_PORT": str(free_port()),
        "PROMETHEUS_PORT": str(free_port()),
        "ADMIN_ENABLED": "true",  # the tests train tenants through the public service
    }
    subprocess.run(["docker", "info"], env=env, capture_output=True, check=True)
    with httpx.Client(base_url=f"http://127.0.0.1:{env['TOKENIZER_PORT']}", timeout=60) as client:
        stack = Stack(f"bundle-test-{uuid.uuid4().hex[:6]}", env, client)
        try:
            stack.compose("up", "-d")
            wait_serving(client)
            yield stack
        finally:
            LOGS.mkdir(parents=True, exist_ok=True)
            logs = subprocess.run(
                ["docker-compose", "-p", stack.project, *FILE_ARGS, "logs", "--no-color"],
                env=env, capture_output=True, text=True,
            )  # fmt: skip
            (LOGS / "compose.log").write_text(logs.stdout + logs.stderr)
            stack.compose("down", "-v", "--remove-orphans")
