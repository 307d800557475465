"""Tenant isolation with per-tenant API keys on, and a tenant store that survives a restart.

A real graph with `BUNDLE_TOKENIZER_TENANT_KEYS_FILE` set: tenant A's key cannot classify with,
upload to, show or delete tenant B; no key is 401; keys never reach the logs; a revoked key stops
working without a restart; after the server is stopped and started again on the same store, every
tenant answers with the version it had.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loadtests.processes import ROOT, bentoml_serve
from runners.tenants import demo
from tests.e2e.conftest import log_path

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
                json={"tenant": name, "examples": examples(index)},
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


def test_the_store_survives_a_crash_and_restart_with_every_version(hardened: dict) -> None:
    client, keys = hardened["client"], hardened["keys"]
    operator = bearer(keys["*"])
    before = {
        name: client.post("/tenants/show", json={"tenant": name}, headers=operator).json()
        for name in TENANTS
    }
    # A crash, not a shutdown: SIGKILL to the server's whole process group, workers included.
    server = hardened["server"]
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(30)
    restarted = bentoml_serve(".", log_path("hardened-restart.log"), env=hardened["env"])
    with restarted as again, httpx.Client(base_url=again.url, timeout=60) as second:
        listed = second.post("/tenants/list", json={}, headers=operator).json()
        assert set(listed) >= set(TENANTS)
        for name, index in TENANTS.items():
            shown = second.post("/tenants/show", json={"tenant": name}, headers=operator)
            assert shown.json()["version"] == before[name]["version"]
            text, intent = demo.tenant(index).train[0]
            reply = second.post(
                "/classify",
                json={"tenant": name, "texts": [text]},
                headers=bearer(keys[name]),
            )
            assert reply.status_code == 200, reply.text
            assert reply.json()["intents"] == [intent]
            assert reply.json()["version"] == before[name]["version"]
