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

import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Protocol

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.tokenizer.schemas import VISIBLE
from services.tokenizer.settings import SETTINGS
from services.tokenizer.vectors import Encoding, encode
from serving import catalogue
from serving.catalogue import Backend, Entry
from serving.errors import ApiError, Overloaded, TooManyTokens
from serving.replies import reply as _json

MOUNT = "/v1"
EMBEDDINGS_PATH = f"{MOUNT}/embeddings"
MODELS_PATH = f"{MOUNT}/models"
# A model's backends beyond its first, as OpenAI model names: NAME-int8, NAME-tf, NAME-onnx.
SUFFIXES: dict[Backend, str] = {"onnx": "-onnx", "onnx-int8": "-int8", "tf": "-tf"}


def model_names(entries: list[Entry]) -> dict[str, tuple[str, Backend]]:
    """The names clients send, each the catalogue model and backend it is served by: an embed
    model's name for its first backend, and the name with a suffix for each other."""
    names: dict[str, tuple[str, Backend]] = {}
    for entry in entries:
        if entry.task != "embed":
            continue
        first, *others = entry.backends
        names[entry.name] = (entry.name, first)
        names.update({entry.name + SUFFIXES[b]: (entry.name, b) for b in others})
    return names


MODELS = model_names(list(catalogue.current().models))
OWNER = "bento-bundle"
# OpenAI's model objects carry a creation time; these models have none that means anything to a
# client, and every worker must answer the same: the Unix epoch.
CREATED = 0
_VISIBLE = re.compile(VISIBLE)  # a text must have a character that is not white space


