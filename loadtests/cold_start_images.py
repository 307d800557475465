"""Cold start of each image: from its launch (``docker create``, then start) to ready (``/readyz``)
and to its first correct answer, that answer's latency against the steady p50, and the parts its
log records (import, model load, warm-up). ``make cold-start`` runs it after the graph's starts (``cold_start.py --images``).

Needs a Docker engine and the images (``make images``, tagged ``IMAGE_TAG``, default latest);
``docker`` is Debian's client (``PATH=/usr/bin:$PATH``). Each container runs the stack's command
(``serve``) and the compose file's model settings (MiniLM's ONNX runner: that model, one worker),
not its resource limits, on a bridge network of its own, its port published on loopback. The
tokenizer's image starts with the three runners' containers up beside it, called directly (no
proxy): it reads their schemas as it starts. A tenant runner with an empty store has no tenant to
classify: its first answer is its listing. Every container is removed by its ID once measured and
checked gone; the network, and whatever is still on it, at the end.
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from serving.startup import parse

TEXT = "How do I reset my password?"
IDS = [[101, 2129, 2079, 1045, 25141, 2026, 20786, 1029, 102]]  # TEXT by MiniLM's tokenizer
LIMIT_S = 180.0  # a container not ready by then fails the run
POLL_S = 0.05
MAX_ABS_DIFF = 1e-5
LABEL = "bento-bundle.cold-start"  # on every container and network this makes: found and removed


# image -> (the service its log names, the route of its first answer and its body, its settings as
# deploy/compose/docker-compose.yml gives them)
IMAGES: dict[str, tuple[str, str, dict[str, Any], dict[str, str]]] = {
    "onnx-runner": (
        "onnx_runner",
        "/embed",
        {"ids": IDS},
        {"BUNDLE_ONNX_WORKERS": "1", "BUNDLE_ONNX_MODELS": "all-MiniLM-L6-v2"},
    ),
    "tf-runner": ("tf_runner", "/embed", {"ids": IDS}, {}),
    "tenant-runner": ("tenant_runner", "/tenants/list", {}, {}),
    "tokenizer": ("tokenizer", "/embed", {"texts": [TEXT]}, {}),
}
# The tokenizer's runners: every model of the catalogue on the ONNX one (its warm-up asks each).
RUNNER_URLS = {"ONNX": "onnx-runner", "TF": "tf-runner", "TENANT": "tenant-runner"}


def docker(*args: str, timeout: float = 120) -> str:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:3])} …: {proc.stderr.strip()[-2000:]}")
    return proc.stdout.strip()


def logs(cid: str) -> str:
    """The container's output, both streams (a worker's traceback is on its stderr)."""
    proc = subprocess.run(["docker", "logs", cid], capture_output=True, text=True, timeout=60)
    return proc.stdout + proc.stderr


@contextmanager
def network() -> Iterator[str]:
    """A bridge network of its own; at the end every container still on it (a removal that
    failed) and then the network are removed, and checked gone."""
    name = f"bundle-cold-{uuid.uuid4().hex[:6]}"
    docker("network", "create", "--label", LABEL, name)
    try:
        yield name
    finally:
        if left := docker("ps", "-aq", "--filter", f"network={name}").split():
            docker("rm", "-f", *left)
        docker("network", "rm", name)
        if docker("network", "ls", "-q", "--filter", f"name=^{name}$"):
            raise RuntimeError(f"network {name} is still there")


@contextmanager
def container(
    image: str, name: str, net: str, env: dict[str, str], tag: str
) -> Iterator[tuple[str, float, float]]:
    """A container of ``image`` with the stack's command, reachable on ``net`` as ``name`` up to its
    ``--`` (the service's name): its ID, and when it was launched (``time.time()``,
    ``time.monotonic()``; created, then started: ``docker run`` in two steps, so that the ID is
    known before anything can fail). Removed by its ID after, checked gone."""
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


def ready(client: httpx.Client, cid: str, launched: float) -> float:
    """Seconds from ``launched`` until /readyz answers 200; raises with the log if the container
    exits or takes longer than LIMIT_S."""
    checked = 0.0
    while (waited := time.monotonic() - launched) < LIMIT_S:
        try:
            # The timeout outlasts a tokenizer's own wait for its warm-up (WARM_UP_TIMEOUT_S).
            # Ready is when the 200 came, not when it was asked for: a probe sent while the
            # worker starts may wait in the socket's backlog until it serves.
            if client.get("/readyz", timeout=5).status_code == 200:
                return time.monotonic() - launched
        except httpx.TransportError:
            pass
        if waited - checked > 2:  # not on every poll: an inspect costs more than a poll
            checked = waited
            if docker("inspect", "--format", "{{.State.Running}}", cid) != "true":
                raise RuntimeError(f"{cid[:12]} exited while starting:\n{logs(cid)[-3000:]}")
        time.sleep(POLL_S)
    raise TimeoutError(f"{cid[:12]} not ready after {LIMIT_S} s:\n{logs(cid)[-3000:]}")


def same(a: Any, b: Any) -> bool:
    """Two answers alike, timings aside: numbers within MAX_ABS_DIFF."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = {k for k in a.keys() | b.keys() if not k.endswith("_ms")}
        return all(same(a.get(k), b.get(k)) for k in keys)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b))
    if numbers and (isinstance(a, float) or isinstance(b, float)):
        return bool(abs(a - b) <= MAX_ABS_DIFF)
    return bool(type(a) is type(b) and a == b)


