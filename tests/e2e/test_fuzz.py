"""Property-based fuzzing of every public endpoint from the server's own OpenAPI schema.

Schemathesis generates valid and invalid bodies for each operation of a real `bentoml serve` graph
configured for production (registry off the public port) with small limits, so that thousands of
cases run in about a minute: no case may get a 5xx, and every documented answer must match its
schema. The registry operations are covered by explicit tests (tests/e2e/test_tenants.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import response_schema_conformance

from loadtests.processes import bentoml_serve
from tests.e2e.conftest import log_path

CASES_PER_OPERATION = 250  # x 5 operations x 2 modes
CASES: Counter[str] = Counter()


@pytest.fixture(scope="module")
def fuzz_graph(tenant_store) -> Iterator[str]:
    env = {
        "BUNDLE_TENANTS_STORE": str(tenant_store),
        "BUNDLE_TOKENIZER_ADMIN_ENABLED": "false",
        "BUNDLE_TOKENIZER_MAX_TEXTS": "8",
        "BUNDLE_TOKENIZER_MAX_PAIRS": "4",
        "BUNDLE_TOKENIZER_MAX_CHARS": "300",
    }
    with bentoml_serve(".", log_path("fuzz-graph.log"), env=env) as server:
        yield server.url


@pytest.fixture(scope="module")
def operations(fuzz_graph: str) -> list:
    schema = schemathesis.openapi.from_url(f"{fuzz_graph}/docs.json")
    schema.config.update(base_url=fuzz_graph)
    # /metrics is Prometheus text, not JSON; the probes take no input.
    schema = schema.exclude(path_regex=r"^/(metrics|readyz|livez|healthz)$")
    return [result.ok() for result in schema.get_all_operations()]


def fuzz(operation, mode: GenerationMode, examples: int) -> int:
    """Run ``examples`` generated cases of one operation; fails on a 5xx or a schema mismatch."""
    ran = 0

    # Schemathesis's pytest plugin does not load under pytest 9, so Hypothesis is driven directly.
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,  # the same cases every run: a failure here reproduces
        suppress_health_check=list(HealthCheck),
        database=None,
        phases=[Phase.explicit, Phase.generate],  # report the failing case as generated
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case) -> None:
        nonlocal ran
        response = case.call(timeout=30)
        ran += 1
        case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])

    run()
    return ran


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_case_gets_a_server_error_and_answers_match_their_schema(
    operations: list, mode: GenerationMode
) -> None:
    assert {op.label for op in operations} >= {
        "POST /embed",
        "POST /similarity",
        "POST /tokenize",
        "POST /inference",
        "POST /classify",
    }
    for operation in operations:
        CASES[f"{operation.label} ({mode.value})"] += fuzz(operation, mode, CASES_PER_OPERATION)


def test_thousands_of_cases_ran_and_the_server_still_serves(fuzz_graph: str) -> None:
    print(f"fuzz cases: {dict(CASES)}; total {sum(CASES.values())}")
    assert sum(CASES.values()) >= 2000, CASES
    reply = httpx.post(f"{fuzz_graph}/embed", json={"texts": ["still serving"]}, timeout=30)
    assert reply.status_code == 200 and len(reply.json()["embeddings"][0]) == 384


def test_with_admin_off_the_registry_is_not_on_the_public_port(fuzz_graph: str) -> None:
    paths = httpx.get(f"{fuzz_graph}/docs.json", timeout=30).json()["paths"]
    assert not [p for p in paths if p.startswith("/tenants")], list(paths)
    for path in ("/tenants/train", "/tenants/upload", "/tenants/delete", "/tenants/list"):
        assert httpx.post(f"{fuzz_graph}{path}", json={}, timeout=30).status_code == 404, path
