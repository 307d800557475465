"""Locust workloads against the tokenizer service, one user class per workload (how to run them:
loadtests/README.md). Users send back to back (no think time): a closed loop at full load.
"""

from __future__ import annotations

import random

import gevent
from locust import FastHttpUser, events, task
from locust.env import Environment

from models import corpus

TEXTS = corpus.load_texts()
CHATS = [text for text, _ in corpus.chat_utterances()]
PAIRS = corpus.sentence_pairs(600, seed=7)
BULK = 32


@events.init_command_line_parser.add_listener
def _arguments(parser) -> None:
    parser.add_argument("--max-fail-ratio", type=float, default=0.0, help="fail the run above")
    parser.add_argument("--max-p95-ms", type=float, default=0.0, help="fail above (0: no limit)")
    parser.add_argument("--backend", default="", help="/embed's backend: onnx-int8, tf")
    parser.add_argument("--tenants", type=int, default=1000, help="TenantUser: tenants 1..N")


@events.quitting.add_listener
def _thresholds(environment: Environment, **_: object) -> None:
    """Pass/fail through Locust's exit code, so a headless run can gate CI."""
    total = environment.stats.total
    options = environment.parsed_options
    assert options is not None  # a run from the command line, with this file's options
    problems = []
    if total.num_requests == 0:
        problems.append("no requests were made")
    if total.fail_ratio > options.max_fail_ratio:
        problems.append(f"failure ratio {total.fail_ratio:.4f} > {options.max_fail_ratio}")
    p95 = total.get_response_time_percentile(0.95) or 0
    if options.max_p95_ms and p95 > options.max_p95_ms:
        problems.append(f"p95 {p95:.0f} ms > {options.max_p95_ms:.0f} ms")
    for problem in problems:
        print(f"threshold failed: {problem}")
        environment.process_exit_code = 1


class _User(FastHttpUser):
    abstract = True

    def on_start(self) -> None:
        self.rng = random.Random()
        backend = self.environment.parsed_options.backend if self.environment.parsed_options else ""
        self.extra = {"backend": backend} if backend else {}

    def post(self, path: str, body: dict, check, name: str | None = None) -> None:
        name = name or path
        retry_after = 0.0
        with self.client.post(path, json=body, name=name, catch_response=True) as response:
            if response.status_code in (429, 503):
                # Shed by the server: a failure, reported under its own name so the stats of
                # served requests stay clean, and the user backs off as a real client does.
                response.request_meta["name"] = f"{name} [shed]"
                response.failure(f"HTTP {response.status_code}: shed")
                retry_after = float(response.headers.get("Retry-After") or 1)
            elif response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
            elif problem := check(response.json()):
                response.failure(problem)
        if retry_after:
            gevent.sleep(retry_after)


class ChatUser(_User):
    """One sentence per request (a chat turn)."""

    @task
    def embed_one(self) -> None:
        body = {"texts": [self.rng.choice(TEXTS)], **self.extra}
        self.post("/embed", body, _embeddings(1), name="/embed [chat]")


class BulkUser(_User):
    """32 sentences per request (batch indexing)."""

    @task
    def embed_bulk(self) -> None:
        body = {"texts": self.rng.sample(TEXTS, BULK), **self.extra}
        self.post("/embed", body, _embeddings(BULK), name="/embed [bulk]")


class SimilarityUser(_User):
    """Eight STS-style pairs per request, with a threshold."""

    @task
    def similarity(self) -> None:
        pairs = self.rng.sample(PAIRS, 8)
        self.post("/similarity", {"pairs": pairs, "threshold": 0.5}, _scores)


class InferenceUser(_User):
    """One text per request: {"input_text": str} -> {"outputs": [float]}."""

    @task
    def inference(self) -> None:
        self.post("/inference", {"input_text": self.rng.choice(TEXTS)}, _outputs)


class TenantUser(_User):
    """Per-customer intent models: /classify for a tenant drawn Zipf-style (s=1.1) from N."""

    def on_start(self) -> None:
        super().on_start()
        count = self.environment.parsed_options.tenants if self.environment.parsed_options else 1000
        self.names = [f"tenant-{i:04d}" for i in range(1, count + 1)]
        self.rng.shuffle(self.names)  # popularity unrelated to the tenant number
        self.weights = [1 / rank**1.1 for rank in range(1, count + 1)]

    @task
    def classify(self) -> None:
        tenant = self.rng.choices(self.names, self.weights)[0]
        body = {"tenant": tenant, "texts": [self.rng.choice(CHATS)]}
        self.post("/classify", body, _classified)


def _classified(body: dict) -> str | None:
    ok = len(body.get("intents", [])) == 1 and body.get("version")
    return None if ok else "expected 1 intents and a version"


def _embeddings(count: int):
    def check(body: dict) -> str | None:
        vectors = body.get("embeddings", [])
        if len(vectors) != count or any(len(v) != 384 for v in vectors):
            return f"expected {count} embeddings of 384 floats"
        return None

    return check


def _scores(body: dict) -> str | None:
    ok = len(body.get("scores", [])) == len(body.get("labels") or []) == 8
    return None if ok else "expected 8 scores and labels"


def _outputs(body: dict) -> str | None:
    return None if len(body.get("outputs", [])) == 384 else "expected 384 outputs"
