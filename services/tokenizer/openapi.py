"""The public OpenAPI document, completed where BentoML's generator leaves it short of the API.

BentoML 1.4.39 generates ``/docs.json`` from the service's signatures, but
- declares no request body as required, although every JSON endpoint refuses a request without one
  (415: no content type; 400: no body): clients and schema-driven tools (the fuzzing tests among
  them) read such a request as valid;
- documents its own APIs only, not the OpenAI routes mounted beside them;
- gives no request examples, so the Swagger UI's "Try it out" sends ``{"texts": ["string"]}``;
- keeps the first branch of a union only: ``/embed``'s vectors are float lists *or* base64 strings;
- knows nothing of the catalogue: a request's ``model`` is any string in its schema.
``refine`` marks each body required, restores the unions, lists the models served (and their
backends and widths) where a request names one, adds OpenAI's routes and a realistic example per
endpoint; the service applies it to ``GET /docs.json`` (serving/openapi_docs.py).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from services.tokenizer import cohere_api
from services.tokenizer.cohere_api import RERANK_V1, RERANK_V2
from services.tokenizer.openai_api import EMBEDDINGS_PATH, MODELS, openapi_paths
from services.tokenizer.schemas import EmbedResponse
from serving.catalogue import ModelSpec
from serving.protocol import TenantInfo

# The default embed model (the OpenAI table lists embed models, the default first).
_MODEL = next(iter(MODELS.values()), ("", "onnx"))[0]
_TEXTS = ["How do I reset my password?", "Where is my order?"]
_TRAINING = [
    {"text": "where is my order", "intent": "order_status"},
    {"text": "has my parcel shipped", "intent": "order_status"},
    {"text": "hello there", "intent": "greeting"},
    {"text": "good morning", "intent": "greeting"},
]
# What "Try it out" sends on each endpoint: requests a user would send, valid as they are.
EXAMPLES: dict[str, dict[str, Any]] = {
    "/embed": {"texts": _TEXTS, "model": _MODEL, "encoding": "float"},
    "/similarity": {
        "pairs": [["A man is eating food.", "A man is eating a piece of bread."]],
        "threshold": 0.5,
    },
    "/tokenize": {"texts": ["Hello, world!"], "model": _MODEL},
    "/inference": {"input_text": "How do I reset my password?"},
    "/classify": {"tenant": "acme", "texts": ["where is my parcel", "hello"]},
    "/tenants/train": {"tenant": "acme", "examples": _TRAINING, "format": "head"},
    "/tenants/list": {},
    "/tenants/show": {"tenant": "acme"},
    "/tenants/delete": {"tenant": "acme"},
    EMBEDDINGS_PATH: {"input": _TEXTS, "model": next(iter(MODELS)), "encoding_format": "float"},
    "/rerank": {
        "query": "where is my order",
        "texts": ["has my parcel shipped", "good morning", "I want a refund"],
        "top_n": 2,
        "return_text": True,
    },
    "/predict": {"inputs": ["where is my order", "good morning"]},
    RERANK_V2: {
        "query": "where is my order",
        "documents": ["has my parcel shipped", "good morning"],
        "top_n": 1,
    },
    RERANK_V1: {
        "query": "where is my order",
        "documents": ["has my parcel shipped", "good morning"],
        "return_documents": True,
    },
}


# Answers with a union field, restored from the model (path → the response's model).
UNION_ANSWERS: dict[str, type[BaseModel]] = {"/embed": EmbedResponse, "/tenants/show": TenantInfo}


# Where a request names a model (path → field, and the task its model must have; None: any).
MODEL_FIELDS: dict[str, tuple[str, str | None]] = {
    "/embed": ("model", "embed"),
    "/similarity": ("model", "embed"),
    "/tokenize": ("model", None),
    "/tenants/train": ("encoder", "embed"),
    "/rerank": ("model", "rerank"),
    "/predict": ("model", "classify"),
    RERANK_V2: ("model", "rerank"),
    RERANK_V1: ("model", "rerank"),
}


def _request_properties(paths: dict[str, Any], path: str) -> dict[str, Any]:
    body = paths.get(path, {}).get("post", {}).get("requestBody", {})
    schema = body.get("content", {}).get("application/json", {}).get("schema", {})
    properties: dict[str, Any] = schema.get("properties", {})
    return properties


def name_models(paths: dict[str, Any], served: list[ModelSpec]) -> None:
    """Each field that names a model lists the models served of its task; ``backend`` and
    ``dimensions`` list what those models offer (a combination one model lacks is a 400)."""
    for path, (field, task) in MODEL_FIELDS.items():
        properties = _request_properties(paths, path)
        models = [s for s in served if task is None or s.task == task]
        if field in properties and models:
            properties[field]["enum"] = [s.name for s in models]
        if "backend" in properties and models:
            backends = {b for s in models for b in s.backends}
            properties["backend"]["enum"] = [
                b for b in properties["backend"]["enum"] if b in backends
            ]
        if "dimensions" in properties and models:
            widths = sorted({w for s in models for w in (s.dim, *(s.dimensions or ()))})
            properties["dimensions"]["enum"] = widths


def refine(spec: dict[str, Any], served: list[ModelSpec] | None = None) -> dict[str, Any]:
    paths = spec.setdefault("paths", {})
    paths.update(cohere_api.openapi_paths())
    name_models(paths, served or [])
    paths.update(openapi_paths())
    # OpenAI's `dimensions` (nullable): the widths the served embed models offer.
    embed = [s for s in served or [] if s.task == "embed"]
    openai = _request_properties(paths, EMBEDDINGS_PATH)
    if "dimensions" in openai and embed:
        widths = sorted({w for s in embed for w in (s.dim, *(s.dimensions or ()))})
        openai["dimensions"]["enum"] = [*widths, None]
    for path, model in UNION_ANSWERS.items():
        answer = paths.get(path, {}).get("post", {}).get("responses", {}).get("200", {})
        schema = answer.get("content", {}).get("application/json", {}).get("schema", {})
        for name, field in model.model_json_schema()["properties"].items():
            if "anyOf" in field and name in schema.get("properties", {}):
                schema["properties"][name] = field
    for path, item in paths.items():
        for operation in item.values():
            if isinstance(operation, dict) and "requestBody" in operation:
                operation["requestBody"]["required"] = True
                if path in EXAMPLES:
                    for media in operation["requestBody"].get("content", {}).values():
                        media["example"] = EXAMPLES[path]
    return spec
