"""The ONNX Runtime runner: every catalogue model built for ``onnx`` or ``onnx-int8`` (or those
``BUNDLE_ONNX_MODELS`` names), each model and backend batched by the shared core on the
instance's lanes."""

from __future__ import annotations

from typing import Any

import bentoml

from runners import embedding, tf_serving
from runners.onnx.settings import OnnxRunnerSettings
from serving import catalogue
from serving.errors import replies_on_error
from serving.protocol import DeadlineSeconds, EmbedResult, ModelName, Segments, TokenIds, Variant
from serving.served import chosen, declare, spec_of
from serving.startup import Startup

SETTINGS = OnnxRunnerSettings()
BACKENDS = {"fp32": "onnx", "int8": "onnx-int8"}  # the API's variant -> the catalogue's backend
SUFFIXES = {"onnx-int8": "-int8"}  # a model's int8 backend, for TF Serving: NAME-int8
SERVED = [
    entry
    for entry in chosen(catalogue.current(), SETTINGS.models, "BUNDLE_ONNX_MODELS")
    if set(entry.backends) & set(BACKENDS.values())
]


DEFAULT = SERVED[0].name if SERVED else ""  # a call that names no model


class OnnxRunner:
    def __init__(self) -> None:
        from serving.engines.onnx import OnnxEngine

        self.startup = startup = Startup("onnx_runner")

        self.specs = {(d.entry.name, d.artefact): spec_of(d.ref(self)) for d in DECLARED}

        def sessions(threads: int, spin_between_runs: bool = True) -> dict[Any, OnnxEngine]:
            return {
                (d.entry.name, d.artefact): OnnxEngine(
                    d.ref(self).path_of("model.onnx"),
                    self.specs[(d.entry.name, d.artefact)].contract(),
                    threads=threads,
                    providers=SETTINGS.providers,
                    name=str(d.ref(self).tag),
                    spin_between_runs=spin_between_runs,
                )
                for d in DECLARED
            }

        lanes = SETTINGS.lane_count
        if lanes == 1:
            # One lane runs one session at a time over every core; where there are several (models,
            # backends), an idle one's threads must not spin beside the one running.
            with startup.part("load"):
                wide = sessions(SETTINGS.threads, spin_between_runs=len(DECLARED) == 1)
            with startup.part("warm_up"):
                self.batchers = embedding.batchers("onnx_runner", wide, self.specs, SETTINGS.policy)
        else:  # one-thread sessions on parallel lanes, and a solo session on every lane's core
            # A solo session runs when nothing else is waiting: its threads stop spinning when a
            # run ends, leaving the cores to the hops that answer the request
            # (docs/decisions/0005-onnx-session-threads.md).
            with startup.part("load"):
                solos = sessions(lanes, spin_between_runs=False)
                narrow = sessions(1)
            with startup.part("warm_up"):
                self.batchers = embedding.batchers(
                    "onnx_runner", narrow, self.specs, SETTINGS.policy, lanes, solos=solos
                )
        aliases = {entry.name: entry.aliases for entry in SERVED}
        self.servables = tf_serving.servables(self.batchers, self.specs, SUFFIXES, aliases)

    @bentoml.on_startup
    async def warm_up(self) -> None:
        await embedding.warm_up(self.batchers, self.specs, self.startup)

    @bentoml.api
    @replies_on_error
    async def embed(
        self,
        ids: TokenIds,
        ctx: bentoml.Context,
        model: ModelName | None = None,
        variant: Variant = "fp32",
        deadline_s: DeadlineSeconds = None,
        segments: Segments | None = None,
    ) -> EmbedResult:
        """The model's output for token-id sequences (rows in order), batched with other callers:
        a sentence embedding a row, or a head's logits. ``model``: a catalogue name (default: the
        first this runner serves); ``variant``: fp32 (backend onnx) or int8 (onnx-int8);
        ``deadline_s``: what is left of the caller's deadline (default: this runner's own);
        ``segments``: for text pairs, where each sequence's second text starts."""
        key = (model or DEFAULT, BACKENDS[variant])
        batcher = embedding.pick(self.batchers, *key)
        return await embedding.embed(batcher, self.specs[key], ids, ctx, deadline_s, segments)


DECLARED = declare(OnnxRunner, SERVED, list(BACKENDS.values()))
OnnxRunner = bentoml.service(  # type: ignore[misc]
    name="onnx_runner", **SETTINGS.service_config(["/embed", *tf_serving.PREDICT_ROUTES])
)(OnnxRunner)
tf_serving.install(OnnxRunner, SERVED, list(BACKENDS.values()), SUFFIXES)
