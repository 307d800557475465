"""TF Serving's REST API and the runner's own embed API, on the ONNX runner's ASGI app in this
process (real engines, no server): predict in both forms, status, metadata, TF Serving's errors."""

from __future__ import annotations

import numpy as np
import pytest
from starlette.testclient import TestClient

from models.encoder import tokenizer_of

IDS = [101, 7592, 2088, 102]  # [CLS] hello world [SEP]


def test_predict_api_strips_padding(onnx_runner: TestClient) -> None:
    padded = {"inputs": {"input_ids": [[*IDS, 0, 0, 0]], "attention_mask": [[1, 1, 1, 1, 0, 0, 0]]}}
    plain = {"inputs": {"input_ids": [IDS]}}
    a = onnx_runner.post("/v1/models/all-MiniLM-L6-v2:predict", json=padded)
    b = onnx_runner.post("/v1/models/all-MiniLM-L6-v2:predict", json=plain)
    assert a.status_code == b.status_code == 200, a.text
    assert np.array(a.json()["outputs"]).shape == (1, 384)
    np.testing.assert_allclose(a.json()["outputs"], b.json()["outputs"], atol=1e-6)
    int8 = onnx_runner.post("/v1/models/all-MiniLM-L6-v2-int8:predict", json=plain).json()[
        "outputs"
    ]
    assert np.dot(int8[0], b.json()["outputs"][0]) > 0.95


def test_the_names_clients_sent_before_the_catalogue_still_serve(onnx_runner: TestClient) -> None:
    """The default catalogue's alias: `minilm` and `minilm-int8`, as TF Serving's clients called
    the model when it was the only one, answer as its catalogue names do."""
    body = {"inputs": {"input_ids": [IDS]}}
    for old, new in (("minilm", "all-MiniLM-L6-v2"), ("minilm-int8", "all-MiniLM-L6-v2-int8")):
        before = onnx_runner.post(f"/v1/models/{old}:predict", json=body)
        now = onnx_runner.post(f"/v1/models/{new}:predict", json=body)
        assert before.status_code == now.status_code == 200, before.text
        np.testing.assert_allclose(before.json()["outputs"], now.json()["outputs"], atol=1e-6)
        status = onnx_runner.get(f"/v1/models/{old}").json()
        assert status["model_version_status"][0]["state"] == "AVAILABLE"


def test_predict_api_errors(onnx_runner: TestClient) -> None:
    missing = onnx_runner.post("/v1/models/bert:predict", json={"inputs": {"input_ids": [IDS]}})
    assert missing.status_code == 404 and "bert" in missing.text
    ragged = onnx_runner.post(
        "/v1/models/all-MiniLM-L6-v2:predict",
        json={"inputs": {"input_ids": [IDS], "attention_mask": [[1]]}},
    )
    assert ragged.status_code == 400 and "attention_mask" in ragged.text
    out_of_vocab = onnx_runner.post(
        "/v1/models/all-MiniLM-L6-v2:predict", json={"inputs": {"input_ids": [[101, 99999]]}}
    )
    assert out_of_vocab.status_code == 400


def test_rows_and_columns_give_the_same_numbers(onnx_runner: TestClient) -> None:
    seqs = [IDS, [101, 2023, 2003, 1037, 3231, 102]]
    columns = onnx_runner.post(
        "/v1/models/all-MiniLM-L6-v2:predict", json={"inputs": {"input_ids": seqs}}
    )
    rows = onnx_runner.post(
        "/v1/models/all-MiniLM-L6-v2:predict",
        json={
            "signature_name": "serving_default",
            "instances": [{"input_ids": s, "attention_mask": [1] * len(s)} for s in seqs],
        },
    )
    assert columns.status_code == rows.status_code == 200, rows.text
    assert list(rows.json()) == ["predictions"] and list(columns.json()) == ["outputs"]
    np.testing.assert_allclose(rows.json()["predictions"], columns.json()["outputs"], atol=1e-6)
    for path in ("/versions/1", "/labels/stable"):
        same = onnx_runner.post(
            f"/v1/models/all-MiniLM-L6-v2{path}:predict", json={"inputs": {"input_ids": seqs}}
        )
        np.testing.assert_allclose(same.json()["outputs"], columns.json()["outputs"], atol=1e-6)


