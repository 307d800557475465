"""The design the tokenizer/model-server split replaces: a plain FastAPI + ONNX Runtime server answering one request at a time.

uvicorn loadtests.baselines.fastapi_server:app --host 127.0.0.1 --port 8000
"""

from __future__ import annotations

import threading

from fastapi import FastAPI
from pydantic import BaseModel

from models import minilm
from serving.features import pad, tokenize

tokenizer, engine = minilm.load()
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
