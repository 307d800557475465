"""The design the tokenizer/model-server split replaces: a plain FastAPI + ONNX Runtime server
answering one request at a time."""

from __future__ import annotations

import threading

from fastapi import FastAPI
from pydantic import BaseModel

from models import encoder
from serving.features import pad, tokenize

tokenizer, engine, spec = encoder.load()
lock = threading.Lock()  # one request at a time: the session owns both cores
app = FastAPI()


class EmbedRequest(BaseModel):
    texts: list[str]


@app.get("/health")
def health() -> dict:
    return {"ok": True}


@app.post("/embed")
def embed(request: EmbedRequest) -> dict:
    # padded to this request's longest text
    feeds = pad(tokenize(tokenizer, request.texts), spec.pad_id, spec.token_types)
    with lock:
        vectors = engine(feeds)
    return {"embeddings": vectors.tolist()}
