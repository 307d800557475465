"""The benchmark's split of a runner's CPU per request into the engine's and everything else's:
read from the runners' counter on /metrics, subtracted from the process's CPU from /proc."""

from __future__ import annotations

import pytest

from loadtests import cpu
from loadtests.cpu import Usage

# What the tokenizer's /metrics holds under `bentoml serve` (every service's series, multiprocess).
EXPOSITION = """\
# HELP bundle_engine_cpu_seconds_total CPU seconds inside engine calls: the lane's thread (a solo call: every thread but the event loop's)
# TYPE bundle_engine_cpu_seconds_total counter
bundle_engine_cpu_seconds_total{model="all-MiniLM-L6-v2/onnx",runner="onnx_runner"} 12.5
bundle_engine_cpu_seconds_total{model="all-MiniLM-L6-v2/onnx-int8",runner="onnx_runner"} 2.5
bundle_engine_cpu_seconds_total{model="all-MiniLM-L6-v2/tf",runner="tf_runner"} 1.0
# HELP bundle_engine_seconds Engine time per call
# TYPE bundle_engine_seconds histogram
bundle_engine_seconds_sum{model="all-MiniLM-L6-v2/onnx",runner="onnx_runner"} 99.0
bundle_engine_seconds_count{model="all-MiniLM-L6-v2/onnx",runner="onnx_runner"} 7.0
"""


def test_the_engine_counter_is_read_per_runner_with_its_models_added_up() -> None:
    assert cpu.engine_seconds_in(EXPOSITION) == {"onnx_runner": 15.0, "tf_runner": 1.0}
    assert cpu.engine_seconds_in("# no such series\n") == {}


BATCHING = """\
# HELP bentoml_service_request_total Total number of runner RPC
# TYPE bentoml_service_request_total counter
bentoml_service_request_total{endpoint="/embed",http_response_code="200",runner_name="onnx_runner",service_name="x",service_version="1"} 30.0
bentoml_service_request_total{endpoint="/embed",http_response_code="503",runner_name="onnx_runner",service_name="x",service_version="1"} 2.0
bentoml_service_request_total{endpoint="/v1/models/all-MiniLM-L6-v2:predict",http_response_code="200",runner_name="onnx_runner",service_name="x",service_version="1"} 5.0
bentoml_service_request_total{endpoint="/embed",http_response_code="200",runner_name="tf_runner",service_name="x",service_version="1"} 7.0
bentoml_service_request_total{endpoint="/embed",http_response_code="200",runner_name="tokenizer",service_name="x",service_version="1"} 900.0
# HELP bundle_batch_rows Sequences per engine call
# TYPE bundle_batch_rows histogram
bundle_batch_rows_bucket{le="8.0",model="all-MiniLM-L6-v2/onnx",runner="onnx_runner"} 100.0
bundle_batch_rows_count{model="all-MiniLM-L6-v2/onnx",runner="onnx_runner"} 150.0
bundle_batch_rows_sum{model="all-MiniLM-L6-v2/onnx",runner="onnx_runner"} 800.0
bundle_batch_rows_count{model="all-MiniLM-L6-v2/onnx-int8",runner="onnx_runner"} 10.0
bundle_batch_rows_sum{model="all-MiniLM-L6-v2/onnx-int8",runner="onnx_runner"} 128.0
bundle_batch_rows_count{model="all-MiniLM-L6-v2/tf",runner="tf_runner"} 3.0
bundle_batch_rows_sum{model="all-MiniLM-L6-v2/tf",runner="tf_runner"} 9.0
"""


def test_a_runner_s_cpu_is_split_into_engine_and_the_rest() -> None:
    before = {1: ("onnx_runner", Usage(1.0, 10.0)), 2: ("tokenizer", Usage(5.0, 0.0))}
    after = {1: ("onnx_runner", Usage(1.1, 13.3)), 2: ("tokenizer", Usage(5.3, 0.0))}
    engine = ({"onnx_runner": 20.0}, {"onnx_runner": 23.2})
    rows = cpu.per_request(before, after, 1000, engine)
    runner = rows["onnx_runner"]
    assert runner["total_ms"] == pytest.approx(3.4)
    assert runner["engine_ms"] == pytest.approx(3.2)
    # The event loop's 0.1 ms and the lanes' 0.1 ms around their engine calls.
    assert runner["serving_ms"] == pytest.approx(0.2)
    assert "engine_ms" not in rows["tokenizer"]  # it counts no engine: no split
    # Without the counters (a baseline server), no process is split.
    assert all("engine_ms" not in row for row in cpu.per_request(before, after, 1000).values())
