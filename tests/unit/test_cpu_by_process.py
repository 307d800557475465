"""`python -m tools.cpu_by_process -- COMMAND` (how tests/README.md's "Why not 20 minutes" split
CI's CPU): every process is grouped by what it is, the CPU it used during the run is counted, and
the command's exit status is passed on."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import psutil
import pytest

from tools.cpu_by_process import Seen, group, main, table

# A child that uses about half a second of CPU, then exits 3; its marker names the test's folder,
# as the tool reads every process of the machine.
BURN = (
    "import time, sys\n"
    "t = time.process_time()\n"
    "while time.process_time() - t < 0.5: pass\n"
    "time.sleep(0.3)\n"  # alive at a sample after its work
    "sys.exit(3)  # {marker}"
)
OTHER_PYTHON = "other Python (tests' servers, clients, probes)"


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
        (".venv/bin/python -m pytest -n 3", "pytest (and its xdist workers)"),
        # tools the tests run, on files in pytest's temporary folder
        ("/tmp/v/bin/python -m models.parity --catalogue /tmp/pytest-of-root/pytest-9/c0/c.yaml", "model builds and parity runs"),
        ("/usr/bin/wrk -t1 -c8 -d3s -s /tmp/pytest-of-root/pytest-9/bench0/bodies.lua http://x", "load generators"),
        ("/v/bin/python /v/bin/locust -f loadtests/locustfile.py --headless", "load generators"),
        (".venv/bin/uv pip install -q --compile-bytecode -e .", "package installs (bytecode compiled)"),
        ("/v/bin/python /root/.cache/uv/.tmpX/pip_compileall.py", "package installs (bytecode compiled)"),
        ("/usr/sbin/dockerd --data-root /var/lib/x", "Docker's engine, CLI, image builds"),
        ("runc --root /var/run/docker/runtime-runc/moby exec", "Docker's engine, CLI, image builds"),
        ("/usr/bin/python3 /usr/bin/docker-compose -p stack up", "Docker's engine, CLI, image builds"),
        ("haproxy -W -db -f /etc/haproxy/haproxy.cfg", "HAProxy, Prometheus"),
        ("python -c import urllib.request as u", OTHER_PYTHON),
        ("/v/bin/python -m serving.pipeline", OTHER_PYTHON),  # not an install
        ("[kworker/0:1-events]", "the kernel's threads"),
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
    marker = f"cpu-by-process-burn {tmp_path}"
    me = psutil.Process()
    before = sum(me.cpu_times()[:2])
    argv = ["--interval", "0.05", "--out", str(out), "--"]
    status = main([*argv, sys.executable, "-c", BURN.format(marker=marker)])
    after = sum(me.cpu_times()[:2])
    assert status == 3
    data = json.loads(out.read_text())
    burn = [p for p in data["processes"] if marker in p["cmdline"]]
    assert len(burn) == 1 and burn[0]["cpu_at_start"] == 0  # started during the run
    assert burn[0]["cpu"] >= 0.4
    # the machine was busy at least that long, and no longer than every core for the whole run
    assert burn[0]["cpu"] * 0.9 <= data["busy_s"] <= data["wall_s"] * psutil.cpu_count() * 1.05
    # this process, running before: the CPU it had used by the first sample is set apart
    (mine,) = [p for p in data["processes"] if p["pid"] == os.getpid()]
    assert before <= mine["cpu_at_start"] <= after
    header = capsys.readouterr().err.splitlines()[0]
    assert "cores on average" in header and header.startswith("0:0")


def test_a_process_alive_before_the_run_counts_only_what_it_used_during_it() -> None:
    seen = {
        (10, 1.0): Seen(10, "/tmp/v/bin/python -m pytest -n 3", cpu_at_start=100.0, cpu=160.0),
        (11, 2.0): Seen(11, "/usr/sbin/dockerd --data-root /d", cpu_at_start=0.0, cpu=30.0),
        (12, 3.0): Seen(12, "/usr/bin/sleep 9", cpu_at_start=5.0, cpu=5.0),  # idle: not listed
    }
    lines = table({"wall_s": 60.0, "busy_s": 120.0}, seen).splitlines()
    assert lines[0].startswith("1:00, the machine busy 2.0 CPU-minutes (2.00 cores")
    assert lines[0].endswith("in the processes seen 1.5")
    assert lines[3:] == [
        "| pytest (and its xdist workers) | 1.00 | 1 |",
        "| Docker's engine, CLI, image builds | 0.50 | 1 |",
        "| not seen by a sample | 0.50 | |",
    ]


def test_a_signal_that_ends_the_command_is_its_status_as_a_shell_gives_it() -> None:
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert main(["--interval", "0.05", "--", sys.executable, "-c", kill]) == 137


def test_a_command_that_cannot_start_or_none_at_all_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--", str(tmp_path / "no-such-program")]) == 127
    assert "cannot run" in capsys.readouterr().err
    for args in (["--"], ["--interval", "0", "--", "true"]):
        with pytest.raises(SystemExit) as exit_:
            main(args)
        assert exit_.value.code == 2
