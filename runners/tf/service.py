"""The TensorFlow runner: MiniLM as a SavedModel (serving_default), batched by the shared core."""

from __future__ import annotations

import bentoml

from runners import embedding
from runners.predict_api import MOUNT, PREDICT_ROUTE, current_servables, predict_app
from runners.tf.settings import TFRunnerSettings
from serving import contracts
from serving.errors import replies_on_error
from serving.protocol import DeadlineSeconds, EmbedResult, TokenIds

SETTINGS = TFRunnerSettings()


@bentoml.asgi_app(predict_app(current_servables), path=MOUNT)
@bentoml.service(name="tf_runner", **SETTINGS.service_config(["/embed", PREDICT_ROUTE]))
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
        self.servables = {"minilm": self.batchers["tf"]}

    @bentoml.api
    @replies_on_error
    async def embed(
        self, ids: TokenIds, ctx: bentoml.Context, deadline_s: DeadlineSeconds = None
    ) -> EmbedResult:
        """Sentence embeddings for token-id sequences (rows in order), batched with other callers.

        ``deadline_s``: what is left of the caller's deadline (default: this runner's own)."""
        return await embedding.embed(self.batchers["tf"], ids, ctx, deadline_s)
