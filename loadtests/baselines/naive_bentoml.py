"""The naive BentoML design this project exists to beat.

A tokenizer service calls a ``batchable=True`` ONNX service through ``bentoml.depends``; BentoML's
dispatcher merges calls by item count and each merged batch is padded to its longest sequence.
The only change from the defaults: ``runner_connection`` raised, without which a 32-user run lost
23 % of requests (the caller's pool is recycled every 100 requests).

    bentoml serve loadtests.baselines.naive_bentoml:NaiveFront
"""

from __future__ import annotations

import bentoml

from models import store
from serving import contracts


@bentoml.service(runner_connection={"max_requests": 2**62, "max_age": 1e12})
class NaiveOnnx:
    def __init__(self) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(
            str(store.path_of(contracts.ONNX_FP32) / "model.onnx"),
            providers=["CPUExecutionProvider"],
        )

    @bentoml.api(batchable=True)
    def embed(self, ids: list[list[int]]) -> list[list[float]]:
        from serving.features import pad

        return self.session.run(["sentence_embedding"], pad(ids))[0].tolist()


@bentoml.service
class NaiveFront:
    onnx = bentoml.depends(NaiveOnnx)

    def __init__(self) -> None:
        from serving.features import load_tokenizer

        self.tokenizer = load_tokenizer(store.path_of(contracts.TOKENIZER) / "tokenizer.json")

    @bentoml.api
    async def embed(self, texts: list[str]) -> dict:
        ids = [e.ids for e in self.tokenizer.encode_batch(texts)]
        return {"embeddings": await self.onnx.to_async.embed(ids)}
