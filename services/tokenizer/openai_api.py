"""OpenAI's embeddings API on the public service: ``POST /v1/embeddings``, ``GET /v1/models``.

Every embedding server users pick instead (text-embeddings-inference, infinity, vLLM, Ollama) answers
this API, so the ``openai`` SDK and what is built on it work unchanged. Requests go through the same
coalescing queues as ``/embed`` (same batching, same shedding); errors use OpenAI's shape
(``{"error": {"message", "type", "param", "code"}}``) and status codes, and 429/503 carry
``Retry-After``, so the SDK's own retries back off as the server asks.

A Starlette app mounted inside the BentoML service (``@bentoml.asgi_app``): its error shape is not
BentoML's, and the route needs none of BentoML's per-request input machinery.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Annotated, Any, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import to_json
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.tokenizer.schemas import Text
from services.tokenizer.settings import SETTINGS, Backend
from services.tokenizer.vectors import Encoding, encode
from serving.contracts import EMBEDDING_DIM
from serving.errors import Overloaded

MOUNT = "/v1"
EMBEDDINGS_PATH = f"{MOUNT}/embeddings"
MODELS_PATH = f"{MOUNT}/models"
# Model names clients send, and the backend each one is served by.
MODELS: dict[str, Backend] = {
    "all-MiniLM-L6-v2": "onnx",
    "all-MiniLM-L6-v2-int8": "onnx-int8",
    "all-MiniLM-L6-v2-tf": "tf",
}
OWNER = "bento-bundle"
CREATED = int(time.time())  # OpenAI's model objects carry a creation time: when this server started


class EmbeddingsRequest(BaseModel):
    # OpenAI refuses arguments it does not know, and so do we (a typo is not silently ignored).
    model_config = ConfigDict(extra="forbid", strict=True)

    input: Text | Annotated[list[Text], Field(min_length=1, max_length=SETTINGS.max_texts)] = Field(
        description="A text, or a list of texts, to embed. Token arrays are not accepted."
    )
    model: str = Field(description="One of GET /v1/models: " + ", ".join(MODELS) + ".")
    encoding_format: Encoding = Field(
        "float", description="base64: each vector as little-endian float32 bytes, base64-encoded."
    )
    dimensions: int = Field(
        EMBEDDING_DIM,
        description=f"Output size; MiniLM's vectors have {EMBEDDING_DIM} dimensions only.",
    )
    user: str = Field("", description="Accepted and ignored.")

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else self.input


class Embedding(Protocol):
    """What the route needs from the service: the same path as ``/embed``."""

    async def embed_texts(
        self, texts: list[str], backend: Backend
    ) -> tuple[np.ndarray, list[int], dict[str, str]]:
        """Vectors (rows in order), tokens per text, timing headers."""
        ...


class OpenAIError(Exception):
    """An error in OpenAI's shape, with its status code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.param, self.code, self.headers = param, code, headers or {}

    def response(self) -> Response:
        body = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        return _json({"error": body}, self.status, self.headers)


