"""The multi-tenant runner: per-tenant intent classifiers.

Head tenants (a softmax layer over the vectors of a served encoder, which the caller computes through
the engine runners' batches) are all resident: classify is one small matrix product. Whole-model tenants
(ONNX, TF) are loaded on demand under a memory budget; each loaded model gets its own batcher
(requests of one tenant are batched together) and all share one engine thread. Registry operations
(train, upload, list, show, delete) live here too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, cast

import bentoml
import numpy as np

from runners.tenants import heads, registry
from runners.tenants.cache import ModelCache
from runners.tenants.loader import LoadedModel, load, release_freed_memory
from runners.tenants.metrics import LOAD_SECONDS, Exporter
from runners.tenants.settings import TenantRunnerSettings
from runners.tenants.store import InvalidModel, TenantStore, read_manifest
from serving.batching import Batcher, Lanes
from serving.batching.metrics import Recorder
from serving.error_bodies import ConformingErrors
from serving.errors import ApiError, WrongInputFormat, replies_on_error
from serving.protocol import (
    Classified,
    Deleted,
    ModelName,
    Registered,
    SpmIds,
    TenantFormat,
    TenantInfo,
    Vectors,
    timing_headers,
)
from serving.startup import Startup
from serving.tenant_names import check_name

SETTINGS = TenantRunnerSettings()
logger = logging.getLogger("bento_bundle.tenants")


def warm_up_runtimes(served: Collection[str]) -> None:
    """Load a throwaway classifier of each ``served`` format once at start. The first SavedModel
    load in a process costs far more than later ones (TensorFlow's runtime starting up); paid on a request,
    it stalls every cold load queued behind it. And each runtime's fixed memory (ONNX Runtime's
    environment, TensorFlow's) is then part of the resident memory at ready, outside the models'
    budget, as it is in fact (docs/decisions/0010-tenant-memory.md)."""
    import tempfile

    import numpy as np

    from runners.tenants import classifier
    from runners.tenants.store import ONNX_FILE, TF_DIR, Manifest, write_manifest

    zeros = np.zeros
    clf = classifier.Classifier(
        zeros((16, 2), np.float32), zeros((2, 2), np.float32), zeros(2, np.float32), ["a", "b"]
    )
    formats: tuple[tuple[TenantFormat, Any, str], ...] = (
        ("tf", classifier.export_tf, TF_DIR),
        ("onnx", classifier.export_onnx, ONNX_FILE),
    )
    for fmt, export, name in formats:
        if fmt not in served:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            export(clf, Path(tmp) / name)
            write_manifest(Path(tmp), Manifest(format=fmt, labels=clf.labels))
            load("warm-up", "0", Path(tmp))
    release_freed_memory()


def served(fmt: str, what: str) -> None:
    """Refuse a whole-model format this runner does not serve (its runtime is not loaded)."""
    if fmt != "head" and fmt not in SETTINGS.formats:
        raise ApiError(
            f"{what}: this runner serves heads and {SETTINGS.formats or 'no whole models'}, not "
            f"{fmt} models (BUNDLE_TENANTS_FORMATS)",
            409 if what.startswith("tenant") else 400,
        )


# Evicted models' memory is collected once they hold this share of the budget (see _load).
RELEASE_FRACTION = 0.2


@bentoml.service(name="tenant_runner", **SETTINGS.service_config(["/classify"]))
class TenantRunner:
    def __init__(self) -> None:
        startup = Startup("tenant_runner")
        self.store = TenantStore(SETTINGS.store, keep_versions=SETTINGS.keep_versions)
        self.store.clean_staging()
        # One engine thread for every tenant model: their calls never overlap on the cores.
        self.engine_lane = Lanes(1, "tenant-engine")
        self.load_threads = ThreadPoolExecutor(
            SETTINGS.load_threads, thread_name_prefix="tenant-load"
        )
        self.recorder = Recorder("tenant_runner", "tenants")
        self.export_metrics = Exporter()
        self.cache = ModelCache(
            SETTINGS.budget_bytes,
            self._load,
            on_evict=self._evicted,
            on_load=LOAD_SECONDS.observe,
        )
        # One training at a time: it competes with serving for the cores.
        self.training = asyncio.Semaphore(1)
        with startup.part("warm_up"):
            warm_up_runtimes(SETTINGS.formats)
        self.uncollected = 0  # estimated bytes of models evicted since memory was last given back
        # Every head tenant in memory before the first request: none waits for a load.
        self.heads = heads.HeadBank()
        self.formats: dict[tuple[str, str], TenantFormat] = {}  # (tenant, version) → format
        with startup.part("load"):
            seconds = self.heads.preload(list(self._current_heads()))
        self.export_metrics.heads(len(self.heads.heads), self.heads.nbytes)
        logger.info("%d head tenants resident (read in %.1f s)", len(self.heads.heads), seconds)
        startup.done()

    def _current_heads(self):
        for tenant in self.store.names():
            found = self.store.current(tenant)
            try:
                if found and self._format(tenant, *found) == "head":
                    yield tenant, *found
            except (InvalidModel, OSError):  # broken or deleted meanwhile: its requests say so
                continue

    def _format(self, tenant: str, version: str, directory: Path) -> TenantFormat:
        head = self.heads.heads.get(tenant)
        if head is not None and head.version == version:
            return "head"
        key = (tenant, version)
        if key not in self.formats:
            if len(self.formats) > 100_000:  # versions replaced over a long run
                self.formats.clear()
            self.formats[key] = read_manifest(directory).format
        return self.formats[key]

    async def _load(self, tenant: str, version: str) -> LoadedModel:
        _, directory = self.store.require(tenant)
        directory = directory.parent / version
        loop = asyncio.get_running_loop()
        # Give the memory of evicted models back before taking more, once they hold a fifth of
        # the budget: a full collection held the GIL for a long pause with TensorFlow loaded, so
        # once per eviction stalled every request behind it (docs/decisions/0010-tenant-memory.md).
        # Measured before start-up's objects were frozen (serving/hot_path.py): a collection now
        # scans only what was made since.
        release = self.uncollected >= RELEASE_FRACTION * SETTINGS.budget_bytes
        if release:
            self.uncollected = 0

        def release_then_load() -> LoadedModel:
            if release:
                release_freed_memory()
            return load(tenant, version, directory, SETTINGS.threads)

        model = await loop.run_in_executor(self.load_threads, release_then_load)
        model.batcher = Batcher(
            model.engine, SETTINGS.policy, lanes=self.engine_lane, recorder=self.recorder
        )
        return model

    def _evicted(self, model: LoadedModel) -> None:
        model.batcher.close_when_idle()
        self.uncollected += model.nbytes

    @bentoml.api(route="/classify")
    @replies_on_error
    async def classify(
        self,
        tenant: str,
        ctx: bentoml.Context,
        ids: SpmIds | None = None,
        vectors: Vectors | None = None,
        encoder: ModelName | None = None,
    ) -> Classified:
        """Intent of each text, with the tenant model version that answered: a head tenant takes the
        texts' vectors by its encoder (``vectors``, and the model that made them, ``encoder``), a
        whole-model tenant their SentencePiece ids (409 when what its current version reads is
        missing, or the vectors are another model's)."""
        check_name(tenant)
        if ids is None and vectors is None:
            raise ApiError("send ids (token ids) or vectors (sentence embeddings)", 400)
        version, directory = self.store.require(tenant)
        fmt = self._format(tenant, version, directory)
        cache: Literal["hit", "miss"]
        if fmt == "head":
            if vectors is None:
                raise WrongInputFormat(f"tenant {tenant!r} is a head model: send vectors")
            rows = np.asarray(vectors, dtype=np.float32)
            if not np.all(np.isfinite(rows)):
                raise ApiError("vectors must be finite numbers", 400)
            reads = self.heads.reads
            head = self.heads.get(tenant, version, directory)
            if encoder != head.encoder:
                # Never scored with another model's vectors.
                raise WrongInputFormat(
                    f"tenant {tenant!r} is a head over {head.encoder}: send its vectors "
                    f"(sent: {encoder or 'no encoder named'})"
                )
            if rows.ndim != 2 or rows.shape[1] != head.width:
                raise ApiError(
                    f"vectors: tenant {tenant!r}'s head reads {head.width} numbers a text "
                    f"({head.encoder}'s); got {rows.shape[-1]}",
                    400,
                )
            if self.heads.reads != reads:  # a new version read: the figures changed
                self.export_metrics.heads(len(self.heads.heads), self.heads.nbytes)
            probabilities = head.probabilities(rows)
            labels, answered, cache = head.labels, head.version, "hit"
        else:
            served(fmt, f"tenant {tenant!r}")
            if ids is None:
                raise WrongInputFormat(f"tenant {tenant!r} is a {fmt} model: send ids")
            misses = self.cache.stats.misses
            try:
                model = await self.cache.get(tenant, version)
            finally:
                self.export_metrics(self.cache.stats)
            cache = "hit" if self.cache.stats.misses == misses else "miss"
            probabilities, timing = await model.batcher.submit(ids)
            ctx.response.headers.update(
                timing_headers(timing.queue_s * 1000, timing.inference_s * 1000)
            )
            labels, answered = model.labels, model.version
        ctx.response.headers["X-Tenant-Cache"] = cache
        best = probabilities.argmax(axis=1)
        return Classified(
            intents=[labels[i] for i in best],
            scores=[float(probabilities[row, i]) for row, i in enumerate(best)],
            version=answered,
            cache=cache,
            format=fmt,
        )

    @bentoml.api(route="/tenants/train")
    @replies_on_error
    async def train(
        self,
        tenant: str,
        intents: list[str],
        ctx: bentoml.Context,
        ids: SpmIds | None = None,
        vectors: Vectors | None = None,
        format: TenantFormat = "head",
        encoder: ModelName | None = None,
    ) -> Registered:
        """Train a classifier from examples and register it as the tenant's new version: a head
        from the texts' vectors by ``encoder`` (a catalogue model, recorded in its manifest), an
        ONNX or TF model from their SentencePiece ids."""
        check_name(tenant)
        served(format, "format")
        if (vectors if format == "head" else ids) is None:
            raise WrongInputFormat(
                f"format {format!r} trains from {'vectors' if format == 'head' else 'ids'}"
            )
        if format == "head" and encoder is None:
            raise ApiError("encoder: a head is trained on a named model's vectors", 400)
        async with self.training:
            if vectors is not None and format == "head":
                assert encoder is not None  # checked above
                published = await asyncio.to_thread(
                    registry.train_head,
                    self.store,
                    tenant,
                    np.asarray(vectors, np.float32),
                    intents,
                    encoder=encoder,
                )
            else:
                assert ids is not None  # checked above
                published = await asyncio.to_thread(
                    registry.train, self.store, tenant, ids, intents,
                    fmt=format, dim=SETTINGS.train_dim, epochs=SETTINGS.train_epochs,
                )  # fmt: skip
        return published

    @bentoml.api(route="/tenants/upload")
    @replies_on_error
    async def upload(self, tenant: str, file: Path, ctx: bentoml.Context) -> Registered:
        """Register a model archive (.tar.gz: manifest.json + head.npz, model.onnx or saved_model/) after checking it."""
        check_name(tenant)
        published = await asyncio.to_thread(
            registry.upload, self.store, tenant, file, SETTINGS.max_upload_bytes, SETTINGS.formats
        )
        return published

    @bentoml.api(route="/tenants/list")
    async def list_tenants(self) -> list[str]:
        """Names of every registered tenant."""
        return await asyncio.to_thread(self.store.names)

    @bentoml.api(route="/tenants/show")
    @replies_on_error
    async def show(self, tenant: str, ctx: bentoml.Context) -> TenantInfo:
        """A tenant's current version, labels, metrics and size."""
        return await asyncio.to_thread(self.store.show, check_name(tenant))

    @bentoml.api(route="/tenants/delete")
    @replies_on_error
    async def delete(self, tenant: str, ctx: bentoml.Context) -> Deleted:
        """Remove a tenant; requests already running on its model finish."""
        await asyncio.to_thread(self.store.delete, check_name(tenant))
        self.cache.drop(tenant)
        self.heads.drop(tenant)
        self.export_metrics(self.cache.stats)
        return Deleted(tenant=tenant, deleted=True)

    @bentoml.api(route="/tenants/stats")
    async def stats(self) -> dict[str, float]:
        """Figures of this worker: loaded models, bytes against budget, hits, misses, evictions
        (whole-model tenants); resident heads and their bytes; head reads since start."""
        return {
            **vars(self.cache.stats),
            "heads": float(len(self.heads.heads)),
            "head_bytes": float(self.heads.nbytes),
            "head_reads": float(self.heads.reads),
        }


# The class is a bentoml.Service once decorated (mypy does not apply class decorators).
cast("bentoml.Service[Any]", TenantRunner).add_asgi_middleware(ConformingErrors)
