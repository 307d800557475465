"""A runner on its own (as in one container per service): TF Serving's predict shape, shedding."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from loadtests.processes import bentoml_serve
from tests.e2e.conftest import log_path

IDS = [101, 7592, 2088, 102]  # [CLS] hello world [SEP]


@pytest.fixture(scope="module")
def runner() -> Iterator[str]:
    # A small queue and deadline so a burst from this test overflows them.
    env = {"BUNDLE_ONNX_MAX_QUEUE_TOKENS": "3000", "BUNDLE_ONNX_DEADLINE_S": "0.3"}
    with bentoml_serve(
        "runners.onnx.service:OnnxRunner", log_path("onnx-runner.log"), env=env
    ) as server:
        yield server.url


def test_predict_api_strips_padding(runner: str) -> None:
    padded = {"inputs": {"input_ids": [[*IDS, 0, 0, 0]], "attention_mask": [[1, 1, 1, 1, 0, 0, 0]]}}
    plain = {"inputs": {"input_ids": [IDS]}}
    a = httpx.post(f"{runner}/v1/models/minilm:predict", json=padded)
    b = httpx.post(f"{runner}/v1/models/minilm:predict", json=plain)
    assert a.status_code == b.status_code == 200, a.text
    assert np.array(a.json()["outputs"]).shape == (1, 384)
    np.testing.assert_allclose(a.json()["outputs"], b.json()["outputs"], atol=1e-6)
    int8 = httpx.post(f"{runner}/v1/models/minilm-int8:predict", json=plain).json()["outputs"]
    assert np.dot(int8[0], b.json()["outputs"][0]) > 0.95


def test_predict_api_errors(runner: str) -> None:
    missing = httpx.post(f"{runner}/v1/models/bert:predict", json={"inputs": {"input_ids": [IDS]}})
    assert missing.status_code == 404 and "bert" in missing.text
    ragged = httpx.post(
        f"{runner}/v1/models/minilm:predict",
        json={"inputs": {"input_ids": [IDS], "attention_mask": [[1]]}},
    )
    assert ragged.status_code == 400 and "attention_mask" in ragged.text
    out_of_vocab = httpx.post(
        f"{runner}/v1/models/minilm:predict", json={"inputs": {"input_ids": [[101, 99999]]}}
    )
    assert out_of_vocab.status_code == 400


def test_runner_embed_api_checks_token_ids(runner: str) -> None:
    ok = httpx.post(f"{runner}/embed", json={"ids": [IDS], "variant": "fp32"})
    assert ok.status_code == 200, ok.text
    assert float(ok.headers["x-inference-time"]) > 0
    for bad in (
        {"ids": []},
        {"ids": [[]]},
        {"ids": [[-1]]},
        {"ids": [[30522]]},
        {"ids": [IDS], "variant": "fp16"},
    ):
        resp = httpx.post(f"{runner}/embed", json=bad)
        assert resp.status_code == 400, (bad, resp.text)


def test_overload_is_shed_with_retry_after_and_the_runner_recovers(runner: str) -> None:
    seqs = [
        [101, *range(2000, 2126), 102]
    ] * 16  # 2,048 tokens per request against a 3,000-token queue

    def send(_: int) -> httpx.Response:
        return httpx.post(f"{runner}/embed", json={"ids": seqs}, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(send, range(16)))
    codes = [r.status_code for r in responses]
    shed = [r for r in responses if r.status_code in (429, 503)]
    assert codes.count(200) >= 1 and shed, codes
    assert set(codes) <= {200, 429, 503}, codes
    for r in shed:
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]
    assert httpx.post(f"{runner}/embed", json={"ids": [IDS]}).status_code == 200
