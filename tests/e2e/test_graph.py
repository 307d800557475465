"""The public contract of the whole graph, through a real `bentoml serve`."""

from __future__ import annotations

import base64
import concurrent.futures
import re
import time
from collections import Counter

import httpx
import numpy as np
import pytest
import sentencepiece

from models import corpus, encoder, store
from serving import catalogue, contracts
from serving.features import cosine, pad, tokenize
from serving.tallies import FLUSH_S
from testkit.processes import Server

MODEL = catalogue.current().models[0]  # the default embed model: all-MiniLM-L6-v2
FIGURES = re.compile(r"\d+(?:\.\d+)?")
SHED = "bundle_shed_requests_total{"  # requests refused, by model, reason and runner (or tokenizer)

KNOWN = ("A man is eating food.", "A man is eating a piece of bread.")
MIXED = [
    "hi",
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog near the bank of the river, while the farmer watches.",
    *corpus.load_texts()[:13],
]


@pytest.fixture(scope="module")
def served():
    """The default model's tokenizer and spec, as the services read them from the store."""
    return encoder.tokenizer_of(MODEL.name)


@pytest.fixture(scope="module")
def engines(served):
    from serving.engines.onnx import OnnxEngine
    from serving.engines.tf import TFEngine

    contract = served[1].contract()
    onnx = lambda backend: OnnxEngine(  # noqa: E731
        store.path_of(MODEL.store_name(backend)) / "model.onnx",
        contract,
        threads=1,
        providers=["CPUExecutionProvider"],
    )
    tf = TFEngine(store.path_of(MODEL.store_name("tf")) / "saved_model", contract, threads=1)
    return {"onnx": onnx("onnx"), "onnx-int8": onnx("onnx-int8"), "tf": tf}


def in_process(engine, ids: list[list[int]], grouped: bool) -> np.ndarray:
    """The engine on one sequence at a time (no padding at all), or on the runner's own groups."""
    if not grouped:
        return np.concatenate([engine(pad([seq])) for seq in ids])
    from runners.onnx.settings import OnnxRunnerSettings
    from serving.batching import plan

    policy = OnnxRunnerSettings().policy
    out = np.empty((len(ids), 384), dtype=np.float32)
    for group in plan(
        [len(s) for s in ids],
        policy.max_batch_tokens,
        policy.max_batch_rows,
        policy.call_overhead_tokens,
    ):
        out[list(group.indices)] = engine(pad([ids[i] for i in group.indices]))
    return out


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8", "tf"])
def test_embed_equals_in_process_engine(
    client: httpx.Client, engines, served, backend: str
) -> None:
    resp = client.post("/embed", json={"texts": MIXED, "backend": backend})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (body["model"], body["backend"]) == (MODEL.name, backend)
    vectors = np.array(body["embeddings"], dtype=np.float32)
    ids = tokenize(served[0], MIXED)
    assert vectors.shape == (len(MIXED), 384)
    # fp32 and TF mask padding out, so batching must not change a vector: compare with one at a time.
    # Dynamic int8 computes activation scales per engine call over the padded batch, so its vectors
    # depend on their batch-mates: compare with the same engine calls the runner made.
    np.testing.assert_allclose(
        vectors, in_process(engines[backend], ids, grouped=backend == "onnx-int8"), atol=1e-5
    )
    assert body["tokens"] == [len(seq) for seq in ids]
    for header in ("x-tokenization-time", "x-queue-time", "x-inference-time", "x-total-time"):
        assert float(resp.headers[header]) >= 0


def test_served_int8_stays_within_its_accuracy_gate_whatever_its_batch(
    client: httpx.Client, engines, served
) -> None:
    """The int8 build gate (against fp32: mean cosine >= 0.99, min >= 0.95) holds for served vectors."""
    vectors = np.array(
        client.post("/embed", json={"texts": MIXED, "backend": "onnx-int8"}).json()["embeddings"]
    )
    fp32 = in_process(engines["onnx"], tokenize(served[0], MIXED), grouped=False)
    scores = cosine(vectors, fp32)
    assert scores.mean() >= 0.99 and scores.min() >= 0.95, scores


