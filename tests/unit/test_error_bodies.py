"""The public port's one error format: BentoML's two off-schema 4xx shapes are rewritten."""

from __future__ import annotations

import json

from serving.error_bodies import conform
from serving.hot_path import is_json


def test_validation_details_become_one_string_naming_the_fields() -> None:
    body = {
        "error": "2 validation errors for EmbedRequest",
        "detail": [
            {"loc": ["texts", 0], "msg": "String should have at least 1 character"},
            {"loc": ["backend"], "msg": "Input should be 'onnx'"},
        ],
    }
    out = json.loads(conform(json.dumps(body).encode()))
    assert out["error"] == "invalid request: 2 problems (see detail)"
    assert out["detail"] == (
        "texts.0: String should have at least 1 character; backend: Input should be 'onnx'"
    )


def test_no_internal_class_name_reaches_the_client() -> None:
    # What BentoML sent for a body that is not an object, before the rewrite.
    body = {"error": "1 validation error for EmbedRequestIODescriptor",
            "detail": ": Input should be an object"}  # fmt: skip
    out = json.loads(conform(json.dumps(body).encode()))
    assert out == {"error": "invalid request: 1 problem (see detail)",
                   "detail": "body: Input should be an object"}  # fmt: skip
    assert "IODescriptor" not in json.dumps(out)


def test_a_list_wrapped_error_becomes_the_object() -> None:
    assert json.loads(conform(b'[{"error": "invalid JSON"}]')) == {"error": "invalid JSON"}


def test_what_already_conforms_or_is_not_json_is_left_alone() -> None:
    assert json.loads(conform(b'{"error": "unknown tenant"}')) == {"error": "unknown tenant"}
    assert conform(b"not json") == b"not json"
    assert conform(b"[1, 2]") == b"[1, 2]"


def test_json_media_types() -> None:
    assert is_json(b"application/json")
    assert is_json(b"application/json; charset=utf-8")
    assert is_json(b"application/problem+json")
    for other in (b"", b"text/plain", b"application/vnd.bentoml+pickle", b"multipart/form-data"):
        assert not is_json(other)
