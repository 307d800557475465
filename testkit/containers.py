"""The project's images as containers, for the tests and the load tools alike: the Docker client
(Debian's first on PATH, deploy/engine/engine.sh), a bridge network of one's own, and a container
of an image removed by its ID after use and checked gone. Everything made is labelled, so a run
that died half-way leaves nothing that cannot be found."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator

LABEL = "bento-bundle.test"


def docker(
    *args: str, timeout: float = 300, check: bool = True, env: dict[str, str] | None = None
) -> str:
    """``docker *args``' output; raises with its stderr when it fails (unless not ``check``)."""
    proc = subprocess.run(
        ["docker", *args], env=client_env(env), capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:3])} …: {proc.stderr.strip()[-3000:]}")
    return proc.stdout.strip()


def client_env(env: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "PATH": f"/usr/bin:{os.environ['PATH']}", **(env or {})}


def logs(cid: str) -> str:
    """The container's output, both streams (a worker's traceback is on its stderr)."""
    proc = subprocess.run(
        ["docker", "logs", cid], env=client_env(), capture_output=True, text=True, timeout=60
    )
    return proc.stdout + proc.stderr


@contextlib.contextmanager
def network(prefix: str = "bundle-test") -> Iterator[str]:
    """A bridge network of its own; at the end every container still on it (a removal that
    failed) and then the network are removed, and checked gone."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    docker("network", "create", "--label", LABEL, name)
    try:
        yield name
    finally:
        if left := docker("ps", "-aq", "--filter", f"network={name}").split():
            docker("rm", "-f", *left)
        docker("network", "rm", name)
        if docker("network", "ls", "-q", "--filter", f"name=^{name}$"):
            raise RuntimeError(f"network {name} is still there")


@contextlib.contextmanager
def container(
    image: str, name: str, net: str, env: dict[str, str], tag: str
) -> Iterator[tuple[str, float, float]]:
    """A container of ``image`` with the stack's command (``serve``), its port published on
    loopback, reachable on ``net`` as ``name`` up to its ``--`` (the service's name): its ID, and
    when it was launched (``time.time()``, ``time.monotonic()``; created, then started: ``docker
    run`` in two steps, so that the ID is known before anything can fail). Removed by its ID
    after, checked gone."""
    settings = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    launched_at, launched = time.time(), time.monotonic()
    cid = docker(
        "create", "--name", name, "--network", net, "--network-alias", name.split("--")[0],
        "--label", LABEL, "-p", "127.0.0.1::3000", *settings, f"bento-bundle/{image}:{tag}",
        "serve",
    )  # fmt: skip
    try:
        docker("start", cid)
        yield cid, launched_at, launched
    finally:
        docker("rm", "-f", cid)
        if docker("ps", "-aq", "--filter", f"id={cid}"):
            raise RuntimeError(f"container {cid[:12]} is still there")


def port(cid: str) -> int:
    """The loopback port the container's 3000 is published on."""
    try:
        return int(docker("port", cid, "3000/tcp").splitlines()[0].rsplit(":", 1)[1])
    except (RuntimeError, IndexError, ValueError) as exc:
        raise RuntimeError(
            f"{cid[:12]} has no published port ({exc}):\n{logs(cid)[-3000:]}"
        ) from exc
