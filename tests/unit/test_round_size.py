"""What the round-size measurement feeds the engine: the runner's planner on each round alone."""

from __future__ import annotations

import random

from loadtests.round_size import round_calls
from runners.onnx.settings import OnnxRunnerSettings


def test_calls_are_cut_within_each_round_and_cover_every_text_once() -> None:
    draw = random.Random(0)
    texts = [[i] * draw.randint(3, 60) for i in range(1, 101)]  # the first id names the text
    policy = OnnxRunnerSettings().policy
    for size in (4, 17, 100):
        batches, padding = round_calls(texts, size, policy)
        firsts = [row[0] for batch in batches for row in batch]
        assert sorted(firsts) == list(range(1, 101))  # each text in exactly one call
        for batch in batches:
            assert len({(row[0] - 1) // size for row in batch}) == 1  # one round a call
            assert len(batch) * max(map(len, batch)) <= policy.max_batch_tokens or len(batch) == 1
        assert 0 < padding <= 1
    # Sorting all at once pads less than rounds of 4 do.
    assert round_calls(texts, 100, policy)[1] > round_calls(texts, 4, policy)[1]


def test_the_call_cost_fit_recovers_an_engine_s_fixed_and_per_token_cpu(monkeypatch) -> None:
    """An engine whose thread CPU a call is exactly 1.2 ms + 150 us a padded token (a fake thread
    clock that each call advances): the fit gives both back, and only shapes of up to 256 padded
    tokens are timed."""
    import pytest

    from loadtests import round_size
    from serving.features import pad

    clock = [0.0]
    shapes = []

    def engine(feeds) -> None:
        rows, width = feeds["input_ids"].shape
        shapes.append(rows * width)
        clock[0] += 1.2e-3 + 150e-6 * rows * width

    monkeypatch.setattr(round_size.time, "thread_time", lambda: clock[0])
    per_call, per_token = round_size.call_cost(engine, pad)
    assert per_call == pytest.approx(1.2e-3) and per_token == pytest.approx(150e-6)
    assert max(shapes) == 256 and min(shapes) == 8
