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
