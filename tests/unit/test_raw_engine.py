"""The raw limit: a quick run times texts with the corpus's own lengths, not its first ones; a run
keeps the best of its measurements at the start and the end."""

from __future__ import annotations

import statistics
from pathlib import Path

from loadtests.raw_engine import ROW_COUNTS, TOKEN_BUDGETS, at_edge, best_of, sample
from models import corpus


def test_the_quick_sample_has_the_corpus_lengths_not_its_first_texts() -> None:
    texts = corpus.load_texts()
    picked = sample(texts, 500)
    assert 500 <= len(picked) < len(texts) and set(picked) <= set(texts)
    mean = statistics.mean(map(len, texts))
    assert abs(statistics.mean(map(len, picked)) - mean) < 0.01 * mean
    assert sample(texts, None) == texts and sample(texts, len(texts)) == texts


def test_every_kth_text_in_length_order() -> None:
    texts = ["x" * n for n in (5, 1, 4, 2, 6, 3)]
    assert sample(texts, 3) == ["x", "xxx", "xxxxx"]


def test_the_limit_is_each_plan_s_best_measurement_and_the_best_plan_among_them() -> None:
    start = {
        "sentences_per_s": 700.0,
        "plan": "tokens 1024, 1 session",
        "by_plan": {"tokens 1024, 1 session": 700.0, "rows 32, 2 lanes": 650.0},
    }
    end = {
        "sentences_per_s": 720.0,
        "plan": "rows 32, 2 lanes",
        "by_plan": {"tokens 1024, 1 session": 690.0, "rows 32, 2 lanes": 720.0},
    }
    limit = best_of(start, end)
    assert limit["by_plan"] == {"tokens 1024, 1 session": 700.0, "rows 32, 2 lanes": 720.0}
    assert (limit["sentences_per_s"], limit["plan"]) == (720.0, "rows 32, 2 lanes")
    assert limit["sentences_per_s"] == max(limit["by_plan"].values())
    # a host slower at the start than at the end: the end's higher figure is the limit, not an error
    assert best_of(end, start)["sentences_per_s"] == 720.0
    assert limit["runs"] == [start, end]  # each measurement kept whole: the limit can be redone


def test_a_best_plan_at_either_end_of_its_kind_s_sweep_is_flagged() -> None:
    for kind, sizes in (("rows", ROW_COUNTS), ("tokens", TOKEN_BUDGETS)):
        assert at_edge(f"{kind} {min(sizes)}, 2 lanes") and at_edge(
            f"{kind} {max(sizes)}, 1 session"
        )
        assert not any(at_edge(f"{kind} {size}, 2 lanes") for size in sorted(sizes)[1:-1])


def test_the_task_rows_raw_inputs_are_what_their_requests_send(tmp_path: Path) -> None:
    """The rerank and classify rows divide by a raw limit measured on the requests' own inputs:
    each body's (query, text) pairs, or its texts, in order."""
    import json

    from loadtests import tasks

    for task, key in (("rerank", "texts"), ("classify", "inputs")):
        path, inputs = tasks.bodies(task, "m", tmp_path)
        sent = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(sent) == len(inputs) == tasks.BODIES
        for body, held in zip(sent, inputs, strict=True):
            assert body["model"] == "m" and len(body[key]) == tasks.PER_REQUEST
            if task == "rerank":
                assert held == [(body["query"], text) for text in body["texts"]]
            else:
                assert held == body["inputs"]
