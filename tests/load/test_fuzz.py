"""Property-based fuzzing of every public endpoint (ours and OpenAI's) from the server's own
OpenAPI schema, and of TF Serving's routes on a runner from the runner's.

Schemathesis generates valid (positive) and invalid (negative) requests for each operation of a
real `bentoml serve` graph with small limits, the registry on and a trained tenant, so that train,
upload (multipart), list, show, delete and a real /classify are fuzzed beside the public API.
(With the registry off, as in production, its routes do not exist: tests/e2e/test_openai.py.)
Every case must pass:
- no 5xx;
- every documented answer matches its schema;
- an invalid request is refused (4xx): an invalid body answered 200 fails;
- a valid request is accepted: 2xx, or a refusal the API documents for valid-looking input (404
  unknown tenant, 422 a tenant name or training set the service refuses).

A fresh seed each run, printed in the report header and in any failure (``FUZZ_SEED=N`` replays
a run); each test asserts the number of cases it ran itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.config._checks import PositiveDataAcceptanceConfig
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
)

from models import demo_tenants
from testkit.processes import bentoml_serve, log_path
from tests.load.conftest import FUZZ_SEED as SEED


@schemathesis.check
def no_internal_names(ctx, response, case) -> None:
    """A 4xx says what is wrong in the user's words: never pydantic's summary naming a class."""
    if 400 <= response.status_code < 500:
        assert "validation error for" not in response.text, response.text[:300]


CHECKS = [
    not_a_server_error,
    response_schema_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    no_internal_names,
]
# TF Serving's routes on a runner: a valid-looking request can still be refused (an attention_mask
# of another length than its input_ids, which a schema cannot say), so acceptance is not checked.
RUNNER_CHECKS = [
    not_a_server_error,
    response_schema_conformance,
    negative_data_rejection,
    no_internal_names,
]
# Valid-looking input the tenant endpoints refuse by design: an unknown tenant (404); a tenant name
# outside the rule, or examples of a single intent (422). Any other valid request must get a 2xx.
TENANT_REFUSALS = ["404", "422"]
LIMITS = {
    "BUNDLE_TOKENIZER_MAX_TEXTS": "8",
    "BUNDLE_TOKENIZER_MAX_PAIRS": "4",
    "BUNDLE_TOKENIZER_MAX_CHARS": "300",
    "BUNDLE_TOKENIZER_OPENAI_MAX_INPUTS": "8",
}
TENANT = "fuzzed-acme"
PUBLIC = [
    "POST /embed",
    "POST /similarity",
    "POST /tokenize",
    "POST /inference",
    "POST /classify",
    "POST /v1/embeddings",
]
# Inputs of a handful of values (none; a model name of three): Hypothesis stops once it has tried
# them, so these are checked but not counted; names outside the three are the negative cases.
SMALL = {GenerationMode.POSITIVE: ["GET /v1/models", "GET /v1/models/{name}"],
         GenerationMode.NEGATIVE: ["GET /v1/models/{name}"]}  # fmt: skip
# The trained tenant's name goes into half the cases of these (never into delete's, which runs last).
REAL_TENANT = {
    "POST /classify",
    "POST /tenants/show",
    "POST /tenants/train",
    "POST /tenants/upload",
}
REGISTRY = [
    "POST /classify",
    "POST /tenants/train",
    "POST /tenants/upload",
    "POST /tenants/list",
    "POST /tenants/show",
    "POST /tenants/delete",
]
# Cases per operation and mode: enough to find a schema or validation break in every run, a fresh
# seed each time (FUZZ_SCALE=N runs N times as many: a longer hunt). Training is real (one epoch
# here), so it gets fewer.
SCALE = int(os.environ.get("FUZZ_SCALE") or 1)
CASES = {"POST /tenants/train": 20 * SCALE}
DEFAULT_CASES = 50 * SCALE
RUNNER_CASES = 20 * SCALE


def operations_of(url: str) -> dict[str, object]:
    schema = schemathesis.openapi.from_url(f"{url}/docs.json")
    schema.config.update(base_url=url)
    # /metrics is Prometheus text, not JSON; the probes take no input.
    schema = schema.exclude(path_regex=r"^/(metrics|readyz|livez|healthz)$")
    return {op.label: op for op in (result.ok() for result in schema.get_all_operations())}


@pytest.fixture(scope="module")
def fuzz_graph(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = {
        "BUNDLE_TENANTS_STORE": str(tmp_path_factory.mktemp("fuzz-tenants")),
        "BUNDLE_TENANTS_TRAIN_EPOCHS": "1",
        "BUNDLE_TENANTS_MAX_UPLOAD_MB": "1",
        **LIMITS,
    }
    with bentoml_serve(".", log_path("fuzz-graph.log"), env=env) as server:
        examples = [{"text": t, "intent": i} for t, i in demo_tenants.tenant(2).train]
        trained = httpx.post(
            f"{server.url}/tenants/train",
            json={"tenant": TENANT, "examples": examples},
            timeout=300,
        )
        assert trained.status_code == 200, trained.text
        yield server.url


def with_tenant(case, real: bool):
    """Half the cases that name a tenant name the trained one, so a real model answers them. Only a
    string is replaced: a negative case whose tenant is of the wrong type must stay invalid."""
    if real and isinstance(case.body, dict) and isinstance(case.body.get("tenant"), str):
        case.body["tenant"] = TENANT
    return case


def fuzz(
    operation,
    mode: GenerationMode,
    examples: int,
    salt: int,
    real_tenant: bool = False,
    checks: list = CHECKS,
) -> int:
    """Run up to ``examples`` generated cases of one operation; returns how many ran."""
    ran = 0
    names_a_tenant = operation.label == "POST /classify" or operation.label.startswith(
        "POST /tenants/"
    )
    accepted = ["2xx", *(TENANT_REFUSALS if names_a_tenant else [])]
    operation.schema.config.checks.positive_data_acceptance = PositiveDataAcceptanceConfig(
        expected_statuses=accepted
    )
    strategy = st.tuples(operation.as_strategy(generation_mode=mode), st.booleans()).map(
        lambda pair: with_tenant(pair[0], real_tenant and pair[1])
    )

    # Schemathesis's pytest plugin does not load under pytest 9, so Hypothesis is driven directly.
    @seed(SEED + salt)
    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
        phases=[Phase.explicit, Phase.generate],  # report the failing case as generated
    )
    @given(case=strategy)
    def run(case) -> None:
        nonlocal ran
        response = case.call(timeout=60)
        ran += 1
        case.validate_response(response, checks=checks)

    try:
        run()
    except Exception as exc:
        exc.add_note(f"replay with FUZZ_SEED={SEED} ({operation.label}, {mode.value})")
        raise
    return ran


def fuzz_all(operations: dict, labels: list[str], mode: GenerationMode, real: bool) -> dict:
    assert set(labels) <= set(operations), sorted(operations)
    counts = {}
    for salt, label in enumerate(labels):
        examples = CASES.get(label, DEFAULT_CASES)
        counts[label] = fuzz(operations[label], mode, examples, salt, real and label in REAL_TENANT)
    print(f"fuzz seed {SEED}, {mode.value}: {counts}, total {sum(counts.values())}")
    return counts


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_the_public_api(fuzz_graph: str, mode: GenerationMode) -> None:
    operations = operations_of(fuzz_graph)
    counts = fuzz_all(operations, PUBLIC, mode, real=False)
    assert sum(counts.values()) == DEFAULT_CASES * len(PUBLIC), counts  # 300 a mode
    small = fuzz_all(operations, SMALL[mode], mode, real=False)
    assert all(small.values()), small
    reply = httpx.post(f"{fuzz_graph}/embed", json={"texts": ["still serving"]}, timeout=30)
    assert reply.status_code == 200 and len(reply.json()["embeddings"][0]) == 384


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_the_registry_and_a_real_classify(fuzz_graph: str, mode: GenerationMode) -> None:
    counts = fuzz_all(operations_of(fuzz_graph), REGISTRY, mode, real=True)
    # /tenants/list takes no body: its input space is a handful of cases, Hypothesis stops there.
    big = {k: v for k, v in counts.items() if k != "POST /tenants/list"}
    planned = sum(CASES.get(label, DEFAULT_CASES) for label in big)
    assert sum(big.values()) == planned, (
        counts
    )  # 220 a mode: with the public 300 and the runner's 140, over 1,300 in all
    # The trained tenant still answers: no fuzzed request broke it (delete never names it).
    reply = httpx.post(
        f"{fuzz_graph}/classify", json={"tenant": TENANT, "texts": ["hello"]}, timeout=30
    )
    assert reply.status_code == 200, reply.text


@pytest.fixture(scope="module")
def onnx_runner() -> Iterator[str]:
    with bentoml_serve("runners.onnx.service:OnnxRunner", log_path("fuzz-runner.log")) as server:
        yield server.url


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_tf_servings_routes_on_a_runner(onnx_runner: str, mode: GenerationMode) -> None:
    """Predict (three URL forms), status (three) and metadata, from the runner's own schema."""
    operations = {label: op for label, op in operations_of(onnx_runner).items() if " /v1/" in label}
    assert len(operations) == 7, sorted(operations)
    counts = {
        label: fuzz(op, mode, RUNNER_CASES, salt, checks=RUNNER_CHECKS)
        for salt, (label, op) in enumerate(sorted(operations.items()))
    }
    print(f"fuzz seed {SEED}, {mode.value}: {counts}")
    assert all(counts.values()), counts
    reply = httpx.post(
        f"{onnx_runner}/v1/models/all-MiniLM-L6-v2:predict",
        json={"inputs": {"input_ids": [[101, 102]]}},
    )
    assert reply.status_code == 200, reply.text
