"""The public OpenAPI document: every request body required (as the API enforces), an example
for each, OpenAI's routes, and /embed's answer documented as the union it is."""

from __future__ import annotations

from services.tokenizer.openapi import EXAMPLES, refine


def test_every_request_body_is_marked_required() -> None:
    spec = {
        "paths": {
            "/embed": {"post": {"requestBody": {"content": {"application/json": {}}}}},
            "/metrics": {"get": {"responses": {}}},
        }
    }
    refined = refine(spec)
    assert refined["paths"]["/embed"]["post"]["requestBody"]["required"] is True
    assert "requestBody" not in refined["paths"]["/metrics"]["get"]


def test_examples_openai_routes_and_the_union_are_added() -> None:
    float_only = {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}
    embed = {
        "requestBody": {"content": {"application/json": {}}},
        "responses": {"200": {"content": {"application/json": {"schema": {"properties": {
            "embeddings": float_only}}}}}},
    }  # fmt: skip
    refined = refine({"paths": {"/embed": {"post": embed}}})
    paths = refined["paths"]
    example = paths["/embed"]["post"]["requestBody"]["content"]["application/json"]["example"]
    assert example == EXAMPLES["/embed"] and example["texts"] != ["string"]
    answer = paths["/embed"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    branches = answer["properties"]["embeddings"]["anyOf"]
    assert {"type": "string"} in [b["items"] for b in branches]  # base64 strings documented
    assert {"/v1/embeddings", "/v1/models", "/v1/models/{name}"} <= set(paths)
    openai = paths["/v1/embeddings"]["post"]["requestBody"]["content"]["application/json"]
    assert openai["example"]["model"] in openai["schema"]["properties"]["model"]["enum"]


def test_a_tenants_encoder_is_documented_as_possibly_null() -> None:
    """A whole-model tenant has no encoder: /tenants/show answers null there, and its schema (which
    BentoML writes as a plain string) must say so."""
    show = {
        "requestBody": {"content": {"application/json": {}}},
        "responses": {"200": {"content": {"application/json": {"schema": {"properties": {
            "encoder": {"type": "string"}}}}}}},
    }  # fmt: skip
    refined = refine({"paths": {"/tenants/show": {"post": show}}})
    answer = refined["paths"]["/tenants/show"]["post"]["responses"]["200"]["content"]
    encoder = answer["application/json"]["schema"]["properties"]["encoder"]
    assert {"type": "null"} in encoder["anyOf"] and {"type": "string"} in encoder["anyOf"]


def test_predict_inputs_are_documented_as_every_shape_they_take() -> None:
    """One text, a list of texts, or a list of pairs, each accepted, each in the schema, with the
    item counts on the arrays (the same limits the request enforces)."""
    from services.tokenizer.schemas import PredictRequest
    from services.tokenizer.settings import SETTINGS

    schema = PredictRequest.model_json_schema()["properties"]["inputs"]
    assert "maxLength" not in schema and "minLength" not in schema  # a string's, not a list's
    text, texts, pairs = schema["anyOf"]
    assert text["type"] == "string" and texts["items"]["type"] == "string"
    assert pairs["items"]["minItems"] == pairs["items"]["maxItems"] == 2
    assert texts["maxItems"] == pairs["maxItems"] == SETTINGS.max_texts
    for sent in ("one text", ["a", "b"], [["query", "text"]]):
        assert PredictRequest.model_validate({"inputs": sent}).inputs
