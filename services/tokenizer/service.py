"""The tokenizer service: the public entry (port 3000).

Validates input, tokenizes (pre), sends token ids to a runner and awaits it while serving other
requests (core), and turns embeddings into the answer (post): vectors, cosine scores, labels.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from pathlib import Path
from typing import Any, NamedTuple, cast

import bentoml
import numpy as np
from starlette.responses import Response

from services.tokenizer import cohere_api, scoring
from services.tokenizer.clients import OnnxRunnerClient, TenantRunnerClient, TFRunnerClient
from services.tokenizer.coalesce import Coalescer, EmbeddingClient
from services.tokenizer.json_only import UPLOAD_PATH, JsonOnly
from services.tokenizer.keys import TenantKeys
from services.tokenizer.models import Model, Models
from services.tokenizer.openai_api import EMBEDDINGS_PATH, openai_app
from services.tokenizer.openai_api import MOUNT as OPENAI_MOUNT
from services.tokenizer.openapi import refine
from services.tokenizer.replica_wait import ReplicaWait
from services.tokenizer.schemas import (
    MAX_INTENTS,
    ClassifyRequest,
    EmbedRequest,
    EmbedResponse,
    FormText,
    InferenceRequest,
    InferenceResponse,
    PredictRequest,
    PredictResponse,
    Ranked,
    RerankRequest,
    SimilarityRequest,
    SimilarityResponse,
    TenantRequest,
    TokenizeRequest,
    TokenizeResponse,
    TrainRequest,
)
from services.tokenizer.settings import SETTINGS, Backend, TokenizerSettings
from services.tokenizer.vectors import encode
from serving import catalogue
from serving.batching import Admission, TokenQueue
from serving.batching.metrics import Recorder
from serving.catalogue import ModelSpec
from serving.error_bodies import ConformingErrors
from serving.errors import ApiError, TooManyTokens, replies_on_error
from serving.features import cosine, load_tokenizer
from serving.openapi_docs import OpenApiDocs
from serving.protocol import (
    Classified,
    Deleted,
    Registered,
    TenantFormat,
    TenantInfo,
    timing_headers,
)
from serving.replies import reply
from serving.served import declare, spec_of
from serving.startup import Startup
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


class TenantReads(NamedTuple):
    """What a tenant's current version reads: a head its encoder's vectors, a whole model
    SentencePiece ids."""

    format: TenantFormat
    encoder: str | None


class EncoderNotServed(ApiError):
    """A head tenant over a model this deployment no longer serves."""


logger = logging.getLogger("bento_bundle.tokenizer")

# How long a readiness probe waits for the warm-up: within the probes' own timeouts (deploy/).
WARM_UP_TIMEOUT_S = 2.0
HEAD_PART = 32  # texts per embedding call when a head tenant's training set is embedded


def client(model: str, backend: Backend, onnx: Any, tf: Any, mode: str) -> EmbeddingClient:
    """The runner client of one model on one backend."""
    if backend == "tf":
        return TFRunnerClient(tf, model, mode)
    return OnnxRunnerClient(onnx, model, "int8" if backend == "onnx-int8" else "fp32", mode)


def coalescer(label: str, client: EmbeddingClient, settings: TokenizerSettings) -> Coalescer:
    """A coalescing queue in front of one model's runner client: each model and backend has its
    own token budget, so one model's backlog never sheds another's requests."""
    admission = Admission(
        settings.max_queue_tokens, settings.deadline_s, on_shed=Recorder("tokenizer", label).shed
    )
    return Coalescer(
        client,
        TokenQueue(admission),
        max_inflight=settings.runner_inflight,
        max_tokens=settings.runner_call_tokens,
        # Each model and backend may be its own runner service (one container per model).
        replicas=ReplicaWait(label, settings.replica_wait_s, settings.replica_waiters),
    )


# The public API: kept out of tracing, and so answered on the lean path (serving/hot_path.py),
# unless BUNDLE_TOKENIZER_TRACE_REQUESTS is on.
HOT_ROUTES = ["/embed", "/similarity", "/tokenize", "/inference", "/classify", EMBEDDINGS_PATH]


def current_service() -> Any:
    return bentoml.get_current_service()


class Tokenizer:
    onnx_runner = _runner(SETTINGS.onnx_url, "runners.onnx.service:OnnxRunner")
    tf_runner = _runner(SETTINGS.tf_url, "runners.tf.service:TFRunner")
    tenant_runner = _runner(SETTINGS.tenant_url, "runners.tenants.service:TenantRunner")
    sentencepiece = bentoml.models.BentoModel(SETTINGS.sentencepiece_model)

    def __init__(self) -> None:
        from services.tokenizer.text import Tokenizers

        self.startup = startup = Startup("tokenizer")
        with startup.part("load"):
            self.text = Tokenizers(self.sentencepiece.path_of("spiece.model"))
            self.models = Models(self._models())
        self.warm = False  # set once a request has been through every model's runners
        self.warming: asyncio.Task[None] | None = None  # the warm-up's try under way, or the last
        self.not_warm_because = ""
        self.tenants = TenantRunnerClient(
            self.tenant_runner,
            SETTINGS.lean_path,
            ReplicaWait("tenant_runner", SETTINGS.replica_wait_s, SETTINGS.replica_waiters),
        )
        # What each tenant's current version reads, as last seen: a head tenant its encoder's
        # vectors, a whole-model tenant SentencePiece ids (asked of the runner when unknown).
        self.tenant_reads: dict[str, TenantReads] = {}
        self.keys = TenantKeys(SETTINGS.tenant_keys_file)

    async def __is_ready__(self) -> bool:
        """Ready once one text of each model has been through each of its backends' runners, as a
        request goes: the first request would otherwise pay for what it is the first to take (the
        tokenizer's first call, the hop client and connection to each runner). Not ready until a
        runner answers; BentoML also checks the runners' own readiness after this.

        The warm-up runs as a task of its own, which a probe waits for only so long: a runner
        still starting holds its call until it is up, and a call cut short by a probe's timeout
        would still end, and be measured, after the warm-up stopped leaving the speed alone."""
        if not self.warm and (self.warming is None or self.warming.done()):
            self.warming = asyncio.create_task(self._warm_up())  # again, if a try failed
        if self.warming is not None and not self.warm:
            await asyncio.wait({self.warming}, timeout=WARM_UP_TIMEOUT_S)
        return self.warm

    async def _warm_up(self) -> None:
        began = time.perf_counter()
        try:
            for model in self.models.by_name.values():
                for backend, coalescer in model.queues.items():
                    with coalescer.queue.admission.unmeasured():  # speed: requests' only
                        await self.embed_with(model, backend, ["warm up"])
        except Exception as exc:  # a runner not up yet, or failing: not ready, tried again
            because = f"{type(exc).__name__}: {exc}"
            if because != self.not_warm_because:  # said once, not at every probe
                logger.warning("not ready: the warm-up request failed (%s)", because)
                self.not_warm_because = because
            return
        self.warm = True
        self.startup.parts["warm_up_s"] = time.perf_counter() - began  # the try that worked
        self.startup.done()

    def _models(self) -> dict[str, Model]:
        """Each declared model's tokenizers and, per backend, its coalescing queue."""
        served = {}
        for declared in DECLARED:
            # The catalogue says which backends serve the model (the runners load those);
            # the store's spec, what the build made of it.
            spec = spec_of(declared.ref(self)).model_copy(
                update={"backends": declared.entry.backends}
            )
            path = declared.ref(self).path_of("tokenizer.json")
            model = Model(spec, load_tokenizer(path, spec.max_length))
            if spec.task != "embed":
                model.pair_tokenizer = load_tokenizer(path, spec.max_length, pairs=True)
            for backend in spec.backends:
                label = f"{spec.name}/{backend}"
                runner = client(
                    spec.name, backend, self.onnx_runner, self.tf_runner, SETTINGS.lean_path
                )
                model.queues[backend] = coalescer(label, runner, SETTINGS)
            served[spec.name] = model
        return served

    def _tenant(self, name: str, ctx: bentoml.Context) -> str:
        """A valid tenant name (422 before any work for one that could never exist) and, with keys
        on, a key for it: the tenant's own or the operator's (401 without, 403 with another)."""
        self.keys.require(check_name(name), ctx.request.headers.get("authorization"))
        return name

    async def embed_with(
        self, model: Model, backend: Backend, texts: list[str], width: int | None = None
    ) -> tuple[np.ndarray, list[int], dict[str, str]]:
        """Tokenize with the model's tokenizer, embed through its backend's coalescing queue:
        vectors (rows in order, ``width`` wide when given), tokens per text, timing headers. Every
        embedding route (ours and OpenAI's) comes through here."""
        started = time.perf_counter()
        ids = await self.text.run(model.encode, texts)
        vectors, headers = await self._run(model, backend, ids, None, started)
        return model.shorten(vectors, width), [len(i) for i in ids], headers

    async def _run(
        self,
        model: Model,
        backend: Backend,
        ids: list[list[int]],
        segments: list[int] | None,
        started: float,
    ) -> tuple[np.ndarray, dict[str, str]]:
        """Tokenized rows through the model's coalescing queue: its output rows (vectors or a
        head's logits) and the timing headers (``started``: when tokenizing began)."""
        tokens = sum(map(len, ids))
        if tokens > SETTINGS.max_queue_tokens:
            # More than the queue ever holds: refused whenever anything waits, and alone it would
            # run past the deadline. Split it.
            raise TooManyTokens(
                f"input has {tokens} tokens; at most {SETTINGS.max_queue_tokens} per request: "
                "send fewer texts per request"
            )
        tokenized = time.perf_counter()
        embedded = await model.queues[backend].embed(ids, segments)
        headers = {
            "X-Tokenization-Time": f"{(tokenized - started) * 1000:.2f}",
            **timing_headers(embedded.queue_ms, embedded.inference_ms),
            "X-Total-Time": f"{(time.perf_counter() - started) * 1000:.2f}",
        }
        return embedded.vectors, headers

    async def relevance(
        self,
        model: Model,
        query: str,
        texts: list[str],
        raw: bool = False,
        truncate: bool = True,
        field: str = "texts",
    ) -> tuple[np.ndarray, dict[str, str]]:
        """Each text's relevance to ``query`` by a rerank model: one (query, text) pair a row, in
        the same batches as every other request. Every rerank route (ours and Cohere's) comes
        through here."""
        started = time.perf_counter()
        pairs = [(query, text) for text in texts]
        ids, segments = await self.text.run(model.encode_pairs, pairs, field, truncate, "query")
        logits, headers = await self._run(model, model.backend(None), ids, segments, started)
        return scoring.relevance(logits, raw), headers

    async def embed_texts(
        self, texts: list[str], model: str, backend: Backend, dimensions: int | None = None
    ) -> tuple[np.ndarray, list[int], dict[str, str]]:
        """OpenAI's route: a model and backend it resolved from the model's name."""
        served = self.models.get(model, "embed", "/v1/embeddings")
        return await self.embed_with(served, backend, texts, served.width(dimensions))

    async def _embed(
        self,
        texts: list[str],
        model: Model,
        backend: Backend,
        ctx: bentoml.Context,
        width: int | None = None,
    ) -> np.ndarray:
        vectors, _, headers = await self.embed_with(model, backend, texts, width)
        ctx.response.headers.update(headers)
        return vectors

    # Each API answers with a reply written once (serving/replies.py): a Starlette Response, whose
    # shape ``output_spec`` documents.
    @bentoml.api(output_spec=EmbedResponse)
    @replies_on_error
    async def embed(self, request: EmbedRequest, /, ctx: bentoml.Context) -> Response:
        """Sentence embeddings for each text, in order, by the model named (default: the
        catalogue's first embed model); with "encoding": "base64", each as its little-endian
        float32 bytes in base64 (under half the bytes)."""
        model = self.models.get(request.model, "embed", "/embed")
        backend = model.backend(request.backend)
        width = model.width(request.dimensions)
        vectors, tokens, headers = await self.embed_with(model, backend, request.texts, width)
        ctx.response.headers.update(headers)
        embeddings = encode(vectors, request.encoding)
        return reply(
            {"embeddings": embeddings, "model": model.name, "backend": backend, "tokens": tokens}
        )

    @bentoml.api(output_spec=SimilarityResponse)
    @replies_on_error
    async def similarity(self, request: SimilarityRequest, /, ctx: bentoml.Context) -> Response:
        """Cosine similarity of each pair (STS-style); with a threshold, 0/1 labels too."""
        model = self.models.get(request.model, "embed", "/similarity")
        backend = model.backend(request.backend)
        texts = list(dict.fromkeys(t for pair in request.pairs for t in pair))
        vectors = await self._embed(texts, model, backend, ctx)
        index = {t: i for i, t in enumerate(texts)}
        scores = cosine(
            vectors[[index[p[0]] for p in request.pairs]],
            vectors[[index[p[1]] for p in request.pairs]],
        )
        if request.threshold is None:  # labels absent, not null (see SimilarityResponse)
            return reply({"scores": scores})
        return reply({"scores": scores, "labels": (scores >= request.threshold).astype(np.int8)})

    @bentoml.api(output_spec=TokenizeResponse)
    @replies_on_error
    async def tokenize(self, request: TokenizeRequest, /) -> Response:
        """Token ids per text, by the tokenizer of the model named (default: the catalogue's
        first embed model), or by the SentencePiece model that tenants' whole models read."""
        if request.tokenizer == "sentencepiece":
            if request.model is not None:  # named, it must be served (a 404 otherwise)
                self.models.get(request.model, None, "/tokenize")
            return reply({"ids": await self.text.run(self.text.sentencepiece, request.texts)})
        model = self.models.get(request.model, None, "/tokenize")
        return reply({"ids": await self.text.run(model.encode, request.texts)})

    @bentoml.api
    @replies_on_error
    async def rerank(self, request: RerankRequest, /, ctx: bentoml.Context) -> list[Ranked]:
        """The texts ranked by their relevance to the query, the most relevant first, by a
        cross-encoder that reads each (query, text) pair together (default: the catalogue's first
        rerank model)."""
        model = self.models.get(request.model, "rerank", "/rerank")
        scores, headers = await self.relevance(
            model, request.query, request.texts, request.raw_scores, request.truncate
        )
        ctx.response.headers.update(headers)
        return [
            Ranked(
                index=i,
                score=float(scores[i]),
                text=request.texts[i] if request.return_text else None,
            )
            for i in scoring.ranking(scores, request.top_n)
        ]

    @bentoml.api(output_spec=PredictResponse)
    @replies_on_error
    async def predict(self, request: PredictRequest, /, ctx: bentoml.Context) -> Response:
        """Each input's labels with their scores, the best first, by a sequence classifier
        (default: the catalogue's first classify model); an input is a text or a [text, text]
        pair."""
        model = self.models.get(request.model, "classify", "/predict")
        started = time.perf_counter()
        inputs: list[Any] = request.inputs
        if isinstance(inputs[0], tuple):
            ids, segments = await self.text.run(model.encode_pairs, inputs, "inputs")
        else:
            ids, segments = await self.text.run(model.encode, inputs), None
        logits, headers = await self._run(model, model.backend(None), ids, segments, started)
        ctx.response.headers.update(headers)
        labels = model.spec.labels or ()
        predictions = scoring.label_scores(logits, labels, request.raw_scores)
        return reply({"predictions": predictions, "model": model.name})

    @bentoml.api(output_spec=InferenceResponse)
    @replies_on_error
    async def inference(self, request: InferenceRequest, /, ctx: bentoml.Context) -> Response:
        """One text in, its sentence embedding out (the catalogue's first embed model):
        {"input_text": str} -> {"outputs": [float]}."""
        model = self.models.get(None, "embed", "/inference")
        vectors = await self._embed([request.input_text], model, model.backend(None), ctx)
        return reply({"outputs": vectors[0]})

    def _encoder(self, name: str | None, tenant: str) -> Model:
        """The embed model a head tenant reads; a 409 naming it when it is no longer served: a head
        is never scored with another model's vectors."""
        try:
            return self.models.get(name, "embed", "encoder")
        except ApiError as exc:
            if name is None or exc.status != 404:
                raise
            raise EncoderNotServed(
                f"tenant {tenant!r} is a head over {name}, which is not served here: train it "
                f"again with a served encoder ({', '.join(self.models.names('embed'))})",
                409,
            ) from None

    async def _head_vectors(self, texts: list[str], encoder: Model) -> np.ndarray:
        # A head reads its encoder's vectors on the encoder's first backend, in the same batches as
        # every other embedding request. A training set (up to 10,000 texts) goes in request-sized
        # parts, a few in flight at a time, so that a large set does not fill the queue itself.
        backend = encoder.backend(None)
        parts = [texts[i : i + HEAD_PART] for i in range(0, len(texts), HEAD_PART)]
        vectors: list[np.ndarray] = []
        for wave in range(0, len(parts), 4):
            embedded = await asyncio.gather(
                *(self.embed_with(encoder, backend, part) for part in parts[wave : wave + 4])
            )
            vectors += [rows for rows, _, _ in embedded]
        return np.concatenate(vectors)

    async def _reads(self, tenant: str) -> TenantReads:
        """What the tenant's current version reads, asked of the tenant runner (404: no tenant)."""
        info = await self.tenants.show(tenant)
        if len(self.tenant_reads) > 100_000:
            self.tenant_reads.clear()
        self.tenant_reads[tenant] = reads = TenantReads(info.format, info.encoder)
        return reads

    async def _classify_as(self, tenant: str, texts: list[str], reads: TenantReads) -> Classified:
        if reads.format != "head":
            ids = await self.text.run(self.text.tenant_pieces, texts)
            return await self.tenants.classify(tenant, ids, None)
        encoder = self._encoder(reads.encoder, tenant)
        vectors = await self._head_vectors(texts, encoder)
        return await self.tenants.classify(tenant, None, vectors, encoder.name)

    @bentoml.api(output_spec=Classified)
    @replies_on_error
    async def classify(self, request: ClassifyRequest, /, ctx: bentoml.Context) -> Response:
        """Intent of each text with the tenant's own classifier; 404 for an unknown tenant (the
        example's tenant, acme, exists once /tenants/train's example has trained it)."""
        self._tenant(request.tenant, ctx)
        started = time.perf_counter()
        cached = self.tenant_reads.get(request.tenant)
        reads = cached or await self._reads(request.tenant)
        try:
            result = await self._classify_as(request.tenant, request.texts, reads)
        except ApiError as exc:
            if exc.status != 409 or (isinstance(exc, EncoderNotServed) and cached is None):
                raise
            # The runner's version reads something else since it was last seen here (a new
            # version of another kind, or over another encoder, perhaps one served here where the
            # last was not): ask again, once.
            reads = await self._reads(request.tenant)
            result = await self._classify_as(request.tenant, request.texts, reads)
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
                encoder = self.models.get(request.encoder, "embed", "encoder")
                vectors = await self._head_vectors(texts, encoder)
                return await self.tenants.train(
                    request.tenant, intents, "head", vectors=vectors, encoder=encoder.name
                )
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


# Every catalogue model's tokenizer, declared before the class becomes a service: a bento carries
# the models its service declares.
DECLARED = declare(Tokenizer, catalogue.current().models, ["tokenizer"])
# Under /v1 OpenAI's embeddings and Cohere's v1 rerank; under /v2 Cohere's v2 rerank.
V1_APP = openai_app(current_service, more=cohere_api.routes(current_service, "1"))
SERVICE = cast(
    "bentoml.Service[Any]",
    bentoml.asgi_app(cohere_api.cohere_app(current_service), path=cohere_api.MOUNT_V2)(
        bentoml.asgi_app(V1_APP, path=OPENAI_MOUNT)(
            bentoml.service(
                name="tokenizer",
                service_class=SETTINGS.service_class(),
                workers=SETTINGS.workers,
                tracing=SETTINGS.tracing(HOT_ROUTES),
                traffic={"timeout": SETTINGS.timeout_s},
                logging={"access": {"enabled": SETTINGS.access_log}},
            )(Tokenizer)
        )
    ),
)
Tokenizer = SERVICE  # type: ignore[misc]  # what bentofile.yaml and the graph name
# OpenAI's and Cohere's routes (under /v1 and /v2) answer in their own error shapes: these two
# leave them alone.
FOREIGN = (OPENAI_MOUNT + "/", cohere_api.MOUNT_V2 + "/")
SERVICE.add_asgi_middleware(ConformingErrors, skip_prefix=FOREIGN)
SERVICE.add_asgi_middleware(
    JsonOnly,
    multipart_paths=frozenset({UPLOAD_PATH} if SETTINGS.admin_enabled else ()),
    skip_prefix=FOREIGN,
)


@functools.cache
def served_specs() -> list[ModelSpec]:
    """The spec of every model served, as its store entry recorded it (for the OpenAPI document)."""
    return [spec_of(declared.ref(SERVICE.inner)) for declared in DECLARED]


SERVICE.add_asgi_middleware(OpenApiDocs, refine=lambda spec: refine(spec, served_specs()))
