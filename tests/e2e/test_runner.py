"""A runner on its own (as in one container per service): a TF Serving client unchanged, the TF
runner, shedding. TF Serving's API itself is tested in-process: tests/http/test_tf_serving.py."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from testkit.processes import bentoml_serve, log_path
from tests.e2e.test_readme_examples import python_blocks, run_python_block

IDS = [101, 7592, 2088, 102]  # [CLS] hello world [SEP]


@pytest.fixture(scope="module")
def runner() -> Iterator[str]:
    # A small queue and deadline so a burst from this test overflows them.
    env = {"BUNDLE_ONNX_MAX_QUEUE_TOKENS": "3000", "BUNDLE_ONNX_DEADLINE_S": "0.3"}
    with bentoml_serve(
        "runners.onnx.service:OnnxRunner", log_path("onnx-runner.log"), env=env
    ) as server:
        yield server.url


# A TF Serving client as written for a TF Serving container (its default model name, "model"),
# unchanged but for the host it points at.
TF_SERVING_CLIENT = """
import requests
import random

BATCH_SIZE = 4
SEQUENCE_LENGTH = 128

input_ids = [[random.randrange(1, 1000) for _ in range(SEQUENCE_LENGTH)] for _ in range(BATCH_SIZE)]
attention_mask = [[1.0] * SEQUENCE_LENGTH for _ in range(BATCH_SIZE)]

payload = {"inputs": {"input_ids": input_ids, "attention_mask": attention_mask}}
response = requests.post("http://localhost:8501/v1/models/model:predict", json=payload)
"""


def test_a_tf_serving_client_runs_unchanged(runner: str) -> None:
    code = TF_SERVING_CLIENT.replace("http://localhost:8501", runner)
    scope: dict = {}
    exec(code, scope)  # the client's own code, as its users run it
    response = scope["response"]
    assert response.status_code == 200, response.text
    assert np.array(response.json()["outputs"]).shape == (4, 384)
    # Same numbers through the runner's own API.
    own = httpx.post(f"{runner}/embed", json={"ids": scope["input_ids"]}).json()["embeddings"]
    np.testing.assert_allclose(response.json()["outputs"], own, atol=1e-6)


def test_the_readmes_tf_serving_example_works(runner: str) -> None:
    [block] = python_blocks(3001)
    run_python_block(block, runner, 3001)


@pytest.fixture(scope="module")
def tf_runner() -> Iterator[str]:
    with bentoml_serve("runners.tf.service:TFRunner", log_path("tf-runner.log")) as server:
        yield server.url


def test_the_tf_runner_speaks_tf_serving_too(tf_runner: str, runner: str) -> None:
    rows = {"instances": [{"input_ids": IDS}]}
    tf = httpx.post(f"{tf_runner}/v1/models/all-MiniLM-L6-v2:predict", json=rows)
    assert tf.status_code == 200, tf.text
    own = httpx.post(f"{tf_runner}/embed", json={"ids": [IDS]}).json()["embeddings"]
    np.testing.assert_allclose(tf.json()["predictions"], own, atol=1e-6)
    onnx = httpx.post(f"{runner}/v1/models/all-MiniLM-L6-v2:predict", json=rows).json()[
        "predictions"
    ]
    np.testing.assert_allclose(tf.json()["predictions"], onnx, atol=1e-4)  # same model, two engines
    meta = httpx.get(f"{tf_runner}/v1/models/model/metadata").json()
    assert meta["model_spec"]["name"] == "model"
    assert (
        httpx.get(f"{tf_runner}/v1/models/all-MiniLM-L6-v2-int8").status_code == 404
    )  # ONNX's only


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
