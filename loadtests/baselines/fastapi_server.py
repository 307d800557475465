"""Seed 003's design: a plain FastAPI + ONNX Runtime server answering one request at a time.

uvicorn loadtests.baselines.fastapi_server:app --host 127.0.0.1 --port 8000
"""

from __future__ import annotations

import threading

from fastapi import FastAPI
from pydantic import BaseModel

from models import store
from serving import contracts
from serving.engines.onnx import OnnxEngine
from serving.features import load_tokenizer, pad, tokenize

tokenizer = load_tokenizer(store.path_of(contracts.TOKENIZER) / "tokenizer.json")
engine = OnnxEngine(
    store.path_of(contracts.ONNX_FP32) / "model.onnx",
    contracts.SENTENCE_EMBEDDING,
    threads=2,
    providers=["CPUExecutionProvider"],
)
lock = threading.Lock()  # one request at a time: the session owns both cores
app = FastAPI()


class EmbedRequest(BaseModel):
    texts: list[str]


@app.get("/health")
def health() -> dict:
    return {"ok": True}


@app.post("/embed")
def embed(request: EmbedRequest) -> dict:
    feeds = pad(tokenize(tokenizer, request.texts))  # padded to this request's longest text
    with lock:
        vectors = engine(feeds)
    return {"embeddings": vectors.tolist()}
