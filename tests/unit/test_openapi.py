"""The public OpenAPI document declares every request body required, as the API enforces."""

from __future__ import annotations

from services.tokenizer.openapi import refine


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
