"""`make chaos` tells a refusal at admission from an expiry and from other 503s by the reason the
server gives: the reasons admission really raises, through the body the stack writes."""

from __future__ import annotations

import json

import pytest

from loadtests.chaos import Phase
from loadtests.openloop import Outcome, refusal
from services.tokenizer.clients import RunnerUnavailable
from serving.batching.admission import Admission
from serving.errors import Overloaded


def body(error: Overloaded, relayed_by: str = "") -> tuple[int, str]:
    reason = f"{relayed_by}: {error.reason}" if relayed_by else error.reason
    return error.status, json.dumps({"error": reason, "retry_after": error.retry_after})


def refused(admission: Admission, tokens: int) -> Overloaded:
    with pytest.raises(Overloaded) as caught:
        admission.admit(tokens)
    return caught.value


def test_admissions_refusals_are_at_admission_and_an_expiry_is_not() -> None:
    full = Admission(max_queue_tokens=100, deadline_s=10)
    full.admit(90)
    slow = Admission(max_queue_tokens=10**6, deadline_s=1, tokens_per_s=10)
    slow.admit(5)
    expiry = Admission(max_queue_tokens=100, deadline_s=10)
    expiry.admit(10)

    assert refusal(*body(refused(full, 20))) == (False, True)  # 429 queue full
    assert refusal(*body(refused(slow, 50))) == (False, True)  # 503 cannot finish in time
    assert refusal(*body(refused(slow, 50), "onnx_runner")) == (False, True)  # relayed as is
    assert refusal(*body(expiry.expired(10))) == (True, False)
    restarting = RunnerUnavailable("onnx_runner", "ConnectError")  # a killed runner's 503
    assert refusal(*body(restarting)) == (False, False)
    assert refusal(200, '{"error": "queue full"}') == (False, False)  # only 429/503 refuse


def test_the_summary_counts_refusals_at_admission_apart() -> None:
    phase = Phase("overload", 10)
    phase.outcomes = [
        Outcome("/embed", 0, 0.1, 429, "1", at_admission=True),
        Outcome("/embed", 0, 0.1, 503, "1", at_admission=True),
        Outcome("/embed", 0, 0.1, 503, "1"),  # another 503: refused, not at admission
        Outcome("/embed", 0, 9.9, 503, "1", expired=True),
        Outcome("/embed", 0, 0.2, 200),
    ]
    summary = phase.summary()
    assert (summary["refused"], summary["refused_at_admission"], summary["expired"]) == (3, 2, 1)
