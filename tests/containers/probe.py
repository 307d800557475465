"""Run inside the stack's network (piped to ``python -`` in the tokenizer's container, whose image
has httpx): calls the tenant runners through the proxy and each replica directly, which no port
outside the network reaches. Takes a JSON command as its argument, prints JSON.

  {"classify": [[tenant, ids], ...], "times": 3}   each tenant's answers, in order, through the proxy
  {"stats": ["tenant-runner-1", ...]}              each replica's cache figures (/tenants/stats)
  {"active": "tenant-runners"}                      servers up in a proxy backend (its exporter)
  {"batches": ["onnx-runner", ...]}                 each service's engine calls so far, by the model
                                                   and backend they ran (its /metrics; a service of
                                                   several replicas: the one its name resolved to)
  {"until_served": [[tenant, ids], ...], "seconds": 10}
                                                   every tenant asked in turn until it is answered:
                                                   seconds to its first 200 and what answered
"""

import json
import re
import sys
import time

import httpx

PROXY = "http://proxy:3003"


def ask(client: httpx.Client, tenant: str, ids: list) -> dict:
    # Calls go one at a time, 20 ms apart, so that the proxy has counted the last one finished:
    # with bounded load, a request still in flight on a replica sends the next one elsewhere
    # (which is its job under load, not what these checks are about).
    time.sleep(0.02)
    try:
        reply = client.post(
            f"{PROXY}/classify",
            json={"tenant": tenant, "ids": ids},
            headers={"X-Bundle-Tenant": tenant},
        )
    except httpx.TransportError as exc:
        return {"status": 0, "error": type(exc).__name__}
    body = (
        reply.json() if reply.headers.get("content-type", "").startswith("application/json") else {}
    )
    return {
        "status": reply.status_code,
        "replica": reply.headers.get("x-bundle-replica"),
        "cache": reply.headers.get("x-tenant-cache"),
        "intents": body.get("intents"),
        "version": body.get("version"),
    }


def main(command: dict) -> dict:
    with httpx.Client(timeout=30) as client:
        if "classify" in command:
            answers = {}
            for tenant, ids in command["classify"]:
                answers[tenant] = []
                for _ in range(command.get("times", 1)):
                    answers[tenant].append(ask(client, tenant, ids))
            return answers
        if "active" in command:
            metrics = client.get("http://proxy:8404/metrics").text
            name = f'haproxy_backend_active_servers{{proxy="{command["active"]}"}}'
            return {
                "active": next(
                    float(line.split()[-1])
                    for line in metrics.splitlines()
                    if line.startswith(name)
                )
            }
        if "batches" in command:
            found = {}
            for name in command["batches"]:
                calls = {}
                for line in client.get(f"http://{name}:3000/metrics").text.splitlines():
                    if line.startswith("bundle_batch_rows_count{"):
                        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
                        calls[labels["model"]] = float(line.split()[-1])
                found[name] = calls
            return found
        if "stats" in command:
            return {
                name: client.post(f"http://{name}:3000/tenants/stats", json={}).json()
                for name in command["stats"]
            }
        started = time.monotonic()
        pending = {tenant: ids for tenant, ids in command["until_served"]}
        served, failed = {}, []
        while pending and time.monotonic() - started < command["seconds"]:
            for tenant, ids in list(pending.items()):
                answer = ask(client, tenant, ids)
                if answer["status"] == 200:
                    served[tenant] = {**answer, "seconds": time.monotonic() - started}
                    del pending[tenant]
                else:
                    failed.append({"tenant": tenant, **answer})
        return {"served": served, "failed": failed, "pending": sorted(pending)}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
