"""A load client for the Swarm test, run in a container on the stack's network (the tokenizer's
image, which has httpx): THREADS clients call the front door in a loop (embed, classify,
similarity) until SIGTERM or SECONDS, compare every answer with the reference given, and print a
JSON summary: counts, each failure (time, endpoint, status or error and its message) and each
wrong answer.

    python load.py '{"url": ..., "threads": 4, "seconds": 300, "tenant": ..., "reference": {...}}'
"""

import json
import math
import signal
import sys
import threading
import time

import httpx

stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())


def requests(spec: dict) -> list[tuple[str, dict]]:
    ref = spec["reference"]
    return [
        ("/embed", {"texts": ref["embed_texts"]}),
        ("/classify", {"tenant": spec["tenant"], "texts": ref["classify_texts"]}),
        ("/similarity", {"pairs": ref["pairs"]}),
    ]


def close(got: list, want: list) -> bool:
    """Two lists of floats (or of lists of floats) equal within 1e-4, shapes included."""
    if len(got) != len(want):
        return False
    return all(
        close(a, b)
        if isinstance(b, list)
        else isinstance(a, float) and math.isclose(a, b, abs_tol=1e-4)
        for a, b in zip(got, want, strict=True)
    )


def correct(route: str, body: dict, ref: dict) -> bool:
    if route == "/embed":
        return close(body["embeddings"], ref["embeddings"])
    if route == "/classify":
        return body["intents"] == ref["intents"]
    return close(body["scores"], ref["scores"])


def client(spec: dict, started: float, results: dict, lock: threading.Lock) -> None:
    calls = requests(spec)
    with httpx.Client(base_url=spec["url"], timeout=30) as http:
        n = 0
        while not stop.is_set() and time.monotonic() - started < spec["seconds"]:
            route, payload = calls[n % len(calls)]
            n += 1
            at = round(time.monotonic() - started, 2)
            try:
                reply = http.post(route, json=payload)
            except httpx.TransportError as exc:
                # The message tells a connection closed before any answer from one closed
                # mid-answer (both are RemoteProtocolError).
                outcome = {"at": at, "route": route, "error": type(exc).__name__,
                           "message": str(exc)[:200]}  # fmt: skip
            else:
                if reply.status_code != 200:
                    outcome = {
                        "at": at,
                        "route": route,
                        "status": reply.status_code,
                        "body": reply.text[:200],
                    }
                elif not correct(route, reply.json(), spec["reference"]):
                    outcome = {"at": at, "route": route, "wrong": reply.text[:200]}
                else:
                    outcome = None
            with lock:
                results["requests"] += 1
                if outcome is None:
                    results["ok"] += 1
                    replica = reply.headers.get("x-bundle-replica")
                    results["replicas"][replica] = results["replicas"].get(replica, 0) + 1
                elif "wrong" in outcome:
                    results["wrong"].append(outcome)
                else:
                    results["failed"].append(outcome)


def main(spec: dict) -> dict:
    results = {"requests": 0, "ok": 0, "failed": [], "wrong": [], "replicas": {}}
    lock = threading.Lock()
    started = time.monotonic()
    threads = [
        threading.Thread(target=client, args=(spec, started, results, lock))
        for _ in range(spec["threads"])
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results["seconds"] = round(time.monotonic() - started, 1)
    return results


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
