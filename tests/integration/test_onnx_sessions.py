"""The ONNX runner's engine sessions as its defaults build them on this machine: one-thread sessions
on the lanes, and a solo session per model on every lane's core whose threads stop spinning when a
run ends (serving/engines/onnx.py says why)."""

from __future__ import annotations

import pytest

STOP = "session.force_spinning_stop"


def entry(engine, key: str) -> str | None:
    try:
        return engine.session.get_session_options().get_session_config_entry(key)
    except RuntimeError:  # ORT's answer for a key never set
        return None


@pytest.fixture(scope="module")
def runner():
    from runners.onnx.service import OnnxRunner

    return OnnxRunner.inner()  # the service class itself: its sessions, without a server


def test_lane_sessions_spin_and_solo_sessions_stop_spinning_between_runs(runner) -> None:
    from runners.onnx.service import SETTINGS

    lanes = SETTINGS.lane_count
    assert set(runner.batchers) == {"fp32", "int8"}
    for batcher in runner.batchers.values():
        threads = batcher.engine.session.get_session_options().intra_op_num_threads
        assert entry(batcher.engine, STOP) is None  # ORT's default: spin between runs
        if lanes == 1:  # one session per model on every core, no solo session
            assert batcher.solo is batcher.engine and threads == SETTINGS.threads
            continue
        assert threads == 1 and batcher.lanes.count == lanes
        assert batcher.solo is not batcher.engine
        assert batcher.solo.session.get_session_options().intra_op_num_threads == lanes
        assert entry(batcher.solo, STOP) == "1"
