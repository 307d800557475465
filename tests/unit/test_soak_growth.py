"""How the soak judges growth: per process, after warm-up, the last third of the samples against
the first third; a restart counts as unbounded. Sockets are counted apart and judged at rest."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

from loadtests import soak
from testkit.processes import Server


def series(values: list[tuple[float, int]], start: int = 20, key: str = "1 w") -> list[dict]:
    return [
        {"t": start + 10 * i, "processes": {key: {"rss_mb": rss, "fds": fds}}}
        for i, (rss, fds) in enumerate(values)
    ]


def test_steady_growth_after_warm_up_shows() -> None:
    warm_up = [{"t": 0, "processes": {"1 w": {"rss_mb": 50.0, "fds": 5}}}]  # ignored
    leak = series([(100, 10), (110, 10), (120, 11), (130, 12), (140, 14), (150, 14)])
    grown = soak.growth(warm_up + leak, warmup_s=20)
    # 145 / 105 - 1; (14 - 10 - 2 descriptors of slack) / 10
    assert grown == {"1 w": {"rss_mb": 0.381, "fds": 0.2}}


def test_a_count_that_swings_with_the_load_is_not_growth() -> None:
    swinging = series([(100, 47), (100, 60), (100, 55), (100, 48), (100, 59), (100, 47)])
    assert soak.growth(swinging, warmup_s=20) == {"1 w": {"rss_mb": 0.0, "fds": 0.0}}


def test_a_few_descriptors_more_are_not_growth() -> None:
    """44 -> 49 descriptors (sockets of the tokenizer) is +11 %: 3 beyond the slack, +7 %."""
    few_more = series([(100, 44), (100, 44), (100, 47), (100, 46), (100, 49), (100, 49)])
    assert soak.growth(few_more, warmup_s=20) == {"1 w": {"rss_mb": 0.0, "fds": 0.0682}}


def test_a_process_that_restarts_is_unbounded_growth() -> None:
    restarted = series([(100, 10), (100, 10)]) + series([(100, 10)], start=40, key="2 w")
    grown = soak.growth(restarted, warmup_s=20)
    assert grown["1 w"]["rss_mb"] == float("inf") and grown["2 w"]["fds"] == float("inf")


def test_sockets_are_counted_apart_from_other_descriptors() -> None:
    sockets, other = soak.descriptors(os.getpid())
    a, b = socket.socketpair()
    with tempfile.TemporaryFile() as fh:
        assert soak.descriptors(os.getpid()) == (sockets + 2, other + 1)
        fh.write(b"x")
        # the sample reports the same split: sockets apart, not among the judged descriptors
        (figures,) = soak.sample([psutil.Process()]).values()
        assert (figures["sockets"], figures["fds"]) == (sockets + 2, other + 1)
    a.close()
    b.close()
    assert soak.descriptors(os.getpid()) == (sockets, other)


def test_a_socket_more_at_rest_than_the_slack_is_growth() -> None:
    before = {"1 tokenizer": 6, "2 tenant_runner": 6}
    assert soak.socket_growth(
        before, {"1 tokenizer": 6 + soak.SOCKET_SLACK, "2 tenant_runner": 5}
    ) == {
        "1 tokenizer": 0.0,
        "2 tenant_runner": 0.0,
    }
    leaked = soak.socket_growth(
        before, {"1 tokenizer": 6 + soak.SOCKET_SLACK + 3, "2 tenant_runner": 6}
    )
    assert leaked == {"1 tokenizer": 3.0, "2 tenant_runner": 0.0}


def test_a_process_restarted_between_the_counts_at_rest_is_unbounded() -> None:
    grown = soak.socket_growth({"1 w": 6}, {"3 w": 6})
    assert grown == {"1 w": float("inf"), "3 w": float("inf")}


# A process that opens a socket every 0.2 s and keeps it, or one that holds three still; each says
# "ready" once its first sockets are open, so a slow start is not counted as rest.
LEAKING = (
    "import socket, time\nheld = [socket.socket()]\nprint('ready', flush=True)\n"
    "while True:\n    held.append(socket.socket()); time.sleep(0.2)"
)
STILL = (
    "import socket, time\nheld = [socket.socket() for _ in range(3)]\n"
    "print('ready', flush=True)\ntime.sleep(60)"
)


def counted_at_rest(code: str, tmp_path: Path, timeout_s: float) -> tuple[dict[str, int], bool]:
    server = Server([sys.executable, "-c", code], port=0, log=tmp_path / "log")
    server.proc = subprocess.Popen(server.argv, stdout=subprocess.PIPE, text=True)
    try:
        assert server.proc.stdout is not None and server.proc.stdout.readline() == "ready\n"
        return asyncio.run(soak.at_rest(server, wait_s=0, timeout_s=timeout_s))
    finally:
        server.stop(grace_s=5)
        assert server.proc.poll() is not None


def test_sockets_that_hold_still_are_counted_at_rest(tmp_path: Path) -> None:
    counts, settled = counted_at_rest(STILL, tmp_path, timeout_s=20)
    assert settled and list(counts.values()) == [3], counts


def test_sockets_that_keep_changing_do_not_settle_and_say_so(tmp_path: Path) -> None:
    counts, settled = counted_at_rest(LEAKING, tmp_path, timeout_s=3)
    (held,) = counts.values()
    assert not settled and held > 1, counts
