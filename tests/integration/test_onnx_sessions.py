"""The ONNX runner's engine sessions as its defaults build them on this machine: one-thread sessions
on the lanes, and a solo session per model on every lane's core whose threads stop spinning when a
run ends (serving/engines/onnx.py says why)."""

from __future__ import annotations

import time

import pytest

from models import store
from serving import catalogue
from serving.features import pad

MODEL = catalogue.current().models[0].name  # the default catalogue's embed model, MiniLM

STOP = "session.force_spinning_stop"


def entry(engine, key: str) -> str | None:
    try:
        return engine.session.get_session_options().get_session_config_entry(key)
    except RuntimeError:  # ORT's answer for a key never set
        return None


def idle_cpu_ms(engine) -> float:
    """CPU this process spends in the 50 ms after one run of ``engine``, while nothing runs: an
    engine whose threads spin between runs keeps a core busy meanwhile."""
    feeds = pad([[101, 7592, 2088, 102]])
    time.sleep(0.2)  # any other session's threads, spinning after an earlier run, have stopped
    engine(feeds)  # the first run builds the session's buffers
    engine(feeds)
    started = time.process_time()
    time.sleep(0.05)
    return (time.process_time() - started) * 1000


@pytest.fixture(scope="module")
def runner():
    from runners.onnx.service import OnnxRunner

    return OnnxRunner.inner()  # the service class itself: its sessions, without a server


def test_solo_sessions_stop_spinning_between_runs_and_the_others_keep_orts_default(
    runner,
) -> None:
    from runners.onnx.service import SETTINGS

    lanes = SETTINGS.lane_count
    # Every ONNX backend of every model of the catalogue (MiniLM's two, each demo's one).
    served = catalogue.current().models
    assert set(runner.batchers) == {
        (m.name, b) for m in served for b in m.backends if b in ("onnx", "onnx-int8")
    }
    assert {(MODEL, "onnx"), (MODEL, "onnx-int8")} <= set(runner.batchers)
    for batcher in runner.batchers.values():
        threads = batcher.engine.session.get_session_options().intra_op_num_threads
        if lanes == 1:  # one session per model on every core, no solo session
            assert batcher.solo is batcher.engine and threads == SETTINGS.threads
            # several sessions take turns on the one lane: an idle one does not spin
            assert entry(batcher.engine, STOP) == "1"
            continue
        assert entry(batcher.engine, STOP) is None  # ORT's default
        assert threads == 1 and batcher.lanes.count == lanes
        assert batcher.solo is not batcher.engine
        assert batcher.solo.session.get_session_options().intra_op_num_threads == lanes
        assert entry(batcher.solo, STOP) == "1"


def test_a_solo_session_leaves_the_cores_idle_after_a_run(runner) -> None:
    """What the setting does, seen from outside: in the 50 ms after a run, the process spends
    under 5 ms of CPU with a solo session, where the same model on the same threads with ORT's
    default spins past it. A CPU figure over an idle window, not a latency."""
    from runners.onnx.service import SETTINGS
    from serving.engines.onnx import OnnxEngine

    if SETTINGS.lane_count == 1:
        pytest.fail("this machine's defaults build no solo session (one lane): nothing to check")
    # the solo session first: the other's threads, once started, could spin through its window
    stopped = idle_cpu_ms(runner.batchers[(MODEL, "onnx")].solo)
    spinning = OnnxEngine(
        store.path_of(catalogue.current().models[0].store_name("onnx")) / "model.onnx",
        runner.specs[(MODEL, "onnx")].contract(),
        threads=SETTINGS.lane_count,
        providers=SETTINGS.providers,
    )
    spun = idle_cpu_ms(spinning)
    assert stopped < 5 < spun, (stopped, spun)  # measured here: ~0.1 ms against ~40 ms