def port(cid: str) -> int:
    """The loopback port the container's 3000 is published on."""
    try:
        return int(docker("port", cid, "3000/tcp").splitlines()[0].rsplit(":", 1)[1])
    except (RuntimeError, IndexError, ValueError) as exc:
        raise RuntimeError(
            f"{cid[:12]} has no published port ({exc}):\n{logs(cid)[-3000:]}"
        ) from exc


def one_start(image: str, net: str, tag: str, steady: int) -> dict[str, Any]:
    """One container of ``image`` from its launch to ready and its first correct answer."""
    service, route, body, env = IMAGES[image]
    if image == "tokenizer":
        env = {f"BUNDLE_TOKENIZER_{k}_URL": f"http://{v}:3000" for k, v in RUNNER_URLS.items()}
    with container(image, f"{image}--{uuid.uuid4().hex[:6]}", net, env, tag) as started:
        cid, launched_at, launched = started
        with httpx.Client(base_url=f"http://127.0.0.1:{port(cid)}") as client:
            ready_s = ready(client, cid, launched)
            sent = time.perf_counter()
            first = client.post(route, json=body, timeout=30).raise_for_status().json()
            first_latency = time.perf_counter() - sent
            answered_s = time.monotonic() - launched
            latencies = []
            for _ in range(steady):
                sent = time.perf_counter()
                warm = client.post(route, json=body, timeout=30).raise_for_status().json()
                latencies.append(time.perf_counter() - sent)
        if not same(first, warm):
            raise AssertionError(f"{image}'s first answer differs from its warm one")
        container_s = (
            dt.datetime.fromisoformat(docker("inspect", "--format", "{{.State.StartedAt}}", cid))
            .timestamp() - launched_at
        )  # fmt: skip
        # Each worker logs its start; the container is ready with the last of them.
        log = logs(cid)
        logged = [r for r in parse(log) if r["service"] == service]
    if not logged:
        raise RuntimeError(f"{image} logged no start of {service}:\n{log[-3000:]}")
    last = max(logged, key=lambda r: r["ready_at"])
    p50 = statistics.median(latencies)
    return {
        "container_started_s": round(container_s, 3),
        "worker_started_s": round(last["started_at"] - launched_at, 3),
        **{k: last[k] for k in ("import_s", "load_s", "warm_up_s")},
        "ready_s": round(ready_s, 3),
        "first_answer_s": round(answered_s, 3),
        "first_ms": round(first_latency * 1000, 1),
        "steady_p50_ms": round(p50 * 1000, 1),
        "first_over_steady": round(first_latency / p50, 2),
    }


def measure(
    images: list[str], starts: int, tag: str | None = None, steady: int = 30
) -> dict[str, list[dict[str, Any]]]:
    """``starts`` starts of each of ``images`` (tagged ``tag``, default ``IMAGE_TAG`` or latest),
    each printed as it ends; the tokenizer's with the three runners up beside it on the same
    network."""
    if steady < 1:
        raise ValueError("steady: at least one answer after the first, to compare it with")
    tag = tag or os.environ.get("IMAGE_TAG", "latest")
    found: dict[str, list[dict[str, Any]]] = {}
    with network() as net:
        for image in [i for i in images if i != "tokenizer"]:
            found[image] = []
            for index in range(starts):
                found[image].append(one_start(image, net, tag, steady))
                print(f"{image} {index + 1}/{starts}: {found[image][-1]}", flush=True)
        if "tokenizer" in images:
            with runners(net, tag):
                found["tokenizer"] = []
                for index in range(starts):
                    found["tokenizer"].append(one_start("tokenizer", net, tag, steady))
                    print(f"tokenizer {index + 1}/{starts}: {found['tokenizer'][-1]}", flush=True)
    return found


@contextmanager
def runners(net: str, tag: str) -> Iterator[None]:
    """The three runners' containers on ``net`` under the names the tokenizer is given, ready."""
    suffix = f"--{uuid.uuid4().hex[:6]}"  # names are the engine's; the alias is the network's
    with (
        container(
            "onnx-runner", f"onnx-runner{suffix}", net, {"BUNDLE_ONNX_WORKERS": "1"}, tag
        ) as onnx,
        container("tf-runner", f"tf-runner{suffix}", net, {}, tag) as tf,
        container("tenant-runner", f"tenant-runner{suffix}", net, {}, tag) as tenant,
    ):
        for cid, _, launched in (onnx, tf, tenant):
            with httpx.Client(base_url=f"http://127.0.0.1:{port(cid)}") as client:
                ready(client, cid, launched)
        yield
