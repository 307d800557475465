"""What one wake-up of an event loop costs on this host, in CPU (``make profile`` records it).

An event loop that has nothing to do sleeps in epoll; a socket, a timer or another thread's
hand-off wakes it. The wake-up is paid in CPU by the woken thread: the kernel's switch into it
and out again and, in a virtual machine, the exits that deliver the wake. So part of a thread's
CPU per request is about its wake-ups per request (its voluntary context switches,
``cpu.wakeups``, which also count waits for a lock) times this cost, which is the host's.

The probe: a uvloop loop sleeps ``period_s`` at a time, ``wakes`` times, while a spinning process
holds every core, as the engine's lanes hold them under load (a woken thread then takes a core
from a busy one instead of leaving an idle one). Its thread's CPU per sleep, less its CPU per
``asyncio.sleep(0)`` (a yield to the loop, which goes on without waiting), is the cost of one
wake-up, with the sleep's timer. Idle cores are not measured: the stack under load keeps them
busy.

The spinners stop on their own after ``SPIN_S`` (a probe killed before it could stop them leaves
none spinning for long), and are stopped by PID and checked gone when the probe ends.

    python -m loadtests.wake_cost
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import psutil
import uvloop

from loadtests.processes import stop_processes

SPIN_S = 60.0
SPIN = f"import time\nend = time.monotonic() + {SPIN_S}\nwhile time.monotonic() < end: pass"


def wake_cost_us(wakes: int = 1500, period_s: float = 0.002) -> float:
    """CPU µs one wake-up of an event loop costs here with every core busy (the probe above)."""
    spinners: list[psutil.Popen] = []
    try:
        for _ in range(os.cpu_count() or 1):
            spinners.append(psutil.Popen([sys.executable, "-c", SPIN]))
        time.sleep(0.2)  # the spinners are running before the first wake
        return uvloop.run(_per_wake_us(wakes, period_s))
    finally:
        if alive := stop_processes(spinners):
            raise RuntimeError(f"spinners still running: {[p.pid for p in alive]}")


async def _per_wake_us(wakes: int, period_s: float) -> float:
    slept = await _cpu_per_sleep(wakes, period_s)
    yielded = await _cpu_per_sleep(wakes, 0.0)
    return (slept - yielded) * 1e6


async def _cpu_per_sleep(times: int, period_s: float) -> float:
    started = time.thread_time()
    for _ in range(times):
        await asyncio.sleep(period_s)
    return (time.thread_time() - started) / times


if __name__ == "__main__":
    print(f"{wake_cost_us():.1f} µs of CPU per wake-up of an event loop, every core busy")
