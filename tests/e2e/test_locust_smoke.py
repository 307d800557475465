"""A headless Locust run against the real graph: mixed lengths, 16 users, 0 failures."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from loadtests.processes import ROOT

LOCUST = Path(sys.executable).parent / "locust"


def run_locust(
    host: str, user_class: str, users: int, seconds: int, out: Path
) -> tuple[subprocess.CompletedProcess, dict]:
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [
            str(LOCUST),
            "-f",
            "loadtests/locustfile.py",
            user_class,
            "--headless",
            "-u",
            str(users),
            "-r",
            str(users),
            "-t",
            f"{seconds}s",
            "--host",
            host,
            "--csv",
            str(out),
            "--only-summary",
            "--max-fail-ratio",
            "0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=seconds + 120,
    )
    with open(f"{out}_stats.csv") as fh:
        total = next(row for row in csv.DictReader(fh) if row["Name"] == "Aggregated")
    return proc, total


def test_locust_chat_16_users_20s_no_failures(graph: str) -> None:
    proc, total = run_locust(graph, "ChatUser", 16, 20, ROOT / "build" / "locust" / "smoke")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert int(total["Request Count"]) > 100
    assert int(total["Failure Count"]) == 0
