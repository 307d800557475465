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
