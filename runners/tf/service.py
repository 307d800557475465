"""The TensorFlow runner: every catalogue model built for ``tf`` (or those ``BUNDLE_TF_MODELS``
names) as a SavedModel (serving_default), each batched by the shared core."""

from __future__ import annotations

import bentoml

from runners import embedding, tf_serving
from runners.tf.settings import TFRunnerSettings
from serving import catalogue
from serving.errors import replies_on_error
from serving.protocol import DeadlineSeconds, EmbedResult, ModelName, Segments, TokenIds
from serving.served import chosen, declare, spec_of
from serving.startup import Startup

SETTINGS = TFRunnerSettings()
SERVED = [
    entry
    for entry in chosen(catalogue.current(), SETTINGS.models, "BUNDLE_TF_MODELS")
    if "tf" in entry.backends
]
DEFAULT = SERVED[0].name if SERVED else ""  # a call that names no model


class TFRunner:
    def __init__(self) -> None:
        from serving.engines.tf import TFEngine

        self.startup = startup = Startup("tf_runner")
        self.specs = {(d.entry.name, d.artefact): spec_of(d.ref(self)) for d in DECLARED}
        with startup.part("load"):
            engines = {
                (d.entry.name, d.artefact): TFEngine(
                    d.ref(self).path_of("saved_model"),
                    self.specs[(d.entry.name, d.artefact)].contract(),
                    threads=SETTINGS.threads,
                    name=str(d.ref(self).tag),
                )
                for d in DECLARED
            }
        with startup.part("warm_up"):
            self.batchers = embedding.batchers("tf_runner", engines, self.specs, SETTINGS.policy)
        aliases = {entry.name: entry.aliases for entry in SERVED}
        self.servables = tf_serving.servables(self.batchers, self.specs, {}, aliases)

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
        deadline_s: DeadlineSeconds = None,
        segments: Segments | None = None,
    ) -> EmbedResult:
        """The model's output for token-id sequences (rows in order), batched with other callers.

        ``model``: a catalogue name (default: the first this runner serves); ``deadline_s``: what
        is left of the caller's deadline (default: this runner's own); ``segments``: for text
        pairs, where each sequence's second text starts."""
        key = (model or DEFAULT, "tf")
        batcher = embedding.pick(self.batchers, *key)
        return await embedding.embed(batcher, self.specs[key], ids, ctx, deadline_s, segments)


DECLARED = declare(TFRunner, SERVED, ["tf"])
TFRunner = bentoml.service(  # type: ignore[misc]
    name="tf_runner", **SETTINGS.service_config(["/embed", *tf_serving.PREDICT_ROUTES])
)(TFRunner)
tf_serving.install(TFRunner, SERVED, ["tf"], {})
