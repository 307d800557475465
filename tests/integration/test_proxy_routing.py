"""The routing model (testkit/haproxy_ring.py, which `make simulate-replicas` runs) against a real
HAProxy running the tenant backend's own directives from deploy/proxy/haproxy.cfg: every tenant
lands where the model says, a replica added takes only keys the model moves to it, and a hot tenant's
concurrent requests spread exactly as the model's bounded load spreads them. And each proxy config's
logging (a failed request logged, a served one not) and retries (a request a dying replica closes
unanswered is answered by another, its body arriving after its headers).

HAProxy (Debian's, unpacked by `make tools`) and the backends (tiny HTTP servers, one per replica
or one process for two, each replica naming itself) bind 127.0.0.1 and are stopped by PID and
checked gone."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from testkit.haproxy_ring import Ring
from testkit.processes import free_port, stop_processes
from tests.integration.test_proxy_config import COMPOSE_CFG, K8S_CFG, haproxy, section

# A replica: answers every GET with its name after ?sleep= seconds.
BACKEND = """
import sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse
name = sys.argv[2].encode()
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(float(parse_qs(urlparse(self.path).query).get("sleep", ["0"])[0]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(name)))
        self.end_headers()
        self.wfile.write(name)
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""
KEYS = [f"tenant-{i:05d}" for i in range(300)]


def config(front: int, ports: list[int]) -> str:
    """The tenant backend's directives as deploy/proxy/haproxy.cfg has them (rule, weights, ids),
    its servers here on loopback."""
    rule = [
        line for line in section(COMPOSE_CFG.read_text(), "backend tenant-runners")
        if not line.startswith(("server ", "option httpchk"))
    ]  # fmt: skip
    servers = [f"server r{i} 127.0.0.1:{port} id {i} weight 16" for i, port in enumerate(ports, 1)]
    return "\n".join(
        ["global", "  maxconn 512", "defaults", "  mode http", "  timeout connect 2s",
         "  timeout client 30s", "  timeout server 30s",
         "frontend front", f"  bind 127.0.0.1:{front}", "  default_backend tenant-runners",
         "backend tenant-runners", *(f"  {line}" for line in rule), *(f"  {s}" for s in servers)]
    ) + "\n"  # fmt: skip


class Proxy:
    def __init__(self, tmp: Path, replicas: int) -> None:
        self.ports = [free_port() for _ in range(replicas)]
        self.front = free_port()
        cfg = tmp / f"haproxy-{replicas}.cfg"
        cfg.write_text(config(self.front, self.ports))
        self.procs = [
            subprocess.Popen([sys.executable, "-c", BACKEND, str(port), f"r{i}"])
            for i, port in enumerate(self.ports, 1)
        ]
        self.procs.append(subprocess.Popen([*haproxy(), "-db", "-f", str(cfg)]))
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.front}", timeout=10)
        deadline = time.monotonic() + 20
        while not self.all_up():
            assert time.monotonic() < deadline, "HAProxy or a backend did not start"
            time.sleep(0.1)

    def all_up(self) -> bool:
        for port in self.ports:
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
            except httpx.TransportError:
                return False
        try:
            return self.route("probe") > 0
        except httpx.TransportError:
            return False

    def route(self, key: str, sleep: float = 0) -> int:
        reply = self.client.get("/", params={"sleep": sleep}, headers={"X-Bundle-Tenant": key})
        assert reply.status_code == 200, reply.text
        # One at a time, 20 ms apart: with bounded load, a request HAProxy still counts in flight
        # on a server would send the next one elsewhere (tested on its own below).
        time.sleep(0.02)
        return int(reply.text[1:])

    def stop(self) -> None:
        self.client.close()
        pids = [proc.pid for proc in self.procs]
        stop_processes([psutil.Process(pid) for pid in pids if psutil.pid_exists(pid)])
        for proc in self.procs:
            proc.wait(timeout=10)
        assert not [pid for pid in pids if psutil.pid_exists(pid)]


@pytest.fixture
def proxies(tmp_path: Path) -> Iterator[callable]:
    started: list[Proxy] = []

    def start(replicas: int) -> Proxy:
        started.append(Proxy(tmp_path, replicas))
        return started[-1]

    yield start
    for proxy in started:
        proxy.stop()


