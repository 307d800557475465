"""Every Locust user class, headless for a few seconds against the real graph, with 0 failures."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from models import demo_tenants as demo
from testkit.processes import ROOT

LOCUST = Path(sys.executable).parent / "locust"


def run_locust(
    host: str, user_class: str, users: int, seconds: int, out: Path, *extra: str
) -> tuple[subprocess.CompletedProcess, dict]:
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [str(LOCUST), "-f", "loadtests/locustfile.py", user_class, "--headless", "-u", str(users), "-r", str(users),
            "-t", f"{seconds}s", "--host", host, "--csv", str(out), "--only-summary", "--max-fail-ratio", "0", *extra]  # fmt: skip
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120)
    with open(f"{out}_stats.csv") as fh:
        total = next(row for row in csv.DictReader(fh) if row["Name"] == "Aggregated")
    return proc, total


def test_locust_chat_16_users_20s_no_failures(graph: str) -> None:
    """Issue 3's smoke: mixed lengths, 16 users, 20 s."""
    proc, total = run_locust(graph, "ChatUser", 16, 20, ROOT / "build" / "locust" / "smoke")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert int(total["Request Count"]) > 100
    assert int(total["Failure Count"]) == 0


@pytest.fixture(scope="module")
def demo_tenants(client: httpx.Client) -> int:
    """Three demo tenants trained through the public API, for TenantUser."""
    for index in (1, 2, 3):
        spec = demo.tenant(index)
        examples = [{"text": t, "intent": i} for t, i in spec.train]
        client.post(
            "/tenants/train", json={"tenant": spec.name, "examples": examples}
        ).raise_for_status()
    return 3


@pytest.mark.parametrize(
    "user_class", ["BulkUser", "SimilarityUser", "InferenceUser", "TenantUser"]
)
def test_each_user_class_runs_without_failures(
    graph: str, demo_tenants: int, user_class: str
) -> None:
    proc, total = run_locust(
        graph,
        user_class,
        4,
        3,
        ROOT / "build" / "locust" / user_class,
        "--tenants",
        str(demo_tenants),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert int(total["Request Count"]) > 0
    assert int(total["Failure Count"]) == 0
