import random

import pytest

from serving.batching import efficiency, plan


@pytest.mark.parametrize("seed", range(20))
def test_every_index_planned_once_and_budget_respected(seed: int) -> None:
    rng = random.Random(seed)
    lengths = [rng.randint(1, 300) for _ in range(rng.randint(1, 200))]
    budget, rows = rng.choice([64, 256, 1024]), rng.choice([4, 16, 64])
    groups = plan(lengths, budget, rows)
    planned = sorted(i for g in groups for i in g.indices)
    assert planned == list(range(len(lengths)))
    for g in groups:
        assert g.width == max(lengths[i] for i in g.indices)
        assert len(g.indices) <= rows
        # Over budget only when a single sequence is longer than the budget by itself.
        assert g.padded_tokens <= budget or len(g.indices) == 1


def test_single_over_budget_sequence_gets_its_own_group() -> None:
    groups = plan([5, 500, 6], max_tokens=64, max_rows=8)
    assert [g.indices for g in groups] == [(0, 2), (1,)]


def test_sorting_keeps_padding_small_on_mixed_lengths() -> None:
    rng = random.Random(0)
    lengths = [rng.choice([4, 8, 12, 40, 90, 120]) for _ in range(256)]
    sorted_plan = plan(lengths, 1024, 64)
    # The naive design: arrival order, padded to the longest of each batch of 32.
    naive = sum(max(lengths[i : i + 32]) * len(lengths[i : i + 32]) for i in range(0, 256, 32))
    assert efficiency(lengths, sorted_plan) > 0.9
    assert sum(lengths) / naive < 0.5


def test_rejects_non_positive_limits() -> None:
    with pytest.raises(ValueError):
        plan([1, 2], 0, 4)
