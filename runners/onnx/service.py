"""The ONNX Runtime runner: MiniLM fp32 and int8, each batched by the shared core."""

from __future__ import annotations

import bentoml

from runners import embedding, tf_serving
from runners.onnx.settings import OnnxRunnerSettings
from serving import contracts
from serving.errors import replies_on_error
from serving.protocol import DeadlineSeconds, EmbedResult, TokenIds, Variant

SETTINGS = OnnxRunnerSettings()
# TF Serving names for the same models (POST /v1/models/{name}:predict) → variant. "model" is the
# name TF Serving's own image serves by default (MODEL_NAME), so its clients work unchanged.
SERVABLES = {"minilm": "fp32", "minilm-int8": "int8", "model": "fp32"}


@bentoml.service(
    name="onnx_runner", **SETTINGS.service_config(["/embed", *tf_serving.PREDICT_ROUTES])
)
class OnnxRunner:
    fp32 = bentoml.models.BentoModel(SETTINGS.fp32_model)
    int8 = bentoml.models.BentoModel(SETTINGS.int8_model)

    def __init__(self) -> None:
        from serving.engines.onnx import OnnxEngine

        models = {"fp32": self.fp32, "int8": self.int8}

        def sessions(threads: int, spin_between_runs: bool = True) -> dict[str, OnnxEngine]:
            return {
                variant: OnnxEngine(
                    ref.path_of("model.onnx"),
                    contracts.SENTENCE_EMBEDDING,
                    threads=threads,
                    providers=SETTINGS.providers,
                    name=str(ref.tag),
                    spin_between_runs=spin_between_runs,
                )
                for variant, ref in models.items()
            }

        lanes = SETTINGS.lane_count
        if lanes == 1:
            self.batchers = embedding.batchers(
                "onnx_runner", sessions(SETTINGS.threads), SETTINGS.policy
            )
        else:  # one-thread sessions on parallel lanes, and a solo session on every lane's core
            # A solo session runs when nothing else is waiting: its threads stop spinning when a
            # run ends, leaving the cores to the hops that answer the request. Measured against
            # spinning on (chat, the benchmark's points, 3 x 10 s interleaved): 16 users 240 vs
            # 220 sentences/s; one client p50 6.7 vs 7.2 ms and the engine threads' CPU 8.9 vs
            # 12.7 ms a request; 64 users alike (their calls run on the one-thread lanes).
            solos = sessions(lanes, spin_between_runs=False)
            self.batchers = embedding.batchers(
                "onnx_runner", sessions(1), SETTINGS.policy, lanes, solos=solos
            )
        self.servables = {name: self.batchers[v] for name, v in SERVABLES.items()}

    @bentoml.api
    @replies_on_error
    async def embed(
        self,
        ids: TokenIds,
        ctx: bentoml.Context,
        variant: Variant = "fp32",
        deadline_s: DeadlineSeconds = None,
    ) -> EmbedResult:
        """Sentence embeddings for token-id sequences (rows in order), batched with other callers.

        ``deadline_s``: what is left of the caller's deadline (default: this runner's own)."""
        return await embedding.embed(self.batchers[variant], ids, ctx, deadline_s)


tf_serving.install(OnnxRunner, list(SERVABLES), contracts.SENTENCE_EMBEDDING)
