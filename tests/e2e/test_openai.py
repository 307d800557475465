"""OpenAI's embeddings API on a real graph, through the official ``openai`` SDK, as users call it;
the graph with the tenant registry off the public port, as in production."""

from __future__ import annotations

import base64
import concurrent.futures
import threading
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from services.tokenizer.openai_api import MODELS
from testkit.processes import bentoml_serve, log_path

TEXTS = ["A man is eating food.", "How do I reset my password?", "hello"]


@pytest.fixture(scope="module")
def graph_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # A queue that holds little (64 tokens), so that a burst from this module overflows it (429);
    # one request at a time is never refused (nothing waits), so the other tests here, whose
    # requests hold under 64 tokens, are unaffected. The registry off, as in production.
    env = {
        "BUNDLE_TENANTS_STORE": str(tmp_path_factory.mktemp("openai-tenants")),
        "BUNDLE_TOKENIZER_MAX_QUEUE_TOKENS": "64",
        "BUNDLE_TOKENIZER_RUNNER_INFLIGHT": "1",
        "BUNDLE_TOKENIZER_ADMIN_ENABLED": "false",
    }
    with bentoml_serve(".", log_path("openai-graph.log"), env=env) as server:
        yield server.url


@pytest.fixture(scope="module")
def sdk(graph_url: str) -> Iterator[openai.OpenAI]:
    # No retries: the tests see each answer; the SDK's retries are checked on their own below.
    with openai.OpenAI(base_url=f"{graph_url}/v1", api_key="unused", max_retries=0) as client:
        yield client


