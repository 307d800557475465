"""What one wake-up of an event loop costs on this host, in CPU (``make profile`` records it).

An event loop that has nothing to do sleeps in epoll; a socket, a timer or another thread's
hand-off wakes it. The wake-up is paid in CPU by the woken thread: the kernel's switch into it
and out again and, in a virtual machine, the exits that deliver the wake. So a thread's CPU per
request is partly its wake-ups per request (its voluntary context switches, ``cpu.wakeups``)
times this cost, which is the host's, not the code's.

The probe: a uvloop loop sleeps ``period_s`` at a time, ``wakes`` times, while a spinning process
holds every core, as the engine's lanes hold them under load (a woken thread then takes a core
from a busy one instead of leaving an idle one); its thread's CPU over the wakes is the cost of
each, ``asyncio.sleep``'s own Python (a few µs) included. The spinners are stopped by PID and
waited for.

    python -m loadtests.wake_cost
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import uvloop

SPIN = "while True: pass"


def wake_cost_us(wakes: int = 1500, period_s: float = 0.002) -> float:
    """CPU µs one wake-up of an event loop costs here with every core busy (the probe above)."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.2)  # the spinners are running before the first wake
        return uvloop.run(_sleeps(wakes, period_s))
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


async def _sleeps(wakes: int, period_s: float) -> float:
    started = time.thread_time()
    for _ in range(wakes):
        await asyncio.sleep(period_s)
    return (time.thread_time() - started) / wakes * 1e6


if __name__ == "__main__":
    print(f"{wake_cost_us():.1f} µs of CPU per wake-up of an event loop, every core busy")
