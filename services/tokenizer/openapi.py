"""The public OpenAPI document, completed where BentoML's generator leaves it short of the API.

BentoML 1.4.39 generates ``/docs.json`` from the service's signatures, but
- declares no request body as required, although every JSON endpoint refuses a request without one
  (415: no content type; 400: no body): clients and schema-driven tools (the fuzzing tests among
  them) read such a request as valid;
- documents its own APIs only, not the OpenAI routes mounted beside them;
- gives no request examples, so the Swagger UI's "Try it out" sends ``{"texts": ["string"]}``;
- keeps the first branch of a union only: ``/embed``'s vectors are float lists *or* base64 strings.
``refine`` marks each body required, restores the unions, adds OpenAI's routes and a realistic
example per endpoint;
the service applies it to ``GET /docs.json`` (serving/openapi_docs.py).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from services.tokenizer.openai_api import EMBEDDINGS_PATH, MODELS, openapi_paths
from services.tokenizer.schemas import EmbedResponse

_TEXTS = ["How do I reset my password?", "Where is my order?"]
_TRAINING = [
    {"text": "where is my order", "intent": "order_status"},
    {"text": "has my parcel shipped", "intent": "order_status"},
    {"text": "hello there", "intent": "greeting"},
    {"text": "good morning", "intent": "greeting"},
]
# What "Try it out" sends on each endpoint: requests a user would send, valid as they are.
EXAMPLES: dict[str, dict[str, Any]] = {
    "/embed": {"texts": _TEXTS, "backend": "onnx", "encoding": "float"},
    "/similarity": {
        "pairs": [["A man is eating food.", "A man is eating a piece of bread."]],
        "threshold": 0.5,
    },
    "/tokenize": {"texts": ["Hello, world!"], "tokenizer": "minilm"},
    "/inference": {"input_text": "How do I reset my password?"},
    "/classify": {"tenant": "acme", "texts": ["where is my parcel", "hello"]},
    "/tenants/train": {"tenant": "acme", "examples": _TRAINING, "format": "head"},
    "/tenants/list": {},
    "/tenants/show": {"tenant": "acme"},
    "/tenants/delete": {"tenant": "acme"},
    EMBEDDINGS_PATH: {"input": _TEXTS, "model": next(iter(MODELS)), "encoding_format": "float"},
}


# Answers with a union field, restored from the model (path → the response's model).
UNION_ANSWERS: dict[str, type[BaseModel]] = {"/embed": EmbedResponse}


def refine(spec: dict[str, Any]) -> dict[str, Any]:
    paths = spec.setdefault("paths", {})
    for path, model in UNION_ANSWERS.items():
        answer = paths.get(path, {}).get("post", {}).get("responses", {}).get("200", {})
        schema = answer.get("content", {}).get("application/json", {}).get("schema", {})
        for name, field in model.model_json_schema()["properties"].items():
            if "anyOf" in field and name in schema.get("properties", {}):
                schema["properties"][name] = field
    paths.update(openapi_paths())
    for path, item in paths.items():
        for operation in item.values():
            if isinstance(operation, dict) and "requestBody" in operation:
                operation["requestBody"]["required"] = True
                if path in EXAMPLES:
                    for media in operation["requestBody"].get("content", {}).values():
                        media["example"] = EXAMPLES[path]
    return spec