@pytest.mark.parametrize("backend", ["onnx", "tf"])
def test_similarity_known_answer(client: httpx.Client, backend: str) -> None:
    resp = client.post(
        "/similarity",
        json={"pairs": [list(KNOWN), ["hello", "hello"]], "threshold": 0.9, "backend": backend},
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["scores"][0] == pytest.approx(0.755, abs=0.01)
    assert body["scores"][1] == pytest.approx(1.0, abs=1e-5)
    assert body["labels"] == [0, 1]


def test_similarity_without_threshold_has_no_labels(client: httpx.Client) -> None:
    body = client.post("/similarity", json={"pairs": [list(KNOWN)]}).json()
    assert "labels" not in body and len(body["scores"]) == 1


def test_tokenize_sentencepiece_equals_sentencepiece(client: httpx.Client) -> None:
    texts = [*corpus.load_texts()[:200], "", "  spaces  ", "ünïcödé café"]
    resp = client.post("/tokenize", json={"texts": texts, "tokenizer": "sentencepiece"})
    assert resp.status_code == 200, resp.text
    processor = sentencepiece.SentencePieceProcessor(
        model_file=str(store.path_of(contracts.SENTENCEPIECE) / "spiece.model")
    )
    assert resp.json()["ids"] == processor.encode(texts)


def test_tokenize_by_the_models_tokenizer_truncates_at_its_limit(
    client: httpx.Client, served
) -> None:
    long_text = "word " * 1000
    ids = client.post("/tokenize", json={"texts": [long_text, "hello world"]}).json()["ids"]
    assert len(ids[0]) == served[1].max_length == 256
    assert ids[1] == [101, 7592, 2088, 102]
    named = client.post("/tokenize", json={"texts": ["hello world"], "model": MODEL.name})
    assert named.json()["ids"] == [ids[1]]
    unknown = client.post("/tokenize", json={"texts": ["hello"], "model": "gpt-5"})
    assert unknown.status_code == 404 and "'gpt-5' is not served here" in unknown.text
    # What clients sent when one model was served still means the model's own tokenizer.
    former = client.post("/tokenize", json={"texts": ["hello world"], "tokenizer": "minilm"})
    assert former.json()["ids"] == [ids[1]]


def test_inference_contract(client: httpx.Client) -> None:
    resp = client.post("/inference", json={"input_text": KNOWN[0]})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert list(body) == ["outputs"] and len(body["outputs"]) == 384
    embedded = client.post("/embed", json={"texts": [KNOWN[0]]}).json()["embeddings"][0]
    np.testing.assert_allclose(body["outputs"], embedded, atol=1e-6)


BAD = [
    ("/embed", {"texts": []}, "texts"),
    ("/embed", {"texts": [""]}, "texts"),
    ("/embed", {"texts": ["   "]}, "texts"),
    ("/embed", {"texts": "not a list"}, "texts"),
    ("/embed", {"texts": [1, 2]}, "texts"),
    ("/embed", {"texts": ["x" * 10_001]}, "texts"),
    ("/embed", {"texts": ["a"] * 257}, "texts"),
    ("/embed", {"texts": ["a"], "backend": "pytorch"}, "backend"),
    ("/embed", {"texts": ["a"], "backend": None}, "backend"),
    ("/embed", {"texts": ["a"], "model": ""}, "model"),
    ("/embed", {"texts": ["a"], "model": None}, "model"),
    ("/embed", {"texts": ["a"], "model": "gpt-5"}, "gpt-5"),
    ("/embed", {"texts": ["a"], "dimensions": 128}, "dimensions"),
    ("/embed", {"texts": ["a"], "dimensions": 0}, "dimensions"),
    ("/similarity", {"pairs": [["a", "b"]], "model": "gpt-5"}, "gpt-5"),
    ("/embed", {"texts": ["a"], "unknown": 1}, "unknown"),
    ("/embed", {}, "texts"),
    ("/similarity", {"pairs": [["a"]]}, "pairs"),
    ("/similarity", {"pairs": [["a", "b"]], "threshold": 2}, "threshold"),
    ("/similarity", {"pairs": []}, "pairs"),
    ("/tokenize", {"texts": ["a"], "tokenizer": "wordpiece"}, "tokenizer"),
    ("/inference", {"input_text": ""}, "input_text"),
    ("/inference", {"text": "hello"}, "input_text"),
    # JSON types are strict: what the OpenAPI schema says is exactly what is accepted
    ("/similarity", {"pairs": [["a", "b"]], "threshold": False}, "threshold"),
    ("/similarity", {"pairs": [["a", "b"]], "threshold": None}, "threshold"),
    ("/similarity", {"pairs": [["a", "b"]], "threshold": "0.5"}, "threshold"),
]


@pytest.mark.parametrize(
    ("path", "body", "field"), BAD, ids=[f"{p}-{f}-{i}" for i, (p, _, f) in enumerate(BAD)]
)
def test_bad_input_is_a_4xx_naming_the_field_and_the_server_keeps_serving(
    client: httpx.Client, path: str, body: dict, field: str
) -> None:
    resp = client.post(path, json=body)
    assert 400 <= resp.status_code < 500, resp.text
    assert field in resp.text
    assert "validation error for" not in resp.text  # no internal class names (…IODescriptor)
    assert client.post("/embed", json={"texts": ["still serving"]}).status_code == 200


RAW = [
    ("empty body", b"", "application/json"),
    ("invalid UTF-8", b'{"texts": ["\xff\xfe bad"]}', "application/json"),
    ("NaN", b'{"pairs": [["a", "b"]], "threshold": NaN}', "application/json"),
    ("Infinity", b'{"pairs": [["a", "b"]], "threshold": Infinity}', "application/json"),
    ("deeply nested", b'{"texts": ' + b"[" * 5000 + b"]" * 5000 + b"}", "application/json"),
    ("1 MB text", b'{"texts": ["' + b"a" * 1_000_000 + b'"]}', "application/json"),
    ("10,000 texts", b'{"texts": [' + b",".join([b'"hi"'] * 10_000) + b"]}", "application/json"),
    ("wrong content type", b'{"texts": ["hello"]}', "text/plain"),
    ("form body", b"texts=hello", "application/x-www-form-urlencoded"),
]


@pytest.mark.parametrize(("what", "body", "content_type"), RAW, ids=[r[0] for r in RAW])
def test_malformed_bodies_get_a_4xx_with_a_message_and_the_server_keeps_serving(
    client: httpx.Client, what: str, body: bytes, content_type: str
) -> None:
    path = "/similarity" if b"threshold" in body else "/embed"
    resp = client.post(path, content=body, headers={"content-type": content_type})
    assert 400 <= resp.status_code < 500, (what, resp.status_code, resp.text[:300])
    assert resp.text.strip(), what  # a message, not an empty 4xx
    assert "IODescriptor" not in resp.text and "validation error for" not in resp.text, resp.text
    assert len(resp.content) < 10_000, what  # the message does not echo a huge input back
    after = client.post("/embed", json={"texts": ["still serving"]})
    assert after.status_code == 200 and len(after.json()["embeddings"][0]) == 384


@pytest.mark.parametrize(
    "body", [b"--B\r\nNone--B--\r\n", b"--B\r\n9\xf1\xa7--B--\r\n", b"not multipart at all"]
)
def test_a_malformed_upload_is_a_fast_400(client: httpx.Client, body: bytes) -> None:
    """Found by fuzzing: these made the form parser raise inside the app, and the request hung
    until the 30 s traffic timeout, then 500."""
    resp = client.post(
        "/tenants/upload",
        content=body,
        headers={"content-type": "multipart/form-data; boundary=B"},
        timeout=10,
    )
    assert resp.status_code == 400 and resp.json()["error"] == "malformed multipart body"


def test_a_text_with_no_sentencepiece_pieces_is_still_classified(client: httpx.Client) -> None:
    """Found by fuzzing: control characters alone encode to no ids, which the runner refused."""
    examples = [{"text": t, "intent": i} for t, i in [("hi", "a"), ("hello", "a"), ("bye", "b"), ("ciao", "b")]]  # fmt: skip
    body = {"tenant": "blank-text", "examples": examples, "format": "onnx"}  # a SentencePiece model
    assert client.post("/tenants/train", json=body).status_code == 200
    resp = client.post("/classify", json={"tenant": "blank-text", "texts": ["\u0007", "hi"]})
    assert resp.status_code == 200 and len(resp.json()["intents"]) == 2, resp.text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/embed", {"texts": ["a"]}),
        ("/similarity", {"pairs": [["a", "b"]]}),
        ("/tokenize", {"texts": ["a"]}),
        ("/inference", {"input_text": "a"}),
    ],
)
def test_hot_routes_answer_in_one_sized_body(client: httpx.Client, path: str, body: dict) -> None:
    """The lean path: one pre-serialised body with its Content-Length, not a streamed response."""
    resp = client.post(path, json=body)
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
    assert int(resp.headers["content-length"]) == len(resp.content)
    if path != "/tokenize":  # (no runner call, no timings)
        assert "X-Total-Time" in resp.headers  # the ctx headers still reach the reply


