"""The TensorFlow runner: MiniLM as a SavedModel (serving_default), batched by the shared core."""

from __future__ import annotations

import bentoml

from runners import embedding, tf_serving
from runners.tf.settings import TFRunnerSettings
from serving import contracts
from serving.errors import replies_on_error
from serving.protocol import DeadlineSeconds, EmbedResult, TokenIds

SETTINGS = TFRunnerSettings()
# TF Serving names for the model (POST /v1/models/{name}:predict); "model" is the name TF Serving's
# own image serves by default (MODEL_NAME), so its clients work unchanged.
SERVABLES = {"minilm": "tf", "model": "tf"}


@bentoml.service(
    name="tf_runner", **SETTINGS.service_config(["/embed", *tf_serving.PREDICT_ROUTES])
)
class TFRunner:
    model = bentoml.models.BentoModel(SETTINGS.model)

    def __init__(self) -> None:
        from serving.engines.tf import TFEngine

        engine = TFEngine(
            self.model.path_of("saved_model"),
            contracts.SENTENCE_EMBEDDING,
            threads=SETTINGS.threads,
            name=str(self.model.tag),
        )
        self.batchers = embedding.batchers("tf_runner", {"tf": engine}, SETTINGS.policy)
        self.servables = {name: self.batchers[v] for name, v in SERVABLES.items()}

    @bentoml.api
    @replies_on_error
    async def embed(
        self, ids: TokenIds, ctx: bentoml.Context, deadline_s: DeadlineSeconds = None
    ) -> EmbedResult:
        """Sentence embeddings for token-id sequences (rows in order), batched with other callers.

        ``deadline_s``: what is left of the caller's deadline (default: this runner's own)."""
        return await embedding.embed(self.batchers["tf"], ids, ctx, deadline_s)


tf_serving.install(TFRunner, list(SERVABLES), contracts.SENTENCE_EMBEDDING)
