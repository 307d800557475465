"""Cohere's rerank API on the public service: ``POST /v2/rerank`` (what ``cohere.ClientV2`` calls)
and ``POST /v1/rerank`` (``cohere.Client``), in Cohere's request, answer and error shapes, so
LangChain's, LlamaIndex's and other Cohere rerankers work against a rerank model served here.

Requests go through the same path as ``/rerank`` (its batches, its shedding). Errors are Cohere's
``{"message": ...}`` with Cohere's status codes (the SDK raises one exception class per code);
429/503 carry Retry-After. Fields of Cohere's that have no meaning here are accepted and ignored,
as the SDK sends some of them on every call (``priority``) and clients built for Cohere others.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal, Protocol

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.tokenizer.models import Model
from services.tokenizer.scoring import ranking
from services.tokenizer.settings import SETTINGS
from serving.errors import ApiError, Overloaded, TooManyTokens
from serving.replies import reply as _json

logger = logging.getLogger(__name__)
MOUNT_V2 = "/v2"
RERANK_V1 = "/v1/rerank"
RERANK_V2 = f"{MOUNT_V2}/rerank"


def _document(value: Any) -> str:
    # v1 takes a document as a string or as an object whose "text" is the string.
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        value = value["text"]
    if not isinstance(value, str):
        raise PydanticCustomError("document", 'a document must be a string (or {"text": str})')
    if not value.strip():
        raise PydanticCustomError("document", "a document is empty or blank")
    if len(value) > SETTINGS.max_chars:
        raise PydanticCustomError(
            "document", f"a document has {len(value)} characters; at most {SETTINGS.max_chars}"
        )
    return value


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(None, description="A rerank model (default: the catalogue's first).")
    query: str = Field(min_length=1, max_length=SETTINGS.max_chars)
    documents: list[Annotated[str, BeforeValidator(_document)]] = Field(
        min_length=1, max_length=SETTINGS.max_documents
    )
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False


class Reranking(Protocol):
    """What the routes need from the service: the path ``/rerank`` takes."""

    models: Any

    async def relevance(
        self,
        model: Model,
        query: str,
        texts: list[str],
        raw: bool = False,
        truncate: bool = True,
        field: str = "texts",
    ) -> tuple[np.ndarray, dict[str, str]]: ...


class CohereError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}

    def response(self) -> Response:
        return _json({"message": self.message}, self.status, self.headers)


def parse(body: bytes) -> RerankRequest:
    try:
        request = RerankRequest.model_validate_json(body)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in error["loc"]) or "body"
        raise CohereError(400, f"invalid request: {where}: {error['msg']}") from None
    if not request.query.strip():
        raise CohereError(400, "invalid request: query is empty or blank")
    return request


async def rerank(service: Reranking, body: bytes, version: Literal["1", "2"]) -> Response:
    try:
        request = parse(body)
        try:
            model = service.models.get(request.model, "rerank", "rerank")
        except ApiError as exc:
            raise CohereError(exc.status, exc.message) from None
        scores, headers = await service.relevance(
            model, request.query, request.documents, field="documents"
        )
    except CohereError as exc:
        return exc.response()
    except Overloaded as exc:
        return CohereError(exc.status, exc.reason, exc.headers()).response()
    except TooManyTokens as exc:
        return CohereError(400, f"invalid request: {exc.message}").response()
    except ApiError as exc:
        return CohereError(exc.status, exc.message).response()
    results = []
    for i in ranking(scores, request.top_n):
        result: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if request.return_documents:
            result["document"] = {"text": request.documents[i]}
        results.append(result)
    meta = {"api_version": {"version": version}, "billed_units": {"search_units": 1}}
    return _json({"id": str(uuid.uuid4()), "results": results, "meta": meta}, headers=headers)


def openapi_paths() -> dict[str, Any]:
    """These routes as OpenAPI path items, for the public document (openapi.py adds them)."""
    request = RerankRequest.model_json_schema()
    text = {"type": "string", "minLength": 1, "maxLength": SETTINGS.max_chars}
    request["properties"]["documents"] = {
        "type": "array",
        "minItems": 1,
        "maxItems": SETTINGS.max_documents,
        "items": {
            "oneOf": [text, {"type": "object", "required": ["text"], "properties": {"text": text}}]
        },
    }
    result = {
        "type": "object",
        "required": ["index", "relevance_score"],
        "properties": {
            "index": {"type": "integer"},
            "relevance_score": {"type": "number"},
            "document": {"type": "object", "properties": {"text": {"type": "string"}}},
        },
    }
    answer = {
        "type": "object",
        "required": ["id", "results", "meta"],
        "properties": {
            "id": {"type": "string"},
            "results": {"type": "array", "items": result},
            "meta": {"type": "object"},
        },
    }
    error = {
        "type": "object",
        "required": ["message"],
        "properties": {"message": {"type": "string"}},
    }

    def item(version: str) -> dict[str, Any]:
        shape = {"application/json": {"schema": error}}
        return {
            "post": {
                "summary": f"Cohere's rerank API v{version} (the cohere SDK works unchanged)",
                "description": "The documents ranked by relevance to the query, by a rerank "
                "model; the same batches and shedding as /rerank. Errors are Cohere's shape.",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": request}},
                },
                "responses": {
                    "200": {
                        "description": "OK",
                        "content": {"application/json": {"schema": answer}},
                    },
                    **{
                        str(code): {"description": "Cohere's error shape", "content": shape}
                        for code in (400, 404, 429, 503)
                    },
                },
            }
        }

    return {RERANK_V1: item("1"), RERANK_V2: item("2")}


def routes(service: Callable[[], Reranking], version: Literal["1", "2"]) -> list[Route]:
    """The rerank route of Cohere's API ``version``, for the app mounted at /v1 or /v2."""

    async def endpoint(request: Request) -> Response:
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            message = f"invalid request: send a JSON body (content-type: {content_type!r})"
            return CohereError(400, message).response()
        try:
            return await rerank(service(), await request.body(), version)
        except Exception:
            # Logged here, answered in Cohere's shape (under /v1 the app around this route would
            # answer in OpenAI's).
            logger.exception("rerank failed")
            return CohereError(500, "internal error").response()

    return [Route("/rerank", endpoint, methods=["POST"])]


def cohere_app(service: Callable[[], Reranking]) -> Starlette:
    """Cohere's v2 API: its rerank route, and Cohere's 404 shape for any other path under /v2."""

    async def not_found(request: Request) -> Response:
        return CohereError(404, f"no such route: {request.method} {request.url.path}").response()

    async def http_error(_: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        return CohereError(status, str(getattr(exc, "detail", ""))).response()

    return Starlette(
        exception_handlers={HTTPException: http_error},
        routes=[
            *routes(service, "2"),
            Route("/{path:path}", not_found, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
        ],
    )