def _json(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(to_json(content), status, headers, media_type="application/json")


def unknown_model(name: str) -> OpenAIError:
    return OpenAIError(
        404,
        f"The model `{name}` does not exist. Models served here: {', '.join(MODELS)}.",
        param="model",
        code="model_not_found",
    )


def _refusal(exc: ValidationError) -> OpenAIError:
    """The first problem, named by its field: what OpenAI's 400s say."""
    error = exc.errors(include_url=False)[0]
    loc = [str(part) for part in error["loc"]]
    if error["type"] == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {loc[-1]}"
    else:
        message = f"{'.'.join(loc) or 'body'}: {error['msg']}"
    return OpenAIError(400, message, param=loc[0] if loc else None)


def parse(body: bytes) -> EmbeddingsRequest:
    """The request, or the OpenAIError that refuses it."""
    try:
        request = EmbeddingsRequest.model_validate_json(body)
    except ValidationError as exc:
        if _is_token_array(body):
            raise OpenAIError(
                400,
                "input: token arrays are not accepted (OpenAI's token ids are not this model's); "
                "send the text itself",
                param="input",
            ) from None
        raise _refusal(exc) from None
    if request.model not in MODELS:
        raise unknown_model(request.model)
    if request.dimensions != EMBEDDING_DIM:
        raise OpenAIError(
            400,
            f"dimensions: {request.model} has {EMBEDDING_DIM} dimensions; "
            f"{request.dimensions} is not supported",
            param="dimensions",
        )
    return request


def _is_token_array(body: bytes) -> bool:
    try:
        value = json.loads(body).get("input")
    except (ValueError, AttributeError):
        return False
    return isinstance(value, list) and any(isinstance(v, int | list) for v in value)


def model_card(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": CREATED, "owned_by": OWNER}


def openapi_paths() -> dict[str, Any]:
    """These routes as OpenAPI path items, for the public document (openapi.py adds them: BentoML
    documents its own APIs only). Model names and ``dimensions`` are enumerated, so schema-driven
    clients (and the fuzzing tests) know what is valid."""
    request = EmbeddingsRequest.model_json_schema()
    request["properties"]["model"]["enum"] = list(MODELS)
    request["properties"]["dimensions"]["enum"] = [EMBEDDING_DIM]
    string = {"type": "string"}
    error = _object(
        error=_object(
            message=string,
            type=string,
            param={**string, "nullable": True},
            code={**string, "nullable": True},
        )
    )
    embedding = _object(
        object={"type": "string", "enum": ["embedding"]},
        index={"type": "integer"},
        embedding={"oneOf": [{"type": "array", "items": {"type": "number"}}, string]},
    )
    usage = _object(prompt_tokens={"type": "integer"}, total_tokens={"type": "integer"})
    card = _object(
        id=string,
        object={"type": "string", "enum": ["model"]},
        created={"type": "integer"},
        owned_by=string,
    )
    cards = _object(object={"type": "string", "enum": ["list"]}, data=_array(card))
    reply = _object(
        object={"type": "string", "enum": ["list"]},
        data=_array(embedding),
        model=string,
        usage=usage,
    )

    def answers(ok: dict[str, Any], *codes: int) -> dict[str, Any]:
        out = {"200": _json_content("OK", ok)}
        out.update({str(c): _json_content("OpenAI's error shape", error) for c in codes})
        return out

    name = {
        "name": "name",
        "in": "path",
        "required": True,
        "schema": {**string, "enum": list(MODELS)},
    }
    return {
        EMBEDDINGS_PATH: {
            "post": {
                "summary": "OpenAI-compatible embeddings (the openai SDK works unchanged)",
                "description": "Same batching and shedding as /embed. Models: "
                + ", ".join(f"{m} ({b})" for m, b in MODELS.items())
                + ". 429/503 carry Retry-After.",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": request}},
                },
                "responses": answers(reply, 400, 404, 415, 429, 503),
            }
        },
        MODELS_PATH: {
            "get": {"summary": "The models served (OpenAI's list)", "responses": answers(cards)}
        },
        MODELS_PATH + "/{name}": {
            "get": {
                "summary": "One model (OpenAI's retrieve)",
                "parameters": [name],
                "responses": answers(card, 404),
            }
        },
    }


def _object(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": list(properties), "properties": properties}


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


def _json_content(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def openai_app(service: Callable[[], Embedding]) -> Starlette:
    """``service`` returns the running service instance (read per request: the app is built first)."""

    async def embeddings(request: Request) -> Response:
        try:
            content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if content_type != "application/json":
                raise OpenAIError(
                    415, f"send a JSON body (content-type: application/json, got {content_type!r})"
                )
            body = parse(await request.body())
            texts = body.texts()
            vectors, tokens, headers = await service().embed_texts(texts, MODELS[body.model])
        except OpenAIError as exc:
            return exc.response()
        except Overloaded as exc:
            return _overloaded(exc).response()
        used = sum(tokens)
        data = [
            {"object": "embedding", "index": i, "embedding": e}
            for i, e in enumerate(encode(vectors, body.encoding_format))
        ]
        reply = {
            "object": "list",
            "data": data,
            "model": body.model,
            "usage": {"prompt_tokens": used, "total_tokens": used},
        }
        return _json(reply, headers=headers)

    async def models(_: Request) -> Response:
        return _json({"object": "list", "data": [model_card(name) for name in MODELS]})

    async def model(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in MODELS:
            return unknown_model(name).response()
        return _json(model_card(name))

    return Starlette(
        routes=[
            Route(EMBEDDINGS_PATH.removeprefix(MOUNT), embeddings, methods=["POST"]),
            Route(MODELS_PATH.removeprefix(MOUNT), models, methods=["GET"]),
            Route(MODELS_PATH.removeprefix(MOUNT) + "/{name:path}", model, methods=["GET"]),
        ]
    )


def _overloaded(exc: Overloaded) -> OpenAIError:
    """Shedding, as OpenAI reports it: 429 rate limit or 503 unavailable, with Retry-After."""
    if exc.status == 429:
        kind, code = "rate_limit_error", "rate_limit_exceeded"
    else:
        kind, code = "server_error", "service_unavailable"
    return OpenAIError(exc.status, exc.reason, kind=kind, code=code, headers=exc.headers())
