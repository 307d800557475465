"""`python -m tools.cpu_by_process -- COMMAND` (how tests/README.md's "Why not 20 minutes" split
CI's CPU): every process is grouped by what it is, the CPU it used during the run is counted, and
the command's exit status is passed on."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tools.cpu_by_process import Seen, group, main, table

# A child that uses about half a second of CPU, then exits 3.
BURN = (
    "import time, sys\n"
    "t = time.process_time()\n"
    "while time.process_time() - t < 0.5: pass\n"
    "time.sleep(0.3)\n"  # alive at a sample after its work
    "sys.exit(3)  # cpu-by-process-burn"
)


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        (
            "/app/.venv/bin/python -m _bentoml_impl.worker.service /home/bentoml/bento --fd 3 "
            "--service-name onnx_runner --backlog 2048",
            "BentoML worker: onnx_runner",
        ),
        (".venv/bin/bentoml serve . --host 127.0.0.1 --port 3000", "BentoML arbiter"),
        ("/tmp/x/.venv/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))", "pytest (and its xdist workers)"),
        (".venv/bin/python -m models.parity --catalogue c.yaml", "model builds and parity runs"),
        ("/usr/sbin/dockerd --data-root /var/lib/x", "Docker's engine and CLI"),
        ("runc --root /var/run/docker/runtime-runc/moby exec", "Docker's engine and CLI"),
        ("/usr/bin/python3 /usr/bin/docker-compose -p stack up", "Docker's engine and CLI"),
        ("python -c import urllib.request as u", "other Python (tests' servers, clients, probes)"),
        ("/usr/bin/sleep 5", "other: sleep"),
        ("", "other"),
    ],
)  # fmt: skip
def test_each_process_is_grouped_by_what_it_is(cmdline: str, expected: str) -> None:
    assert group(cmdline) == expected


def test_a_run_counts_its_processes_cpu_and_passes_its_status_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "seen.json"
    status = main(["--interval", "0.05", "--out", str(out), "--", sys.executable, "-c", BURN])
    assert status == 3
    data = json.loads(out.read_text())
    burn = [p for p in data["processes"] if "cpu-by-process-burn" in p["cmdline"]]
    assert len(burn) == 1 and burn[0]["cpu_at_start"] == 0  # started during the run
    assert burn[0]["cpu"] >= 0.4
    assert data["busy_s"] >= burn[0]["cpu"] * 0.9  # the machine was busy at least as long
    printed = capsys.readouterr().err
    assert "| other Python (tests' servers, clients, probes) |" in printed
    assert "not seen (processes shorter than a sample)" in printed


def test_a_process_alive_before_the_run_counts_only_what_it_used_during_it() -> None:
    seen = {
        (10, 1.0): Seen("/tmp/v/bin/python -m pytest -n 3", cpu_at_start=100.0, cpu=160.0),
        (11, 2.0): Seen("/usr/sbin/dockerd --data-root /d", cpu_at_start=0.0, cpu=30.0),
        (12, 3.0): Seen("/usr/bin/sleep 9", cpu_at_start=5.0, cpu=5.0),  # idle: not listed
    }
    lines = table({"wall_s": 60.0, "busy_s": 120.0}, seen).splitlines()
    assert lines[0].startswith("1:00, the machine busy 2.0 CPU-minutes (2.00 cores")
    assert lines[0].endswith("in the processes seen 1.5")
    assert lines[3:] == [
        "| pytest (and its xdist workers) | 1.00 | 1 |",
        "| Docker's engine and CLI | 0.50 | 1 |",
        "| not seen (processes shorter than a sample) | 0.50 | |",
    ]


def test_no_command_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--"])
    assert exit_.value.code == 2
