"""Tenant isolation with per-tenant API keys on, and a tenant store that survives a restart.

A real graph with `BUNDLE_TOKENIZER_TENANT_KEYS_FILE` set: tenant A's key cannot classify with,
upload to, show or delete tenant B; no key is 401; keys never reach the logs; a revoked key stops
working without a restart; a graph SIGKILLed mid-upload and mid-training comes back on the same
store with every tenant on one complete version.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from loadtests.cpu import label
from models import demo_tenants as demo
from runners.tenants.loader import load
from runners.tenants.store import TenantStore
from testkit.processes import ROOT, bentoml_serve, log_path

TENANTS = {"alpha": 3, "bravo": 4}


def issue(keys_file: Path, tenant: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "services.tokenizer.keys", "issue", tenant, "--file", str(keys_file)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return proc.stdout.strip()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def examples(index: int) -> list[dict[str, str]]:
    return [{"text": t, "intent": i} for t, i in demo.tenant(index).train]


@pytest.fixture(scope="module")
def hardened(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("hardened")
    keys_file = root / "keys.json"
    keys = {name: issue(keys_file, name) for name in [*TENANTS, "*"]}
    env = {
        "BUNDLE_TENANTS_STORE": str(root / "tenants"),
        "BUNDLE_TOKENIZER_TENANT_KEYS_FILE": str(keys_file),
    }
    log = log_path("hardened-graph.log")
    server = bentoml_serve(".", log, env=env)
    with server, httpx.Client(base_url=server.url, timeout=60) as client:
        for name, index in TENANTS.items():
            resp = client.post(
                "/tenants/train",
                # Whole ONNX models: the crash test compares their files byte for byte.
                json={"tenant": name, "examples": examples(index), "format": "onnx"},
                headers=bearer(keys[name]),
            )
            assert resp.status_code == 200, resp.text
        yield {
            "client": client,
            "keys": keys,
            "keys_file": keys_file,
            "env": env,
            "log": log,
            "server": server,
        }


def test_keys_file_holds_hashes_only(hardened: dict) -> None:
    stored = hardened["keys_file"].read_text()
    assert all(key not in stored for key in hardened["keys"].values())
    assert hardened["keys_file"].stat().st_mode & 0o077 == 0  # readable by its owner only


def test_no_key_is_401_on_every_tenant_endpoint(hardened: dict) -> None:
    client = hardened["client"]
    for path, body in [
        ("/classify", {"tenant": "alpha", "texts": ["hi"]}),
        ("/tenants/show", {"tenant": "alpha"}),
        ("/tenants/delete", {"tenant": "alpha"}),
        ("/tenants/train", {"tenant": "alpha", "examples": examples(3)}),
        ("/tenants/list", {}),
    ]:
        resp = client.post(path, json=body)
        assert resp.status_code == 401, (path, resp.text)
        assert "Authorization: Bearer" in resp.json()["error"]
    wrong = client.post(
        "/classify", json={"tenant": "alpha", "texts": ["hi"]}, headers=bearer("not-a-key")
    )
    assert wrong.status_code == 403


def test_a_tenant_key_reaches_its_own_tenant_only(hardened: dict, tmp_path: Path) -> None:
    client, keys = hardened["client"], hardened["keys"]
    alpha = bearer(keys["alpha"])
    own = client.post("/classify", json={"tenant": "alpha", "texts": ["hello"]}, headers=alpha)
    assert own.status_code == 200, own.text
    bravo_version = client.post(
        "/classify", json={"tenant": "bravo", "texts": ["hi"]}, headers=bearer(keys["bravo"])
    ).json()["version"]

    refused = [
        client.post("/classify", json={"tenant": "bravo", "texts": ["hi"]}, headers=alpha),
        client.post("/tenants/show", json={"tenant": "bravo"}, headers=alpha),
        client.post("/tenants/delete", json={"tenant": "bravo"}, headers=alpha),
        client.post(
            "/tenants/train", json={"tenant": "bravo", "examples": examples(9)}, headers=alpha
        ),
        client.post(
            "/tenants/upload",
            data={"tenant": "bravo"},
            files={"file": ("m.tar.gz", b"\x1f\x8b whatever", "application/gzip")},
            headers=alpha,
        ),
        client.post("/tenants/list", json={}, headers=alpha),  # the operator's only
    ]
    assert [r.status_code for r in refused] == [403] * len(refused), [r.text for r in refused]
    assert "bravo" in refused[0].json()["error"]
    # B is untouched: same version, still serving with its own key.
    after = client.post(
        "/classify", json={"tenant": "bravo", "texts": ["hi"]}, headers=bearer(keys["bravo"])
    )
    assert after.status_code == 200 and after.json()["version"] == bravo_version
    # The operator key may act on any tenant and list them.
    listed = client.post("/tenants/list", json={}, headers=bearer(keys["*"]))
    assert listed.status_code == 200 and set(listed.json()) >= set(TENANTS)


def test_a_revoked_key_stops_working_without_a_restart(hardened: dict) -> None:
    client, keys_file = hardened["client"], hardened["keys_file"]
    key = issue(keys_file, "charlie")
    trained = client.post(
        "/tenants/train", json={"tenant": "charlie", "examples": examples(5)}, headers=bearer(key)
    )
    assert trained.status_code == 200, trained.text
    subprocess.run(
        [sys.executable, "-m", "services.tokenizer.keys", "revoke", "charlie", "--file", str(keys_file)],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    resp = client.post(
        "/classify", json={"tenant": "charlie", "texts": ["hi"]}, headers=bearer(key)
    )
    assert resp.status_code == 403


def test_keys_are_never_logged(hardened: dict) -> None:
    log = Path(hardened["log"]).read_text(errors="replace")
    assert "Bearer" not in log
    assert all(key not in log for key in hardened["keys"].values())


class Loop(threading.Thread):
    """One kind of request sent over and over until stopped; ``busy`` while one is unanswered."""

    def __init__(self, url: str, send) -> None:
        super().__init__(daemon=True)
        self.url, self.send = url, send
        self.stop = threading.Event()
        self.busy = threading.Event()
        self.answered: list[httpx.Response] = []

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=120) as client:
            turn = 0
            while not self.stop.is_set():
                self.busy.set()
                try:
                    self.answered.append(self.send(client, turn))
                except httpx.HTTPError:
                    return  # the server is gone
                finally:
                    self.busy.clear()
                turn += 1


def test_the_store_survives_a_crash_mid_upload_and_mid_training(
    hardened: dict, tmp_path: Path
) -> None:
    """Uploads to alpha and trainings of bravo run back to back, classify traffic beside them,
    and the whole graph is SIGKILLed while an upload and a training are both in flight. After a
    restart on the same store each tenant serves one complete version (the one it had, or one that
    was being published): it loads, classifies its own phrases, and its files are byte for byte
    those of one published model, never a mix."""
    client, keys, server = hardened["client"], hardened["keys"], hardened["server"]
    store = TenantStore(Path(hardened["env"]["BUNDLE_TENANTS_STORE"]))
    operator = bearer(keys["*"])
    # Two trained models to upload to alpha in turn: what may become alpha's version.
    archives = {}
    for donor, index in (("donor-a", 6), ("donor-b", 7)):
        trained = client.post(
            "/tenants/train",
            json={"tenant": donor, "examples": examples(index), "format": "onnx"},
            headers=operator,
        )
        assert trained.status_code == 200, trained.text
        archives[donor] = store.archive(donor, tmp_path / f"{donor}.tar.gz")
    # What each tenant may end up serving: demo index -> the model's bytes (None: any training).
    candidates = {
        "alpha": {3: model_bytes(store, "alpha"), 6: model_bytes(store, "donor-a"), 7: model_bytes(store, "donor-b")},
        "bravo": {4: None, 8: None},
    }  # fmt: skip

    def upload(c: httpx.Client, turn: int) -> httpx.Response:
        donor = ("donor-a", "donor-b")[turn % 2]
        with archives[donor].open("rb") as fh:
            return c.post(
                "/tenants/upload",
                data={"tenant": "alpha"},
                files={"file": (f"{donor}.tar.gz", fh, "application/gzip")},
                headers=operator,
            )

    published: dict[str, bytes] = {}  # bravo's versions as the trainings published them

    def train(c: httpx.Client, turn: int) -> httpx.Response:
        body = {"tenant": "bravo", "examples": examples((8, 4)[turn % 2]), "format": "onnx"}
        reply = c.post("/tenants/train", json=body, headers=operator)
        if reply.status_code == 200:  # read back at once, before a later training prunes it
            version = reply.json()["version"]
            with contextlib.suppress(FileNotFoundError):
                path = store.root / "bravo" / "versions" / version / "model.onnx"
                published[version] = path.read_bytes()
        return reply

    def classify(c: httpx.Client, turn: int) -> httpx.Response:
        name = ("alpha", "bravo")[turn % 2]
        body = {"tenant": name, "texts": ["where is my order"]}
        return c.post("/classify", json=body, headers=bearer(keys[name]))

    loops = [Loop(server.url, send) for send in (upload, train, classify)]
    for loop in loops:
        loop.start()
    uploads, trainings, classifies = loops
    deadline = time.monotonic() + 120
    # Wait for a published upload and training, then for a moment both have one in flight.
    while not (
        uploads.answered
        and trainings.answered
        and uploads.busy.is_set()
        and trainings.busy.is_set()
    ):
        assert time.monotonic() < deadline, "no moment with an upload and a training in flight"
        time.sleep(0.005)
    workers = server.descendants()
    roles = {label(p) for p in workers}
    killed = server.kill()
    for loop in loops:
        loop.stop.set()
    for loop in loops:
        loop.join(30)
    # The arbiter and every service's worker, by PID.
    assert {"tokenizer", "onnx_runner", "tf_runner", "tenant_runner"} <= roles, roles
    assert killed == [server.proc.pid, *(p.pid for p in workers)]
    assert not any(psutil.pid_exists(pid) for pid in killed)
    assert all(r.status_code == 200 for loop in loops for r in loop.answered), [
        r.text for loop in loops for r in loop.answered if r.status_code != 200
    ]
    assert classifies.answered, "classify traffic was running"

    restarted = bentoml_serve(".", log_path("hardened-restart.log"), env=hardened["env"])
    with restarted as again, httpx.Client(base_url=again.url, timeout=60) as second:
        for name, allowed in candidates.items():
            version, path = store.current(name)
            model = load(name, version, path)  # loads: complete and valid
            served_by = [i for i in allowed if set(model.labels) == labels_of(i)]
            assert len(served_by) == 1, (name, model.labels)  # one published model's labels …
            index = served_by[0]
            # … with that model's own bytes, never a mix: an upload's archive, or what a training
            # published (unless it is the training cut short by the kill after it published)
            expected = allowed[index] if allowed[index] is not None else published.get(version)
            if expected is not None:
                assert (path / "model.onnx").read_bytes() == expected, name
            shown = second.post("/tenants/show", json={"tenant": name}, headers=operator).json()
            assert shown["version"] == version
            phrases = demo.tenant(index).train[:5]
            reply = second.post(
                "/classify",
                json={"tenant": name, "texts": [t for t, _ in phrases]},
                headers=bearer(keys[name]),
            )
            assert reply.status_code == 200, reply.text
            assert reply.json()["version"] == version
            assert reply.json()["intents"] == [i for _, i in phrases], name


def model_bytes(store: TenantStore, name: str) -> bytes:
    return (store.current(name)[1] / "model.onnx").read_bytes()


def labels_of(index: int) -> set[str]:
    return {intent for _, intent in demo.tenant(index).train}
