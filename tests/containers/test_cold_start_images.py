"""The images' part of `make cold-start` (loadtests/cold_start.py, `measure`), bounded: one start of
the ONNX runner's image and one of the tokenizer's (with the three runners beside it), each from
its launch (`docker create`, then start) to ready and to its first correct answer (the module raises if that answer is not
the warm one), its parts from its own log. No assertion is a speed; every container and network
it made is gone after, whether it passed or not."""

from __future__ import annotations

import json

import pytest

from loadtests import cold_start as images
from testkit.containers import LABEL, docker

MEASURED = ["onnx-runner", "tokenizer"]


@pytest.fixture(scope="module")
def found() -> dict | Exception:
    """The measurement, or what it raised: the check that nothing is left runs either way."""
    try:
        result = images.measure(MEASURED, starts=1, steady=5)
    except Exception as exc:  # re-raised by the test that reads the figures
        return exc
    print(json.dumps(result, indent=1))
    return result


def test_the_onnx_runner_s_and_the_tokenizer_s_images_are_timed_to_a_first_correct_answer(
    found: dict | Exception,
) -> None:
    if isinstance(found, Exception):
        raise found
    assert set(found) == set(MEASURED)
    for name, runs in found.items():
        (start,) = runs["starts"]
        # in the order they happen, each after the container was launched
        assert 0 <= start["container_started_s"] <= start["worker_started_s"], (name, start)
        parts = start["import_s"] + start["load_s"] + start["warm_up_s"]
        assert start["import_s"] > 0 and start["warm_up_s"] > 0, (name, start)
        # ready (the probe) only once the worker's warm-up is over; answered after
        assert start["worker_started_s"] + parts <= start["ready_s"] + 0.05, (name, start)
        assert start["ready_s"] < start["first_answer_s"], (name, start)
        assert start["first_ms"] > 0 and start["steady_p50_ms"] > 0, (name, start)


def test_nothing_is_left_behind(found: dict | Exception) -> None:
    """Every container and network the measurement made is gone, whether it passed or not."""
    label = f"label={LABEL}"
    assert docker("ps", "-aq", "--filter", label) == ""
    assert docker("network", "ls", "-q", "--filter", label) == ""
