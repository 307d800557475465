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


def _cheapest(widths: list[int], max_tokens: int, max_rows: int, overhead: int) -> int:
    """The least sum(overhead + rows x width) over every split of sorted ``widths`` into
    contiguous groups within the limits (a lone sequence may exceed the budget): by exhaustion."""
    if not widths:
        return 0
    costs = []
    for start in range(len(widths)):
        rows, width = len(widths) - start, widths[-1]
        if rows == 1 or (rows <= max_rows and rows * width <= max_tokens):
            costs.append(
                _cheapest(widths[:start], max_tokens, max_rows, overhead) + overhead + rows * width
            )
    return min(costs)


@pytest.mark.parametrize("seed", range(40))
def test_the_plan_is_the_cheapest_split(seed: int) -> None:
    rng = random.Random(seed)
    lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 11))]
    budget, rows, overhead = (
        rng.choice([16, 64, 256]),
        rng.choice([1, 3, 8]),
        rng.choice([0, 8, 32]),
    )
    groups = plan(lengths, budget, rows, overhead)
    cost = sum(overhead + g.padded_tokens for g in groups)
    assert cost == _cheapest(sorted(lengths), budget, rows, overhead)


def test_equal_lengths_keep_their_arrival_order() -> None:
    lengths = [7, 3, 7, 3, 7, 3, 7, 7, 3, 7, 3, 3]
    groups = plan(lengths, max_tokens=1024, max_rows=64)
    assert [i for g in groups for i in g.indices] == [1, 3, 5, 8, 10, 11, 0, 2, 4, 6, 7, 9]


def test_at_equal_cost_the_fewer_calls_win() -> None:
    # One call of two or two calls of one: both cost 2 padded tokens when a call costs nothing.
    assert [g.indices for g in plan([1, 1], max_tokens=8, max_rows=2, overhead=0)] == [(0, 1)]