def embed(graph_url: str, texts: list[str], model: str, backend: str) -> np.ndarray:
    body = {"texts": texts, "model": model, "backend": backend}
    reply = httpx.post(f"{graph_url}/embed", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return np.array(reply.json()["embeddings"])


@pytest.mark.parametrize("model", list(MODELS))
def test_a_list_gives_the_same_vectors_as_embed(
    sdk: openai.OpenAI, graph_url: str, model: str
) -> None:
    # The SDK asks for base64 unless told otherwise and decodes it itself.
    reply = sdk.embeddings.create(model=model, input=TEXTS)
    assert [d.index for d in reply.data] == [0, 1, 2]
    assert reply.model == model
    got = np.array([d.embedding for d in reply.data])
    np.testing.assert_allclose(got, embed(graph_url, TEXTS, *MODELS[model]), atol=1e-6)
    tokens = httpx.post(f"{graph_url}/tokenize", json={"texts": TEXTS}).json()["ids"]
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == sum(map(len, tokens))


def test_a_string_as_floats_and_as_base64(sdk: openai.OpenAI, graph_url: str) -> None:
    want = embed(graph_url, ["hello world"], "all-MiniLM-L6-v2", "onnx")[0]
    # Not told, the SDK asks for base64 and decodes it itself; told "float", it gets JSON numbers.
    for kwargs in ({}, {"encoding_format": "float"}):
        reply = sdk.embeddings.create(model="all-MiniLM-L6-v2", input="hello world", **kwargs)
        assert len(reply.data) == 1
        np.testing.assert_allclose(reply.data[0].embedding, want, atol=1e-6)
    # Told "base64", it hands over the string: little-endian float32 bytes, as OpenAI sends them.
    raw = sdk.embeddings.create(
        model="all-MiniLM-L6-v2", input="hello world", encoding_format="base64"
    )
    decoded = np.frombuffer(base64.b64decode(raw.data[0].embedding), "<f4")
    np.testing.assert_array_equal(decoded, want.astype(np.float32))
    ok = sdk.embeddings.create(model="all-MiniLM-L6-v2", input="x", dimensions=384, user="u1")
    assert len(ok.data[0].embedding) == 384


def test_null_optional_arguments_are_the_defaults(graph_url: str) -> None:
    """Wrappers forward None for what their user did not set; OpenAI takes null as the default."""
    body = {"model": "all-MiniLM-L6-v2", "input": "hello world", "encoding_format": None,
            "dimensions": None, "user": None}  # fmt: skip
    reply = httpx.post(f"{graph_url}/v1/embeddings", json=body)
    assert reply.status_code == 200, reply.text
    vector = reply.json()["data"][0]["embedding"]
    np.testing.assert_allclose(
        vector, embed(graph_url, ["hello world"], "all-MiniLM-L6-v2", "onnx")[0], atol=1e-6
    )


def test_models_are_listed_and_retrieved(sdk: openai.OpenAI) -> None:
    assert [m.id for m in sdk.models.list()] == list(MODELS)
    assert sdk.models.retrieve("all-MiniLM-L6-v2-int8").owned_by == "bento-bundle"
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("text-embedding-3-small")


def test_errors_map_to_the_sdks_exceptions(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.embeddings.create(model="all-MiniLM-L6-v2", input="x", dimensions=1536)
    assert bad.value.param == "dimensions" and "1536" in bad.value.message
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.embeddings.create(model="text-embedding-3-small", input="x")
    assert (
        missing.value.code == "model_not_found"
        and "text-embedding-3-small" in missing.value.message
    )
    for tokens in ([[101, 7592, 102]], [101, 7592, 102]):
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.embeddings.create(model="all-MiniLM-L6-v2", input=tokens)
        assert refused.value.param == "input" and "token arrays" in refused.value.message
    # Each refusal says what is wrong with input, in words (no pydantic type names).
    for bad_input, says in (
        ("", "input is empty or blank"),
        ([], "input must not be an empty list"),
        (["ok", " "], "input[1] is empty or blank"),
        (["ok"] * 2049, "input has 2049 texts; at most 2048"),
        ("x" * 10_001, "input has 10001 characters; at most 10000"),
        # More tokens than the queue ever holds (64 here): refused at once, not left to be shed.
        (["hello world"] * 20, "input has 80 tokens; at most 64 per request"),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.embeddings.create(model="all-MiniLM-L6-v2", input=bad_input)
        assert refused.value.param == "input" and says in refused.value.message, refused.value


def test_error_bodies_have_openais_shape(graph_url: str) -> None:
    cases = [
        ({"model": "all-MiniLM-L6-v2", "input": "x", "temperature": 1}, 400, "temperature"),
        ({"model": "all-MiniLM-L6-v2"}, 400, "input"),
        ({"input": "x"}, 400, "model"),
        ({"model": "all-MiniLM-L6-v2", "input": "x", "encoding_format": "int8"}, 400, None),
        ([1, 2], 400, None),
    ]
    for body, status, param in cases:
        reply = httpx.post(f"{graph_url}/v1/embeddings", json=body)
        assert reply.status_code == status, (body, reply.text)
        error = reply.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert error["type"] == "invalid_request_error" and error["message"]
        if param is not None:
            assert error["param"] == param, error
    text = httpx.post(
        f"{graph_url}/v1/embeddings", content=b"x", headers={"content-type": "text/plain"}
    )
    assert text.status_code == 400 and "JSON" in text.json()["error"]["message"]
    deep = b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b', "model": "all-MiniLM-L6-v2"}'
    nested = httpx.post(
        f"{graph_url}/v1/embeddings", content=deep, headers={"content-type": "application/json"}
    )
    assert nested.status_code == 400 and nested.json()["error"]["message"]
    # Unknown paths and methods under /v1 answer in OpenAI's shape too.
    for method, path, status in (("GET", "/v1/nothing", 404), ("GET", "/v1/embeddings", 404)):
        reply = httpx.request(method, f"{graph_url}{path}")
        assert reply.status_code == status, reply.text
        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}


def test_overload_is_a_rate_limit_error_with_retry_after(
    sdk: openai.OpenAI, graph_url: str
) -> None:
    """A burst over the 64-token queue: the SDK raises RateLimitError (429) or, for a request that
    could not finish in time, InternalServerError (503), both with Retry-After and OpenAI's shape;
    then, with its own retries on and the burst over, the same call succeeds."""
    stop = threading.Event()
    bulk = {"texts": ["a long sentence to keep the queue busy for a while"] * 4}  # 52 tokens

    def flood() -> None:
        with httpx.Client(base_url=graph_url, timeout=60) as client:
            while not stop.is_set():
                client.post("/embed", json=bulk)

    shed: list[openai.APIStatusError] = []
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        floods = [pool.submit(flood) for _ in range(4)]
        try:
            for _ in range(300):
                try:
                    sdk.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS)  # 20 tokens
                except (openai.RateLimitError, openai.InternalServerError) as exc:
                    shed.append(exc)
                    if isinstance(exc, openai.RateLimitError):
                        break
        finally:
            stop.set()
            for f in floods:
                f.result()
    limited = [e for e in shed if isinstance(e, openai.RateLimitError)]
    assert limited, f"no 429 within 300 calls against a saturated 64-token queue: {shed}"
    for exc in shed:
        assert exc.status_code in (429, 503)
        assert int(exc.response.headers["retry-after"]) >= 1
        assert exc.code == (
            "rate_limit_exceeded" if exc.status_code == 429 else "service_unavailable"
        )
    retrying = sdk.with_options(max_retries=3)
    assert len(retrying.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS).data) == 3


def test_with_admin_off_the_registry_is_not_on_the_public_port(graph_url: str) -> None:
    paths = httpx.get(f"{graph_url}/docs.json", timeout=30).json()["paths"]
    assert not [p for p in paths if p.startswith("/tenants")], list(paths)
    for path in ("/tenants/train", "/tenants/upload", "/tenants/delete", "/tenants/list"):
        assert httpx.post(f"{graph_url}{path}", json={}, timeout=30).status_code == 404, path