def test_malformed_json_is_a_400(client: httpx.Client) -> None:
    resp = client.post("/embed", content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert "json" in resp.text.lower()


def test_pickle_is_refused_on_the_public_port(client: httpx.Client) -> None:
    resp = client.post(
        "/embed", content=b"\x80\x05N.", headers={"content-type": "application/vnd.bentoml+pickle"}
    )
    assert resp.status_code == 415


def test_concurrent_requests_are_batched_and_none_fail(
    client: httpx.Client, graph_server: Server
) -> None:
    """Hundreds of calls cross the runner hop with some always in flight: BentoML's default
    runner_connection (recycle after 100 requests) failed such calls; the runners raise it.
    A failure names what was answered, what the services shed and what they logged meanwhile."""

    def rows_sum() -> tuple[float, float]:
        text = client.get("/metrics").text

        def read(name: str) -> float:
            m = re.search(
                rf'^{name}\{{model="{MODEL.name}/onnx",runner="onnx_runner"\}} ([0-9.e+]+)$',
                text,
                re.M,
            )
            return float(m.group(1)) if m else 0.0

        return read("bundle_batch_rows_sum"), read("bundle_batch_rows_count")

    def shed() -> Counter[str]:
        lines = client.get("/metrics").text.splitlines()
        return Counter(
            {n: float(v) for n, v in (s.rsplit(" ", 1) for s in lines if s.startswith(SHED))}
        )

    rows0, calls0 = rows_sum()
    shed0 = shed()
    texts = corpus.load_texts()
    logged = graph_server.log.stat().st_size

    def user(i: int) -> list[str]:
        """What each call got: "200", or the status and the body's message, or the error."""
        got = []
        with httpx.Client(base_url=graph_server.url, timeout=60) as c:
            for k in range(20):
                try:
                    r = c.post("/embed", json={"texts": [texts[(i * 31 + k) % len(texts)]]})
                except httpx.HTTPError as exc:
                    got.append(f"{type(exc).__name__}: {FIGURES.sub('N', str(exc))[:200]}")
                    continue
                # Grouped by kind below: the figures in a message are masked.
                message = FIGURES.sub("N", r.text)[:200]
                got.append("200" if r.status_code == 200 else f"{r.status_code} {message}")
        return got

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        answers = [a for result in pool.map(user, range(32)) for a in result]
    failed = [a for a in answers if a != "200"]
    if failed:
        try:
            shed_meanwhile: object = dict(shed() - shed0)
        except httpx.HTTPError as exc:  # the report still goes out if the graph is gone
            shed_meanwhile = f"unknown ({type(exc).__name__}: {exc})"
        with graph_server.log.open("rb") as log:
            log.seek(logged)
            logged_meanwhile = log.read().decode(errors="replace")
        if len(logged_meanwhile) > 6000:  # the first errors and the last
            logged_meanwhile = f"{logged_meanwhile[:3000]}\n[...]\n{logged_meanwhile[-3000:]}"
        pytest.fail(
            f"{len(failed)} of {len(answers)} failed, most often: "
            f"{Counter(failed).most_common(5)}\nshed meanwhile: {shed_meanwhile}\n"
            f"logged meanwhile:\n{logged_meanwhile}"
        )
    time.sleep(2 * FLUSH_S)  # the runner writes its batch metrics within FLUSH_S of observing them
    rows1, calls1 = rows_sum()
    assert calls1 > calls0
    assert (rows1 - rows0) / (calls1 - calls0) > 1.0, "no engine call held more than one sequence"


def test_swagger_ui_and_openapi_are_served(client: httpx.Client) -> None:
    index = client.get("/")
    assert index.status_code == 200 and "swagger" in index.text.lower()
    spec = client.get("/docs.json").json()
    for path in ("/embed", "/similarity", "/tokenize", "/inference", "/classify"):
        assert path in spec["paths"]
    # Unknown fields are refused, and the schema says so.
    body = spec["paths"]["/embed"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body.get("additionalProperties") is False
    # The models served, and what they offer, are listed where a request names one.
    assert body["properties"]["model"]["enum"] == [MODEL.name]
    assert body["properties"]["backend"]["enum"] == list(MODEL.backends)
    assert body["properties"]["dimensions"]["enum"] == [384]


def test_every_swagger_example_is_a_request_that_works(client: httpx.Client) -> None:
    """What "Try it out" sends, endpoint by endpoint, in an order where each makes sense (train
    before classify, delete last): every example answers 200."""
    spec = client.get("/docs.json").json()
    examples = {
        path: media["example"]
        for path, item in spec["paths"].items()
        for op in item.values()
        for media in op.get("requestBody", {}).get("content", {}).values()
        if "example" in media
    }
    json_bodies = [
        p for p, item in spec["paths"].items()
        if "application/json" in item.get("post", {}).get("requestBody", {}).get("content", {})
    ]  # fmt: skip
    assert sorted(examples) == sorted(json_bodies)  # every JSON endpoint has one
    order = sorted(examples, key=lambda p: (p != "/tenants/train", p == "/tenants/delete"))
    for path in order:
        resp = client.post(path, json=examples[path])
        assert resp.status_code == 200, (path, resp.text)
    assert examples["/embed"]["texts"] != ["string"]


def test_the_demo_classifier_names_the_intent_of_what_users_say(client: httpx.Client) -> None:
    """The default catalogue's intent classifier, fine-tuned from MiniLM by `make models`: the
    intent of sentences a user would type (the README's two: one of the training templates and one
    held out; and a wording of neither), every intent scored, the scores a distribution, the best
    first."""
    said = ["I forgot my password", "where is my order", "I want my money back"]
    reply = client.post("/predict", json={"inputs": said})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model"] == "intent-classifier"
    best = [labels[0]["label"] for labels in body["predictions"]]
    assert best == ["reset_password", "order_status", "refund_status"], body
    for labels in body["predictions"]:
        assert {x["label"] for x in labels} == set(corpus.intent_templates().intents)
        scores = [x["score"] for x in labels]
        assert scores == sorted(scores, reverse=True) and abs(sum(scores) - 1) < 1e-4


# What a help desk's search would hand the reranker for "I forgot my password": the text of the same
# intent among others that share its words (both password texts are training templates: the gate
# of `make models` is what measures wordings the reranker never saw).
PASSWORD_QUERY = "I forgot my password"
PASSWORD_TEXTS = [
    "where is my order",
    "I lost my credit card",
    "reset my password please",
    "change the address on my account",
    "I want my money back",
]


def test_the_demo_reranker_ranks_the_same_intent_first(client: httpx.Client) -> None:
    """The default catalogue's reranker, fine-tuned by `make models` from the demo classifier: of
    the texts above, the one that asks for the same thing comes first, and every text is scored
    once, as a probability (the sigmoid of its logit)."""
    reply = client.post("/rerank", json={"query": PASSWORD_QUERY, "texts": PASSWORD_TEXTS})
    assert reply.status_code == 200, reply.text
    ranked = reply.json()
    assert PASSWORD_TEXTS[ranked[0]["index"]] == "reset my password please", ranked
    assert sorted(r["index"] for r in ranked) == list(range(len(PASSWORD_TEXTS)))
    scores = [r["score"] for r in ranked]
    assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)


def test_coheres_sdk_reranks_on_the_default_catalogue(graph: str) -> None:
    """`cohere.ClientV2(base_url=...)`, unchanged, against `make serve`'s graph: Cohere's v2 route,
    the default reranker chosen by its name, the same order as /rerank's."""
    import cohere

    v2 = cohere.ClientV2(base_url=graph, api_key="unused")
    answer = v2.rerank(
        model="intent-reranker", query=PASSWORD_QUERY, documents=PASSWORD_TEXTS, top_n=2
    )
    ours = httpx.post(
        f"{graph}/rerank", json={"query": PASSWORD_QUERY, "texts": PASSWORD_TEXTS}, timeout=60
    ).json()
    assert [r.index for r in answer.results] == [r["index"] for r in ours[:2]]
    assert PASSWORD_TEXTS[answer.results[0].index] == "reset my password please"
    for got, want in zip(answer.results, ours, strict=False):
        assert got.relevance_score == pytest.approx(want["score"], abs=1e-6)


def test_embed_in_base64_is_the_same_vectors_in_under_half_the_bytes(client: httpx.Client) -> None:
    texts = ["A man is eating food.", "hello"]
    floats = client.post("/embed", json={"texts": texts})
    packed = client.post("/embed", json={"texts": texts, "encoding": "base64"})
    assert floats.status_code == packed.status_code == 200, packed.text
    decoded = [np.frombuffer(base64.b64decode(v), "<f4") for v in packed.json()["embeddings"]]
    np.testing.assert_array_equal(decoded, np.array(floats.json()["embeddings"], dtype=np.float32))
    assert packed.json()["tokens"] == floats.json()["tokens"]
    # JSON floats are each float32's shortest decimal (~12 characters); base64, 5.3 a number
    assert len(packed.content) < len(floats.content) / 2
    bad = client.post("/embed", json={"texts": texts, "encoding": "int8"})
    assert bad.status_code == 400 and "encoding" in bad.text
