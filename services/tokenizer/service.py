"""The tokenizer service: the public entry (port 3000).

Validates input, tokenizes (pre), sends token ids to a runner and awaits it while serving other
requests (core), and turns embeddings into the answer (post): vectors, cosine scores, labels.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import bentoml
import numpy as np

from runners.errors import replies_on_error
from runners.protocol import Classified, Registered, timing_headers
from runners.tenants.store import check_name
from services.tokenizer.error_bodies import ConformingErrors
from services.tokenizer.json_only import JsonOnly
from services.tokenizer.keys import TenantKeys
from services.tokenizer.runner_client import Embedded, Runners
from services.tokenizer.schemas import (
    SETTINGS,
    ClassifyRequest,
    EmbedRequest,
    EmbedResponse,
    InferenceRequest,
    InferenceResponse,
    SimilarityRequest,
    SimilarityResponse,
    TenantRequest,
    TokenizeRequest,
    TokenizeResponse,
    TrainRequest,
)
from services.tokenizer.settings import Backend


def _runner(url: str | None, service_path: str) -> Any:
    """A runner in the same `bentoml serve` graph, or one reached by URL (one container each).

    With a URL the runner's class is not even imported, so a tokenizer-only bento carries
    neither the runner's code path nor its models.
    """
    if url:
        return bentoml.depends(url=url)
    module, name = service_path.split(":")
    return bentoml.depends(getattr(__import__(module, fromlist=[name]), name))


@bentoml.service(
    name="tokenizer",
    workers=SETTINGS.workers,
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
        self.runners = Runners(self.onnx_runner, self.tf_runner, self.tenant_runner, SETTINGS)
        self.keys = TenantKeys(SETTINGS.tenant_keys_file)

    def _tenant(self, name: str, ctx: bentoml.Context) -> str:
        """A valid tenant name (422 before any work for one that could never exist) and, with keys
        on, a key for it: the tenant's own or the operator's (401 without, 403 with another)."""
        self.keys.require(check_name(name), ctx.request.headers.get("authorization"))
        return name

    async def _embed(
        self, texts: list[str], backend: Backend, ctx: bentoml.Context
    ) -> tuple[Embedded, list[list[int]]]:
        started = time.perf_counter()
        ids = await self.text.run(self.text.minilm, texts)
        tokenized = time.perf_counter()
        embedded = await self.runners.embed(backend, ids)
        ctx.response.headers.update(
            {
                "X-Tokenization-Time": f"{(tokenized - started) * 1000:.2f}",
                **timing_headers(embedded.queue_ms, embedded.inference_ms),
                "X-Total-Time": f"{(time.perf_counter() - started) * 1000:.2f}",
            }
        )
        return embedded, ids

    @bentoml.api
    @replies_on_error
    async def embed(self, request: EmbedRequest, /, ctx: bentoml.Context) -> EmbedResponse:
        """Sentence embeddings (384 floats, L2-normalised) for each text, in order."""
        embedded, ids = await self._embed(request.texts, request.backend, ctx)
        return EmbedResponse(
            embeddings=embedded.vectors.tolist(),
            backend=request.backend,
            tokens=[len(i) for i in ids],
        )

    @bentoml.api
    @replies_on_error
    async def similarity(
        self, request: SimilarityRequest, /, ctx: bentoml.Context
    ) -> SimilarityResponse:
        """Cosine similarity of each pair (STS-style); with a threshold, 0/1 labels too."""
        texts = list(dict.fromkeys(t for pair in request.pairs for t in pair))
        embedded, _ = await self._embed(texts, request.backend, ctx)
        index = {t: i for i, t in enumerate(texts)}
        a = embedded.vectors[[index[p[0]] for p in request.pairs]]
        b = embedded.vectors[[index[p[1]] for p in request.pairs]]
        scores = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        scores = np.clip(scores, -1.0, 1.0)  # float rounding gives 1.0000001 for identical texts
        labels = (
            None if request.threshold is None else [int(s >= request.threshold) for s in scores]
        )
        return SimilarityResponse(scores=scores.tolist(), labels=labels)

    @bentoml.api
    async def tokenize(self, request: TokenizeRequest, /) -> TokenizeResponse:
        """Token ids per text: MiniLM's WordPiece (default) or the SentencePiece model."""
        encode = self.text.minilm if request.tokenizer == "minilm" else self.text.sentencepiece
        return TokenizeResponse(ids=await self.text.run(encode, request.texts))

    @bentoml.api
    @replies_on_error
    async def inference(
        self, request: InferenceRequest, /, ctx: bentoml.Context
    ) -> InferenceResponse:
        """Seed 003's contract: {"input_text": str} -> {"outputs": [float]} (the sentence embedding)."""
        embedded, _ = await self._embed([request.input_text], SETTINGS.default_backend, ctx)
        return InferenceResponse(outputs=embedded.vectors[0].tolist())

    @bentoml.api
    @replies_on_error
    async def classify(self, request: ClassifyRequest, /, ctx: bentoml.Context) -> Classified:
        """Intent of each text with the tenant's own model (seed 000); 404 for an unknown tenant."""
        self._tenant(request.tenant, ctx)
        started = time.perf_counter()
        ids = await self.text.run(self.text.sentencepiece, request.texts)
        result = await self.runners.tenant("classify", tenant=request.tenant, ids=ids)
        ctx.response.headers["X-Total-Time"] = f"{(time.perf_counter() - started) * 1000:.2f}"
        return Classified(**result)

    if SETTINGS.admin_enabled:
        # The tenant registry. With admin_enabled off these methods are never defined: the routes
        # do not exist on the public port (404) and are absent from its OpenAPI schema.

        @bentoml.api(route="/tenants/train")
        @replies_on_error
        async def train_tenant(self, request: TrainRequest, /, ctx: bentoml.Context) -> Registered:
            """Train a tenant's classifier from examples and register it as a new version."""
            self._tenant(request.tenant, ctx)
            texts = [e.text for e in request.examples]
            ids = await self.text.run(self.text.sentencepiece, texts)
            intents = [e.intent for e in request.examples]
            result = await self.runners.tenant(
                "train", tenant=request.tenant, ids=ids, intents=intents, format=request.format
            )
            return Registered(**result)

        @bentoml.api(route="/tenants/upload")
        @replies_on_error
        async def upload_tenant(self, tenant: str, file: Path, ctx: bentoml.Context) -> Registered:
            """Upload a model archive (.tar.gz of manifest.json + model.onnx or saved_model/)."""
            # Checked before the file is handed on: a refused upload never reaches the store.
            self._tenant(tenant, ctx)
            return Registered(**await self.runners.tenant("upload", tenant=tenant, file=file))

        @bentoml.api(route="/tenants/list")
        @replies_on_error
        async def list_tenants(self, ctx: bentoml.Context) -> list[str]:
            """Every registered tenant (the operator key, when keys are on)."""
            self.keys.require(None, ctx.request.headers.get("authorization"))  # operator only
            return await self.runners.tenant("list_tenants")

        @bentoml.api(route="/tenants/show")
        @replies_on_error
        async def show_tenant(
            self, request: TenantRequest, /, ctx: bentoml.Context
        ) -> dict[str, Any]:
            """A tenant's current version, labels, metrics and size."""
            return await self.runners.tenant("show", tenant=self._tenant(request.tenant, ctx))

        @bentoml.api(route="/tenants/delete")
        @replies_on_error
        async def delete_tenant(
            self, request: TenantRequest, /, ctx: bentoml.Context
        ) -> dict[str, Any]:
            """Remove a tenant."""
            return await self.runners.tenant("delete", tenant=self._tenant(request.tenant, ctx))


Tokenizer.add_asgi_middleware(ConformingErrors)
Tokenizer.add_asgi_middleware(JsonOnly)