def _input(value: Any) -> list[str]:
    """``input`` as texts, or the reason it is refused in the user's words (not pydantic's)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise PydanticCustomError("input", "input must be a string or a list of strings")
    if not items:
        raise PydanticCustomError("input", "input must not be an empty list")
    limit = SETTINGS.openai_max_inputs
    if len(items) > limit:
        raise PydanticCustomError(
            "input", f"input has {len(items)} texts; at most {limit} per request"
        )
    for i, text in enumerate(items):
        where = "input" if isinstance(value, str) else f"input[{i}]"
        if isinstance(text, int | list) and not isinstance(text, bool):
            raise PydanticCustomError(
                "input",
                "input: token arrays are not accepted (OpenAI's token ids are not this model's); "
                "send the text itself",
            )
        if not isinstance(text, str):
            raise PydanticCustomError("input", f"{where} must be a string")
        if not _VISIBLE.search(text):
            raise PydanticCustomError("input", f"{where} is empty or blank: send some text")
        if len(text) > SETTINGS.max_chars:
            raise PydanticCustomError(
                "input", f"{where} has {len(text)} characters; at most {SETTINGS.max_chars}"
            )
    return items


class EmbeddingsRequest(BaseModel):
    # OpenAI refuses arguments it does not know, and so do we (a typo is not silently ignored);
    # null is the default for the optional ones, as OpenAI takes it (wrappers forward None).
    model_config = ConfigDict(extra="forbid", strict=True)

    input: Annotated[list[str], BeforeValidator(_input)] = Field(
        description="A text, or a list of texts, to embed. Token arrays are not accepted."
    )
    model: str = Field(description="One of GET /v1/models: " + ", ".join(MODELS) + ".")
    encoding_format: Encoding | None = Field(
        None,
        description="float (the default) or base64: each vector's little-endian float32 bytes.",
    )
    dimensions: int | None = Field(
        None,
        description="A shorter vector, where the model offers it (Matryoshka): its first "
        "dimensions, normalised again.",
    )
    user: str | None = Field(None, description="Accepted and ignored.")


class Embedding(Protocol):
    """What the route needs from the service: the same path as ``/embed``."""

    async def embed_texts(
        self, texts: list[str], model: str, backend: Backend, dimensions: int | None = None
    ) -> tuple[np.ndarray, list[int], dict[str, str]]:
        """Vectors (rows in order), tokens per text, timing headers; ApiError for dimensions the
        model does not offer."""
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
    elif error["type"] == "input":  # already in the user's words
        message = error["msg"]
    else:
        message = f"{'.'.join(loc) or 'body'}: {error['msg']}"
    return OpenAIError(400, message, param=loc[0] if loc else None)


def parse(body: bytes) -> EmbeddingsRequest:
    """The request, or the OpenAIError that refuses it."""
    try:
        request = EmbeddingsRequest.model_validate_json(body)
    except ValidationError as exc:
        raise _refusal(exc) from None
    if request.model not in MODELS:
        raise unknown_model(request.model)
    return request


def model_card(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": CREATED, "owned_by": OWNER}


def openapi_paths() -> dict[str, Any]:
    """These routes as OpenAPI path items, for the public document (openapi.py adds them: BentoML
    documents its own APIs only). Model names and ``dimensions`` are enumerated, so schema-driven
    clients (and the fuzzing tests) know what is valid."""
    text = {"type": "string", "minLength": 1, "maxLength": SETTINGS.max_chars, "pattern": VISIBLE}
    texts = {"type": "array", "items": text, "minItems": 1, "maxItems": SETTINGS.openai_max_inputs}
    fields = EmbeddingsRequest.model_fields
    request = _object(
        input={"oneOf": [text, texts], "description": fields["input"].description},
        model={"type": "string", "enum": list(MODELS), "description": fields["model"].description},
    )
    request["additionalProperties"] = False
    request["properties"].update(
        encoding_format={"type": "string", "enum": ["float", "base64", None], "nullable": True},
        dimensions={
            "type": "integer",
            "minimum": 1,
            "nullable": True,
            "description": fields["dimensions"].description,
        },
        user={"type": "string", "nullable": True, "description": fields["user"].description},
    )
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
                + ", ".join(f"{m} ({name}, {b})" for m, (name, b) in MODELS.items())
                + ". 429/503 carry Retry-After.",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": request}},
                },
                "responses": answers(reply, 400, 404, 429, 503),
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


def openai_app(service: Callable[[], Embedding], more: Sequence[Route] = ()) -> Starlette:
    """``service`` returns the running service instance (read per request: the app is built
    first); ``more``: other APIs' routes under /v1 (Cohere's rerank), answered in their shape."""

    async def embeddings(request: Request) -> Response:
        try:
            content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if content_type != "application/json":
                raise OpenAIError(
                    400, f"send a JSON body (content-type: application/json, got {content_type!r})"
                )
            body = parse(await request.body())
            name, backend = MODELS[body.model]
            try:
                vectors, tokens, headers = await service().embed_texts(
                    body.input, name, backend, body.dimensions
                )
            except ApiError as exc:
                if exc.status == 400 and exc.message.startswith("dimensions:"):
                    raise OpenAIError(400, exc.message, param="dimensions") from None
                raise
        except OpenAIError as exc:
            return exc.response()
        except Overloaded as exc:
            return _overloaded(exc).response()
        except TooManyTokens as exc:  # OpenAI's answer to a request over its limit: a 400
            return OpenAIError(400, exc.message, param="input").response()
        except ApiError as exc:  # a runner's refusal passed on (e.g. 507): its status, our shape
            return OpenAIError(exc.status, exc.message, kind=_kind(exc.status)).response()
        used = sum(tokens)
        data = [
            {"object": "embedding", "index": i, "embedding": e}
            for i, e in enumerate(encode(vectors, body.encoding_format or "float"))
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

    async def invalid_url(request: Request) -> Response:
        return OpenAIError(404, f"Invalid URL ({request.method} {request.url.path})").response()

    async def http_error(_: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        detail = str(getattr(exc, "detail", ""))
        headers = getattr(exc, "headers", None)  # a 405's Allow
        return OpenAIError(status, detail, kind=_kind(status), headers=headers).response()

    async def server_error(_: Request, exc: Exception) -> Response:
        # Starlette re-raises after this answer is sent, so the server logs the error once.
        return OpenAIError(500, "internal error", kind="server_error").response()

    return Starlette(
        # Unknown paths and methods under /v1, and anything unexpected: OpenAI's shape too.
        exception_handlers={HTTPException: http_error, Exception: server_error},
        routes=[
            Route(EMBEDDINGS_PATH.removeprefix(MOUNT), embeddings, methods=["POST"]),
            Route(MODELS_PATH.removeprefix(MOUNT), models, methods=["GET"]),
            Route(MODELS_PATH.removeprefix(MOUNT) + "/{name:path}", model, methods=["GET"]),
            *more,
            # Any other path under /v1, as OpenAI answers it (BentoML's own 404 is plain text).
            Route("/{path:path}", invalid_url, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
        ],
    )


def _kind(status: int) -> str:
    return "invalid_request_error" if status < 500 else "server_error"


def _overloaded(exc: Overloaded) -> OpenAIError:
    """Shedding, as OpenAI reports it: 429 rate limit or 503 unavailable, with Retry-After."""
    if exc.status == 429:
        kind, code = "requests", "rate_limit_exceeded"
    else:
        kind, code = "server_error", "service_unavailable"
    return OpenAIError(exc.status, exc.reason, kind=kind, code=code, headers=exc.headers())
