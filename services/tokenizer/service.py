"""The tokenizer service: the public entry (port 3000).

Validates input, tokenizes (pre), sends token ids to a runner and awaits it while serving other
requests (core), and turns embeddings into the answer (post): vectors, cosine scores, labels.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, cast

import bentoml
import numpy as np
from starlette.responses import Response

from services.tokenizer.clients import OnnxRunnerClient, TenantRunnerClient, TFRunnerClient
from services.tokenizer.coalesce import Coalescer, EmbeddingClient
from services.tokenizer.json_only import UPLOAD_PATH, JsonOnly
from services.tokenizer.keys import TenantKeys
from services.tokenizer.openai_api import EMBEDDINGS_PATH, openai_app
from services.tokenizer.openai_api import MOUNT as OPENAI_MOUNT
from services.tokenizer.openapi import refine
from services.tokenizer.schemas import (
    MAX_INTENTS,
    ClassifyRequest,
    EmbedRequest,
    EmbedResponse,
    FormText,
    InferenceRequest,
    InferenceResponse,
    SimilarityRequest,
    SimilarityResponse,
    TenantRequest,
    TokenizeRequest,
    TokenizeResponse,
    TrainRequest,
)
from services.tokenizer.settings import SETTINGS, Backend, TokenizerSettings
from services.tokenizer.vectors import encode
from serving.batching import Admission, TokenQueue
from serving.batching.metrics import Recorder
from serving.error_bodies import ConformingErrors
from serving.errors import ApiError, TooManyTokens, replies_on_error
from serving.features import cosine
from serving.openapi_docs import OpenApiDocs
from serving.protocol import Classified, Deleted, Registered, TenantInfo, timing_headers
from serving.replies import reply
from serving.tenant_names import check_name


def _runner(url: str | None, service_path: str) -> Any:
    """A runner in the same `bentoml serve` graph, or one reached by URL (one container each).

    The runner's class is named, not imported: BentoML needs it to compose the development graph,
    but the public service shares no code with a runner (only ``serving/``). With a URL the class
    is never loaded, so the tokenizer's own bento carries neither runner code nor models.
    """
    if url:
        return bentoml.depends(url=url)
    module, name = service_path.split(":")
    return bentoml.depends(getattr(__import__(module, fromlist=[name]), name))


HEAD_PART = 32  # texts per embedding call when a head tenant's training set is embedded


def coalescers(onnx: Any, tf: Any, settings: TokenizerSettings) -> dict[Backend, Coalescer]:
    """One coalescing queue per backend, each in front of its runner client."""

    def coalescer(backend: Backend, client: EmbeddingClient) -> Coalescer:
        admission = Admission(
            settings.max_queue_tokens,
            settings.deadline_s,
            on_shed=Recorder("tokenizer", backend).shed,
        )
        return Coalescer(
            client,
            TokenQueue(admission),
            max_inflight=settings.runner_inflight,
            max_tokens=settings.runner_call_tokens,
        )

    return {
        "onnx": coalescer("onnx", OnnxRunnerClient(onnx, "fp32", settings.lean_path)),
        "onnx-int8": coalescer("onnx-int8", OnnxRunnerClient(onnx, "int8", settings.lean_path)),
        "tf": coalescer("tf", TFRunnerClient(tf, settings.lean_path)),
    }


# The public API: kept out of tracing, and so answered on the lean path (serving/hot_path.py),
# unless BUNDLE_TOKENIZER_TRACE_REQUESTS is on.
HOT_ROUTES = ["/embed", "/similarity", "/tokenize", "/inference", "/classify", EMBEDDINGS_PATH]


def current_service() -> Any:
    return bentoml.get_current_service()


@bentoml.asgi_app(openai_app(current_service), path=OPENAI_MOUNT)
@bentoml.service(
    name="tokenizer",
    service_class=SETTINGS.service_class(),
    workers=SETTINGS.workers,
    tracing=SETTINGS.tracing(HOT_ROUTES),
    traffic={"timeout": SETTINGS.timeout_s},
    logging={"access": {"enabled": SETTINGS.access_log}},
)
class Tokenizer:
    onnx_runner = _runner(SETTINGS.onnx_url, "runners.onnx.service:OnnxRunner")
    tf_runner = _runner(SETTINGS.tf_url, "runners.tf.service:TFRunner")
    tenant_runner = _runner(SETTINGS.tenant_url, "runners.tenants.service:TenantRunner")
    wordpiece = bentoml.models.BentoModel(SETTINGS.wordpiece_model)
    sentencepiece = bentoml.models.BentoModel(SETTINGS.sentencepiece_model)

    def __init__(self) -> None:
        from services.tokenizer.text import Tokenizers

        self.text = Tokenizers(
            self.wordpiece.path_of("tokenizer.json"), self.sentencepiece.path_of("spiece.model")
        )
        self.backends = coalescers(self.onnx_runner, self.tf_runner, SETTINGS)
        self.tenants = TenantRunnerClient(self.tenant_runner, SETTINGS.lean_path)
        # Each tenant's model format as last answered: a head tenant needs the texts' vectors, a
        # whole-model tenant their SentencePiece ids; an unknown one is sent both once.
        self.tenant_formats: dict[str, str] = {}
        self.keys = TenantKeys(SETTINGS.tenant_keys_file)

    def _tenant(self, name: str, ctx: bentoml.Context) -> str:
        """A valid tenant name (422 before any work for one that could never exist) and, with keys
        on, a key for it: the tenant's own or the operator's (401 without, 403 with another)."""
        self.keys.require(check_name(name), ctx.request.headers.get("authorization"))
        return name

    async def embed_texts(
        self, texts: list[str], backend: Backend
    ) -> tuple[np.ndarray, list[int], dict[str, str]]:
        """Tokenize, embed through the backend's coalescing queue: vectors (rows in order), tokens
        per text, timing headers. Every embedding route (ours and OpenAI's) comes through here."""
        started = time.perf_counter()
        ids = await self.text.run(self.text.minilm, texts)
        tokens = sum(map(len, ids))
        if tokens > SETTINGS.max_queue_tokens:
            # More than the queue ever holds: refused whenever anything waits, and alone it would
            # run past the deadline. Split it.
            raise TooManyTokens(
                f"input has {tokens} tokens; at most {SETTINGS.max_queue_tokens} per request: "
                "send fewer texts per request"
            )
        tokenized = time.perf_counter()
        embedded = await self.backends[backend].embed(ids)
        headers = {
            "X-Tokenization-Time": f"{(tokenized - started) * 1000:.2f}",
            **timing_headers(embedded.queue_ms, embedded.inference_ms),
            "X-Total-Time": f"{(time.perf_counter() - started) * 1000:.2f}",
        }
        return embedded.vectors, [len(i) for i in ids], headers

    async def _embed(
        self, texts: list[str], backend: Backend, ctx: bentoml.Context
    ) -> tuple[np.ndarray, list[int]]:
        vectors, tokens, headers = await self.embed_texts(texts, backend)
        ctx.response.headers.update(headers)
        return vectors, tokens

    # Each API answers with a reply written once (serving/replies.py): a Starlette Response, whose
    # shape ``output_spec`` documents.
    @bentoml.api(output_spec=EmbedResponse)
    @replies_on_error
    async def embed(self, request: EmbedRequest, /, ctx: bentoml.Context) -> Response:
        """Sentence embeddings (384 floats, L2-normalised) for each text, in order; with
        "encoding": "base64", each as its little-endian float32 bytes in base64 (under half the bytes)."""
        vectors, tokens = await self._embed(request.texts, request.backend, ctx)
        embeddings = encode(vectors, request.encoding)
        return reply({"embeddings": embeddings, "backend": request.backend, "tokens": tokens})

    @bentoml.api(output_spec=SimilarityResponse)
    @replies_on_error
    async def similarity(self, request: SimilarityRequest, /, ctx: bentoml.Context) -> Response:
        """Cosine similarity of each pair (STS-style); with a threshold, 0/1 labels too."""
        texts = list(dict.fromkeys(t for pair in request.pairs for t in pair))
        vectors, _ = await self._embed(texts, request.backend, ctx)
        index = {t: i for i, t in enumerate(texts)}
        scores = cosine(
            vectors[[index[p[0]] for p in request.pairs]],
            vectors[[index[p[1]] for p in request.pairs]],
        )
        if request.threshold is None:  # labels absent, not null (see SimilarityResponse)
            return reply({"scores": scores})
        return reply({"scores": scores, "labels": (scores >= request.threshold).astype(np.int8)})

    @bentoml.api(output_spec=TokenizeResponse)
    async def tokenize(self, request: TokenizeRequest, /) -> Response:
        """Token ids per text: MiniLM's WordPiece (default) or the SentencePiece model."""
        encoder = self.text.minilm if request.tokenizer == "minilm" else self.text.sentencepiece
        return reply({"ids": await self.text.run(encoder, request.texts)})

    @bentoml.api(output_spec=InferenceResponse)
    @replies_on_error
    async def inference(self, request: InferenceRequest, /, ctx: bentoml.Context) -> Response:
        """One text in, its sentence embedding out: {"input_text": str} -> {"outputs": [float]}."""
        vectors, _ = await self._embed([request.input_text], SETTINGS.default_backend, ctx)
        return reply({"outputs": vectors[0]})

    async def _head_vectors(self, texts: list[str]) -> np.ndarray:
        # Head tenants take MiniLM fp32 vectors: the ONNX runner's, in the same batches as every
        # other embedding request. A training set (up to 10,000 texts) goes in request-sized parts.
        # A few parts in flight at a time, so that a large set does not fill the queue itself.
        parts = [texts[i : i + HEAD_PART] for i in range(0, len(texts), HEAD_PART)]
        vectors: list[np.ndarray] = []
        for wave in range(0, len(parts), 4):
            embedded = await asyncio.gather(
                *(self.embed_texts(part, "onnx") for part in parts[wave : wave + 4])
            )
            vectors += [rows for rows, _, _ in embedded]
        return np.concatenate(vectors)

    async def _classify(self, tenant: str, texts: list[str], fmt: str | None) -> Classified:
        """What the tenant's model takes, from its format as last seen (both when unknown)."""
        ids = vectors = None
        if fmt != "head":
            ids = await self.text.run(self.text.tenant_pieces, texts)
        if fmt in (None, "head"):
            vectors = await self._head_vectors(texts)
        return await self.tenants.classify(tenant, ids, vectors)

    @bentoml.api(output_spec=Classified)
    @replies_on_error
    async def classify(self, request: ClassifyRequest, /, ctx: bentoml.Context) -> Response:
        """Intent of each text with the tenant's own classifier; 404 for an unknown tenant (the
        example's tenant, acme, exists once /tenants/train's example has trained it)."""
        self._tenant(request.tenant, ctx)
        started = time.perf_counter()
        try:
            result = await self._classify(
                request.tenant, request.texts, self.tenant_formats.get(request.tenant)
            )
        except ApiError as exc:
            if exc.status != 409:
                raise
            # The tenant's format changed since it was last seen here (a new version of the
            # other kind): send both this once.
            result = await self._classify(request.tenant, request.texts, None)
        if len(self.tenant_formats) > 100_000:
            self.tenant_formats.clear()
        self.tenant_formats[request.tenant] = result.format
        ctx.response.headers["X-Tenant-Cache"] = result.cache
        ctx.response.headers["X-Total-Time"] = f"{(time.perf_counter() - started) * 1000:.2f}"
        return reply(result.model_dump())

    if SETTINGS.admin_enabled:
        # The tenant registry. With admin_enabled off these methods are never defined: the routes
        # do not exist on the public port (404) and are absent from its OpenAPI schema.

        @bentoml.api(route="/tenants/train")
        @replies_on_error
        async def train_tenant(self, request: TrainRequest, /, ctx: bentoml.Context) -> Registered:
            """Train a tenant's classifier from examples and register it as a new version."""
            self._tenant(request.tenant, ctx)
            texts = [e.text for e in request.examples]
            intents = [e.intent for e in request.examples]
            # Valid by the schema but not trainable: 422 (as a refused model is), before any work.
            distinct = len(set(intents))
            if distinct < 2:
                raise ApiError("examples: training needs at least two intents; found 1", 422)
            if distinct > MAX_INTENTS:
                raise ApiError(f"examples: {distinct} intents; at most {MAX_INTENTS}", 422)
            if request.format == "head":
                vectors = await self._head_vectors(texts)
                return await self.tenants.train(request.tenant, intents, "head", vectors=vectors)
            ids = await self.text.run(self.text.tenant_pieces, texts)
            return await self.tenants.train(request.tenant, intents, request.format, ids=ids)

        @bentoml.api(route=UPLOAD_PATH)
        @replies_on_error
        async def upload_tenant(
            self, tenant: FormText, file: Path, ctx: bentoml.Context
        ) -> Registered:
            """Upload a model archive (.tar.gz of manifest.json + head.npz, model.onnx or saved_model/)."""
            # Checked before the file is handed on: a refused upload never reaches the store.
            self._tenant(tenant, ctx)
            return await self.tenants.upload(tenant, file)

        @bentoml.api(route="/tenants/list")
        @replies_on_error
        async def list_tenants(self, ctx: bentoml.Context) -> list[str]:
            """Every registered tenant (the operator key, when keys are on)."""
            self.keys.require(None, ctx.request.headers.get("authorization"))  # operator only
            return await self.tenants.list_tenants()

        @bentoml.api(route="/tenants/show")
        @replies_on_error
        async def show_tenant(self, request: TenantRequest, /, ctx: bentoml.Context) -> TenantInfo:
            """A tenant's current version, labels, metrics and size."""
            return await self.tenants.show(self._tenant(request.tenant, ctx))

        @bentoml.api(route="/tenants/delete")
        @replies_on_error
        async def delete_tenant(self, request: TenantRequest, /, ctx: bentoml.Context) -> Deleted:
            """Remove a tenant."""
            return await self.tenants.delete(self._tenant(request.tenant, ctx))


# The class is a bentoml.Service once decorated (mypy does not apply class decorators).
SERVICE = cast("bentoml.Service[Any]", Tokenizer)
# OpenAI's routes (under /v1) answer in OpenAI's error shape: these two leave them alone.
SERVICE.add_asgi_middleware(ConformingErrors, skip_prefix=OPENAI_MOUNT + "/")
SERVICE.add_asgi_middleware(
    JsonOnly,
    multipart_paths=frozenset({UPLOAD_PATH} if SETTINGS.admin_enabled else ()),
    skip_prefix=OPENAI_MOUNT + "/",
)
SERVICE.add_asgi_middleware(OpenApiDocs, refine=refine)