def test_status_and_metadata_match_the_contract(onnx_runner: TestClient) -> None:
    for path in ("", "/versions/1", "/labels/stable"):
        status = onnx_runner.get(f"/v1/models/all-MiniLM-L6-v2-int8{path}")
        assert status.status_code == 200, status.text
        [version] = status.json()["model_version_status"]
        assert version["version"] == "1" and version["state"] == "AVAILABLE"
    meta = onnx_runner.get("/v1/models/all-MiniLM-L6-v2/metadata").json()
    assert meta["model_spec"] == {"name": "all-MiniLM-L6-v2", "signature_name": "", "version": "1"}
    signature = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    dtypes = {"int64": "DT_INT64", "float32": "DT_FLOAT"}
    contract = tokenizer_of("all-MiniLM-L6-v2")[1].contract()
    for kind, specs in (("inputs", contract.inputs), ("outputs", contract.outputs)):
        assert sorted(signature[kind]) == sorted(s.name for s in specs)
        for spec in specs:
            tensor = signature[kind][spec.name]
            assert tensor["dtype"] == dtypes[spec.dtype]
            sizes = [int(d["size"]) for d in tensor["tensor_shape"]["dim"]]
            assert sizes == [-1 if d is None else d for d in spec.shape]
    assert sizes == [-1, 384]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "says"),
    [
        ("post", "/v1/models/all-MiniLM-L6-v2:predict", {"inputs": {"input_idz": [IDS]}}, 400, "input_idz"),
        ("post", "/v1/models/all-MiniLM-L6-v2:predict", {"instances": [{"mask": IDS}]}, 400, "mask"),
        ("post", "/v1/models/all-MiniLM-L6-v2:predict", {"instances": [IDS]}, 400, "plain list"),
        ("post", "/v1/models/all-MiniLM-L6-v2:predict", {"inputs": {"input_ids": [IDS]}, "instances": []}, 400, "only one"),
        ("post", "/v1/models/all-MiniLM-L6-v2:predict", {}, 400, "Missing 'inputs' or 'instances'"),
        ("post", "/v1/models/all-MiniLM-L6-v2:predict", {"signature_name": "x", "inputs": {"input_ids": [IDS]}}, 400, '"x"'),
        ("post", "/v1/models/all-MiniLM-L6-v2/versions/2:predict", {"inputs": {"input_ids": [IDS]}}, 404, "Specific(all-MiniLM-L6-v2, 2)"),
        ("post", "/v1/models/all-MiniLM-L6-v2/labels/canary:predict", {"inputs": {"input_ids": [IDS]}}, 400, "canary"),
        ("get", "/v1/models/bert", None, 404, "bert"),
        ("get", "/v1/models/all-MiniLM-L6-v2/versions/7", None, 404, "version 7"),
        ("get", "/v1/models/bert/metadata", None, 404, "Latest(bert)"),
        ("get", "/v1/models/all-MiniLM-L6-v2/other/thing", None, 400, "Malformed request"),
        ("get", "/v1/models/bert:predict", None, 400, "Malformed request"),
        ("get", "/v1/other", None, 400, "Malformed request: GET /v1/other"),
        ("post", "/v1/models/bert:predict", None, 404, "Latest(bert)"),  # the URL before the body
        ("delete", "/v1/models/all-MiniLM-L6-v2", None, 400, "Malformed request"),
        ("post", "/v1/models/all-MiniLM-L6-v2/metadata", {}, 400, "Malformed request"),
        ("post", "/v1/models/all-MiniLM-L6-v2:predict", {"inputs": {"input_ids": [IDS], "token_type_ids": [[0, 1, 1, 1]]}}, 400, "token_type_ids must be 0"),
        ("post", "/v1/models/all-MiniLM-L6-v2:predict", {"inputs": {"input_ids": [IDS], "attention_mask": [[1, 1, 2, 1]]}}, 400, "attention_mask[0][2]"),
        ("post", "/v1/models/all-MiniLM-L6-v2:predict", {"inputs": {"input_ids": [[True, False]]}}, 400, "not a boolean"),
        ("post", "/v1/models/all-MiniLM-L6-v2:predict", {"inputs": {"input_ids": [IDS], "attention_mask": [[True, 1, 1, 1]]}}, 400, "not a boolean"),
    ],
)  # fmt: skip
def test_tf_serving_errors_say_what_is_wrong(
    onnx_runner: TestClient, method: str, path: str, body: dict | None, status: int, says: str
) -> None:
    reply = onnx_runner.request(method, path, json=body)
    assert reply.status_code == status, reply.text
    assert list(reply.json()) == ["error"] and says in reply.json()["error"], reply.text