def test_every_tenant_goes_where_the_model_says_and_an_added_replica_moves_only_its_own(
    proxies,
) -> None:
    three, four = proxies(3), proxies(4)
    on_three = {key: three.route(key) for key in KEYS}
    on_four = {key: four.route(key) for key in KEYS}
    assert on_three == {key: Ring([1, 2, 3], weight=16).server(key) for key in KEYS}
    assert on_four == {key: Ring([1, 2, 3, 4], weight=16).server(key) for key in KEYS}
    moved = [key for key in KEYS if on_three[key] != on_four[key]]
    assert all(on_four[key] == 4 for key in moved)  # only to the new replica
    assert len(moved) / len(KEYS) <= 1 / 4 + 0.08, len(moved)


def test_a_hot_tenants_concurrent_requests_spread_as_the_bounded_load_model_says(proxies) -> None:
    proxy = proxies(3)
    concurrent = 12
    # All 12 are in flight at once (each held 1.5 s): the model, fed the same arrivals.
    ring, in_flight = Ring([1, 2, 3], weight=16), {1: 0, 2: 0, 3: 0}
    for _ in range(concurrent):
        in_flight[ring.bounded("hot-tenant", in_flight, factor=150)] += 1
    with ThreadPoolExecutor(concurrent) as pool:
        served = Counter(pool.map(lambda _: proxy.route("hot-tenant", 1.5), range(concurrent)))
    assert served == Counter(in_flight), (served, in_flight)
    # No replica above 1.5x the mean: the hot tenant spilled instead of queueing on one.
    assert max(served.values()) <= 1.5 * concurrent / 3


