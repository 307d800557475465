"""The naive BentoML design this project exists to beat.

A tokenizer service calls a ``batchable=True`` ONNX service through ``bentoml.depends``; BentoML's
dispatcher merges calls by item count and each merged batch is padded to its longest sequence.
The only change from the defaults: ``runner_connection`` raised, without which the caller's pool
is recycled every 100 requests, killing calls in flight. It serves the catalogue's first embed
model (models/encoder.py).
"""

from __future__ import annotations

import bentoml

from models import encoder


@bentoml.service(runner_connection={"max_requests": 2**62, "max_age": 1e12})
class NaiveOnnx:
    def __init__(self) -> None:
        _, self.engine, self.spec = encoder.load()

    @bentoml.api(batchable=True)
    def embed(self, ids: list[list[int]]) -> list[list[float]]:
        from serving.features import pad

        return self.engine(pad(ids, self.spec.pad_id, self.spec.token_types)).tolist()


@bentoml.service
class NaiveFront:
    onnx = bentoml.depends(NaiveOnnx)

    def __init__(self) -> None:
        self.tokenizer, _ = encoder.tokenizer_of()

    @bentoml.api
    async def embed(self, texts: list[str]) -> dict:
        ids = [e.ids for e in self.tokenizer.encode_batch(texts)]
        return {"embeddings": await self.onnx.to_async.embed(ids)}