def test_a_mask_given_as_strings_or_floats_strips_the_same(onnx_runner: TestClient) -> None:
    plain = onnx_runner.post(
        "/v1/models/all-MiniLM-L6-v2:predict", json={"inputs": {"input_ids": [IDS]}}
    )
    for mask in (["1", "1", "1", "1", "0"], [1.0, 1.0, 1.0, 1.0, 0.0]):
        padded = {"inputs": {"input_ids": [[*IDS, 0]], "attention_mask": [mask]}}
        reply = onnx_runner.post("/v1/models/all-MiniLM-L6-v2:predict", json=padded)
        assert reply.status_code == 200, reply.text
        np.testing.assert_allclose(reply.json()["outputs"], plain.json()["outputs"], atol=1e-6)


def test_urls_are_case_insensitive_as_tf_servings_are(onnx_runner: TestClient) -> None:
    body = {"inputs": {"input_ids": [IDS]}}
    reply = onnx_runner.post("/v1/Models/all-MiniLM-L6-v2/Versions/1:PREDICT", json=body)
    assert reply.status_code == 200 and len(reply.json()["outputs"][0]) == 384, reply.text
    bad = onnx_runner.post("/v1/models/all-MiniLM-L6-v2/metadata", content=b"{not json")
    assert bad.status_code == 400 and "Malformed request" in bad.json()["error"]


def test_json_nested_too_deep_is_a_400(onnx_runner: TestClient) -> None:
    deep = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    reply = onnx_runner.post("/v1/models/all-MiniLM-L6-v2:predict", content=deep)
    assert reply.status_code == 400 and "JSON Parse error" in reply.json()["error"]


def test_runner_embed_api_checks_token_ids(onnx_runner: TestClient) -> None:
    ok = onnx_runner.post("/embed", json={"ids": [IDS], "variant": "fp32"})
    assert ok.status_code == 200, ok.text
    assert float(ok.headers["x-inference-time"]) > 0
    for bad in (
        {"ids": []},
        {"ids": [[]]},
        {"ids": [[-1]]},
        {"ids": [[30522]]},
        {"ids": [[101, True, 102]]},  # pydantic's lax int would take JSON true as the id 1
        {"ids": [[101, 2023.0, 102]]},
        {"ids": [[101, "2023", 102]]},
        {"ids": [IDS], "variant": "fp16"},
    ):
        resp = onnx_runner.post("/embed", json=bad)
        assert resp.status_code == 400, (bad, resp.text)
        # One error format on every service: a string naming the field, no internal class names.
        body = resp.json()
        assert isinstance(body.get("detail", body["error"]), str), body
        assert "validation error for" not in resp.text
    vocabulary = onnx_runner.post("/embed", json={"ids": [IDS, [101, 30522]]}).json()["error"]
    assert vocabulary == "ids[1]: id 30522 is not in all-MiniLM-L6-v2's vocabulary of 30522"
    named = onnx_runner.post("/embed", json={"ids": [IDS], "model": "all-MiniLM-L6-v2"})
    np.testing.assert_allclose(named.json()["embeddings"], ok.json()["embeddings"], atol=1e-6)
    unknown = onnx_runner.post("/embed", json={"ids": [IDS], "model": "bert-base"})
    assert unknown.status_code == 404 and "'bert-base'" in unknown.json()["error"], unknown.text
    assert "all-MiniLM-L6-v2 (onnx)" in unknown.json()["error"]