@pytest.mark.parametrize(
    ("path", "resolvers"),
    [(COMPOSE_CFG, "resolvers docker"), (K8S_CFG, "resolvers kube")],
    ids=["compose", "kubernetes"],
)
def test_the_proxy_logs_a_failed_request_and_not_a_served_one(
    tmp_path: Path, path: Path, resolvers: str
) -> None:
    """Each proxy config's own global, resolvers and defaults sections: a request no replica
    answers (503, marked ``no_replica``) is logged with HAProxy's termination state, a served one is not. HAProxy logs
    requests at "info", errors included, and the log line keeps "notice" and above: errors are
    raised to "err" (log-separate-errors); without it this test finds no line at all."""
    cfg = path.read_text()
    sections = ("global", resolvers, "defaults")
    head = [
        f"{name}\n" + "".join(f"  {line}\n" for line in section(cfg, name)) for name in sections
    ]
    front, closed = free_port(), free_port()
    written = tmp_path / "haproxy.cfg"
    written.write_text(
        "".join(head)
        + f"frontend public\n  bind 127.0.0.1:{front}\n  use_backend served if {{ path /served }}\n"
        + "  default_backend gone\n"
        + "backend served\n  http-request return status 200\n"
        + f"backend gone\n  server replica 127.0.0.1:{closed}\n"
    )
    log = tmp_path / "haproxy.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([*haproxy(), "-db", "-f", str(written)], stdout=out, stderr=out)
    try:
        url = f"http://127.0.0.1:{front}"
        deadline = time.monotonic() + 20
        while True:
            try:
                served = httpx.get(f"{url}/served", timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "HAProxy did not start"
                time.sleep(0.1)
        failed = httpx.get(f"{url}/unanswered", timeout=10)
        assert (served.status_code, failed.status_code) == (200, 503)
        # Marked, for the tokenizer to wait for a replica (services/tokenizer/replica_wait.py).
        assert failed.json()["no_replica"] is True and failed.headers["retry-after"] == "1"
        deadline = time.monotonic() + 5
        while "/unanswered" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop_processes([psutil.Process(proc.pid)])
        proc.wait(timeout=10)
    assert not psutil.pid_exists(proc.pid)
    requests = [line for line in log.read_text().splitlines() if '"GET ' in line]
    assert len(requests) == 1 and '"GET /unanswered' in requests[0], requests
    # Status, bytes, two cookies, then the termination state: "SC--", the server side (S) ended it
    # while connecting (C): the replica refused, or its health check had already marked it down.
    # ("sC--": the connect timed out.)
    assert re.search(r" 503 \d+ \S+ \S+ [sS][A-Z]-- ", requests[0]), requests


@pytest.mark.parametrize("path", [COMPOSE_CFG, K8S_CFG], ids=["compose", "kubernetes"])
@pytest.mark.parametrize("kind", ["onnx", "tf"])
def test_a_runner_call_goes_to_its_models_own_service_where_one_is_declared(
    tmp_path: Path, path: Path, kind: str
) -> None:
    """The runner frontend's own rules from each proxy config, with one model given a service of
    its own (a backend named for it) as deploy/README.md shows: that model's calls reach its
    service whatever the header's case, every other model's and calls naming none reach the
    shared one."""
    rules = [
        line for line in section(path.read_text(), f"frontend {kind}-runner")
        if not line.startswith(("bind ", "http-response "))
    ]  # fmt: skip
    front = free_port()
    written = tmp_path / "haproxy.cfg"
    written.write_text(
        "defaults\n  mode http\n  timeout connect 2s\n  timeout client 5s\n  timeout server 5s\n"
        + f"frontend {kind}-runner\n  bind 127.0.0.1:{front}\n"
        + "".join(f"  {line}\n" for line in rules)
        + f"backend {kind}-runners\n  http-request return status 200 content-type text/plain string shared\n"
        + f"backend {kind}-runners-tiny-roberta\n  http-request return status 200 content-type text/plain string own\n"
    )
    proc = subprocess.Popen([*haproxy(), "-db", "-f", str(written)])
    try:
        deadline = time.monotonic() + 20
        while not listening(front):
            assert time.monotonic() < deadline, "HAProxy did not start"
            time.sleep(0.1)

        def routed(headers: dict[str, str]) -> str:
            return httpx.post(f"http://127.0.0.1:{front}/embed", headers=headers).text

        assert routed({"X-Bundle-Model": "tiny-roberta"}) == "own"
        assert routed({"X-Bundle-Model": "Tiny-RoBERTa"}) == "own"
        assert routed({"X-Bundle-Model": "all-MiniLM-L6-v2"}) == "shared"
        assert routed({}) == "shared"
    finally:
        stop_processes([psutil.Process(proc.pid)])
        proc.wait(timeout=10)
    assert not psutil.pid_exists(proc.pid)


# Two replicas in one process. The one that gets the first POST to /die is dying from then on, as a
# replica being stopped is (its listening socket still open, its worker gone): it closes that
# request and every later one unanswered. Every other request is answered with the replica's port,
# over keep-alive.
CLOSING_BACKEND = """
import socket, sys, threading
dying = set()
def serve(conn, port):
    buf = b""
    while True:
        while b"\\r\\n\\r\\n" not in buf:
            data = conn.recv(65536)
            if not data:
                conn.close(); return
            buf += data
        head, buf = buf.split(b"\\r\\n\\r\\n", 1)
        lines = head.decode().split("\\r\\n")
        length = next((int(l.split(":")[1]) for l in lines if l.lower().startswith("content-length")), 0)
        if lines[0].split()[1] == "/die" and not dying:
            dying.add(port)
        if port in dying:
            print(f"closed unanswered on {port}", flush=True)
            conn.close(); return
        while len(buf) < length:
            data = conn.recv(65536)
            if not data:
                conn.close(); return
            buf += data
        buf = buf[length:]
        body = str(port).encode()
        conn.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\n\\r\\n%s" % (len(body), body))
def listen(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port)); s.listen(64)
    while True:
        conn, _ = s.accept()
        threading.Thread(target=serve, args=(conn, port), daemon=True).start()
for port in sys.argv[1:]:
    threading.Thread(target=listen, args=(int(port),), daemon=True).start()
threading.Event().wait()
"""


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize(
    ("path", "resolvers", "buffered"),
    [
        (COMPOSE_CFG, "resolvers docker", True),
        (K8S_CFG, "resolvers kube", True),
        (COMPOSE_CFG, "resolvers docker", False),
    ],
    ids=["compose", "kubernetes", "compose-without-http-buffer-request"],
)
def test_a_request_a_dying_replica_closes_unanswered_is_answered_by_another(
    tmp_path: Path, path: Path, resolvers: str, buffered: bool
) -> None:
    """Each proxy config's own global, resolvers and defaults sections, two replicas, one client
    connection kept alive (as a load balancer's clients keep theirs): after a first request, a POST
    whose body is written 0.3 s after its headers (httpx writes them apart) reaches a replica that
    closes it unanswered, as one being stopped in a rolling update can. It is sent again to the
    other replica and answered. Without ``option http-buffer-request`` HAProxy forwards the headers
    before the body arrives, cannot send the request again, and closes the client's connection with
    no answer and no log line: the likely cause of the one request a Swarm rolling update once
    failed (tests/swarm), with nothing in HAProxy's log."""
    cfg = path.read_text()
    if not buffered:
        assert "  option http-buffer-request\n" in cfg
        cfg = cfg.replace("  option http-buffer-request\n", "")
    head = [
        f"{name}\n" + "".join(f"  {line}\n" for line in section(cfg, name))
        for name in ("global", resolvers, "defaults")
    ]
    front, ports = free_port(), [free_port(), free_port()]
    written = tmp_path / "haproxy.cfg"
    written.write_text(
        "".join(head)
        + f"frontend public\n  bind 127.0.0.1:{front}\n  default_backend replicas\n"
        + "backend replicas\n  balance leastconn\n"
        + "".join(f"  server r{i} 127.0.0.1:{port}\n" for i, port in enumerate(ports, 1))
    )
    log = tmp_path / "replicas.log"  # the replicas' lines and HAProxy's log, in one file
    body = b'{"texts": ["hello"]}'

    def closed() -> set[str]:
        return set(re.findall(r"closed unanswered on (\d+)", log.read_text()))

    def late_body() -> Iterator[bytes]:
        if buffered:
            time.sleep(0.3)  # HAProxy waits for it, and forwards nothing meanwhile
        else:  # until the replica is closing the request: HAProxy forwarded it bodiless
            deadline = time.monotonic() + 10
            while not closed():
                assert time.monotonic() < deadline, "the request never reached a replica"
                time.sleep(0.02)
        yield body

    with open(log, "w") as out:
        procs = [
            subprocess.Popen([sys.executable, "-c", CLOSING_BACKEND, *map(str, ports)], stdout=out)
        ]
        try:
            # The replicas listen before HAProxy starts: its first health check would otherwise
            # find one refusing and hold it down for rise x inter (4 s), leaving the retry nowhere
            # to go.
            deadline = time.monotonic() + 20
            while not all(listening(port) for port in ports):
                assert time.monotonic() < deadline, "the replicas did not start"
                time.sleep(0.05)
            procs.append(
                subprocess.Popen([*haproxy(), "-db", "-f", str(written)], stdout=out, stderr=out)
            )
            with httpx.Client(base_url=f"http://127.0.0.1:{front}", timeout=10) as client:
                deadline = time.monotonic() + 20
                while True:
                    try:
                        first = client.post("/ok", content=body)
                        break
                    except httpx.TransportError:
                        assert time.monotonic() < deadline, "HAProxy did not start"
                        time.sleep(0.1)
                assert first.status_code == 200
                headers = {"content-length": str(len(body))}
                if buffered:
                    second = client.post("/die", content=late_body(), headers=headers)
                    assert second.status_code == 200, second.text
                    answered_by = int(second.text)
                    # HAProxy logs a request as its stream ends, which can be after the client
                    # has the answer: wait for the line before stopping it.
                    deadline = time.monotonic() + 10
                    while '"POST /die' not in log.read_text() and time.monotonic() < deadline:
                        time.sleep(0.05)
                else:
                    with pytest.raises(httpx.RemoteProtocolError, match="without sending a resp"):
                        client.post("/die", content=late_body(), headers=headers)
                    time.sleep(0.5)  # a line HAProxy wrote as the stream ended would be in by now
        finally:
            live = [psutil.Process(proc.pid) for proc in procs if psutil.pid_exists(proc.pid)]
            stop_processes(live)
            for proc in procs:
                proc.wait(timeout=10)
    assert not [proc.pid for proc in procs if psutil.pid_exists(proc.pid)]
    dying = closed()
    assert len(dying) == 1, log.read_text()  # the request did reach the replica that closed it
    if buffered:
        assert answered_by != int(dying.pop())  # and the other one answered it
        assert '"POST /die' in log.read_text()  # HAProxy logs a redispatched request here
    else:  # and HAProxy closed the client's connection without a word in its log
        assert '"POST /die' not in log.read_text(), log.read_text()
