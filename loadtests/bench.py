"""The side-by-side benchmark (``make bench``; ``BENCH_QUICK=1`` for a few seconds a point).

In one run, on one machine, with the same Locust client and corpus for every system:
- raw: the engine in this process (tokenize + ONNX session, length-sorted batches of the best
  size), no HTTP at all: the limit;
- stack: this project (``bentoml serve .``), fp32, and the same server with backend onnx-int8;
- stack, batching off: the same graph with one sequence per engine call;
- fastapi: seed 003's FastAPI + ONNX Runtime server, one request at a time;
- naive bentoml: ``batchable=True`` on ``list[list[int]]``, padded to the longest.
Servers run one at a time. Prints a markdown table and writes build/bench/results.json, results.md
and a PNG per workload (throughput, p50 and p99 against users).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from loadtests.processes import BIN, ROOT, Server, bentoml_serve, free_port

OUT = Path(os.environ.get("BENCH_OUT", ROOT / "build" / "bench"))
WORKLOADS = {"chat": ("ChatUser", 1), "bulk": ("BulkUser", 32)}
# The full run ramps as seed 000 does. A quick run (CI) uses lighter loads: in a closed loop, bulk
# at 160 users means ~10 s latency, longer than a quick point lasts, so nothing would complete.
USERS = (4, 8, 16) if os.environ.get("BENCH_QUICK", "") not in ("", "0") else (16, 64, 160)
MIDDLE = USERS[1]
STACK, NOBATCH, INT8, FASTAPI, NAIVE = (
    "stack",
    "stack, batching off",
    "stack, int8",
    "fastapi",
    "naive bentoml",
)
SYSTEMS = (STACK, INT8, NOBATCH, FASTAPI, NAIVE)


@dataclass
class Point:
    system: str
    workload: str
    users: int
    sentences_per_s: float
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    requests: int  # not shed (served, or failed otherwise)
    failures: int  # of those, failed (wrong answer, 5xx other than 503)
    shed: int  # refused with 429/503 + Retry-After (the users then back off)
    loadgen_cpu_share: float  # Locust's CPU seconds / (wall seconds x cores)


def raw_engine(model: str, repeats: int) -> dict[str, float]:
    """Sentences/s of the engine alone on the load-test corpus, length-sorted, best batch size."""
    from models import contracts, corpus, store
    from models.features import load_tokenizer, pad, tokenize
    from runners.onnx.engine import OnnxEngine

    engine = OnnxEngine(
        store.path_of(model) / "model.onnx",
        contracts.SENTENCE_EMBEDDING,
        threads=os.cpu_count() or 2,
        providers=["CPUExecutionProvider"],
    )
    tokenizer = load_tokenizer(store.path_of(contracts.TOKENIZER) / "tokenizer.json")
    texts = corpus.load_texts()
    rates: dict[int, float] = {}
    for batch in (8, 16, 32, 64):
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            ids = sorted(tokenize(tokenizer, texts), key=len)
            for i in range(0, len(ids), batch):
                engine(pad(ids[i : i + batch]))
            samples.append(len(texts) / (time.perf_counter() - started))
        rates[batch] = statistics.median(samples)
    best = max(rates, key=rates.__getitem__)
    return {"sentences_per_s": rates[best], "batch_size": best, "by_batch_size": rates}


def locust_point(
    url: str, system: str, workload: str, users: int, seconds: float, backend: str = ""
) -> Point:
    user_class, per_request = WORKLOADS[workload]
    prefix = OUT / "locust" / f"{system.replace(' ', '_').replace(',', '')}-{workload}-{users}"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        str(BIN / "locust"), "-f", "loadtests/locustfile.py", user_class, "--headless",
        "-u", str(users), "-r", str(users), "-t", f"{seconds + 1:.0f}s", "--reset-stats",
        "--host", url, "--csv", str(prefix), "--only-summary", "--max-fail-ratio", "1",
    ]  # fmt: skip
    if backend:
        argv += ["--backend", backend]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    try:
        with open(f"{prefix}_stats.csv") as fh:
            rows = list(csv.DictReader(fh))
        total = next(row for row in rows if row["Name"] == "Aggregated")
    except (OSError, StopIteration):
        raise RuntimeError(
            f"locust produced no stats for {system}/{workload}/{users}: {proc.stderr[-1500:]}"
        ) from None
    served_rows = [
        r for r in rows if r["Name"] != "Aggregated" and not r["Name"].endswith("[shed]")
    ]
    shed = sum(int(r["Request Count"]) for r in rows if r["Name"].endswith("[shed]"))
    served = (
        served_rows[0]
        if served_rows
        else {"Request Count": "0", "Failure Count": "0", "50%": "N/A", "99%": "N/A"}
    )
    count, failed = int(served["Request Count"]), int(served["Failure Count"])
    # Locust's Requests/s counts failures and shed requests too: scale it to the successful ones.
    total_count = int(total["Request Count"])
    ok_rps = float(total["Requests/s"]) * (count - failed) / total_count if total_count else 0.0
    return Point(
        system, workload, users,
        sentences_per_s=ok_rps * per_request, requests_per_s=ok_rps,
        p50_ms=_number(served["50%"]), p99_ms=_number(served["99%"]),
        requests=count, failures=failed, shed=shed,
        loadgen_cpu_share=cpu / (wall * (os.cpu_count() or 1)),
    )  # fmt: skip


def _number(cell: str) -> float:
    try:
        return float(cell)
    except ValueError:  # "N/A": no request completed in the window
        return float("nan")


def drain(url: str, timeout_s: float = 120) -> float:
    """Wait until the server has worked off what the last point left queued (a client that stops
    does not take back the requests it had sent): a one-sentence request must answer in 0.5 s."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        sent = time.monotonic()
        try:
            with urllib.request.urlopen(
                urllib.request.Request(
                    f"{url}/embed",
                    data=b'{"texts": ["drain"]}',
                    headers={"content-type": "application/json"},
                ),
                timeout=30,
            ) as resp:
                if resp.status == 200 and time.monotonic() - sent < 0.5:
                    return time.monotonic() - started
        except OSError:
            pass
        time.sleep(0.5)
    return time.monotonic() - started


def servers() -> dict[str, Server]:
    logs = OUT / "logs"
    port = free_port()
    fastapi = Server(
        [str(BIN / "uvicorn"), "loadtests.baselines.fastapi_server:app", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        port, logs / "fastapi.log", ready_path="/health",
    )  # fmt: skip
    return {
        STACK: bentoml_serve(".", logs / "stack.log"),
        NOBATCH: bentoml_serve(".", logs / "nobatch.log", env={"BUNDLE_ONNX_MAX_BATCH_ROWS": "1"}),
        FASTAPI: fastapi,
        NAIVE: bentoml_serve("loadtests.baselines.naive_bentoml:NaiveFront", logs / "naive.log"),
    }


def ratios(points: list[Point], raw: float) -> list[dict]:
    table = {(p.system, p.workload, p.users): p.sentences_per_s for p in points}
    out = []
    for workload in WORKLOADS:
        for users in USERS:
            stack = table[(STACK, workload, users)]
            row = {
                "workload": workload,
                "users": users,
                "stack_sentences_per_s": stack,
                "raw_sentences_per_s": raw,
            }
            row["served_over_raw"] = stack / raw
            for name, system in (
                ("vs_fastapi", FASTAPI),
                ("vs_naive", NAIVE),
                ("vs_batching_off", NOBATCH),
            ):
                other = table.get((system, workload, users))
                row[name] = stack / other if other else None
            if (INT8, workload, users) in table:
                row["int8_over_fp32"] = table[(INT8, workload, users)] / stack
            out.append(row)
    return out


def markdown(points: list[Point], rows: list[dict], raw: dict) -> str:
    lines = [
        f"Raw engine (fp32, in process, sorted batches of {raw['fp32']['batch_size']}): "
        f"{raw['fp32']['sentences_per_s']:.0f} sentences/s; int8: {raw['int8']['sentences_per_s']:.0f} "
        f"({raw['int8']['sentences_per_s'] / raw['fp32']['sentences_per_s']:.2f}x).",
        "",
        "| workload | users | system | sentences/s | p50 ms | p99 ms | failures | shed | load-gen CPU | served/raw | stack ÷ this |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_key = {(r["workload"], r["users"]): r for r in rows}
    for p in sorted(
        points, key=lambda p: (list(WORKLOADS).index(p.workload), p.users, SYSTEMS.index(p.system))
    ):
        row = by_key[(p.workload, p.users)]
        stack = row["stack_sentences_per_s"]
        if not p.requests:  # nothing completed within the window (latency longer than the point)
            lines.append(f"| {p.workload} | {p.users} | {p.system} | 0 | — | — | {p.failures} | {p.shed} | "
                         f"{p.loadgen_cpu_share:.0%} | 0.00 | — |")  # fmt: skip
            continue
        lines.append(
            f"| {p.workload} | {p.users} | {p.system} | {p.sentences_per_s:.0f} | {p.p50_ms:.0f} | {p.p99_ms:.0f} | "
            f"{p.failures} | {p.shed} | {p.loadgen_cpu_share:.0%} | {p.sentences_per_s / row['raw_sentences_per_s']:.2f} | "
            f"{stack / p.sentences_per_s if p.sentences_per_s else float('nan'):.2f} |"
        )
    return "\n".join(lines)


def targets(rows: list[dict], points: list[Point]) -> list[tuple[str, bool, str]]:
    at = {(r["workload"], r["users"]): r for r in rows}
    # A shed request is a failure to the client that sent it: both count here.
    failures = sum(p.failures + p.shed for p in points if p.users == MIDDLE and p.system == STACK)
    int8 = [r["int8_over_fp32"] for r in rows if r.get("int8_over_fp32")]
    best = {w: max(r["served_over_raw"] for r in rows if r["workload"] == w) for w in WORKLOADS}
    checks = [
        ("bulk served/raw >= 0.90 (best point)", best["bulk"] >= 0.90, f"{best['bulk']:.2f}"),
        ("chat served/raw >= 0.70 (best point)", best["chat"] >= 0.70, f"{best['chat']:.2f}"),
    ]
    for w in WORKLOADS:
        r = at[(w, MIDDLE)]
        checks.append(
            (
                f"{w} at {MIDDLE} users >= 1.75x fastapi",
                (r["vs_fastapi"] or 0) >= 1.75,
                f"{r['vs_fastapi']:.2f}x",
            )
        )
        checks.append(
            (
                f"{w} at {MIDDLE} users >= 2.5x naive bentoml",
                (r["vs_naive"] or 0) >= 2.5,
                f"{r['vs_naive']:.2f}x",
            )
        )
    checks.append((f"stack at {MIDDLE} users: 0 failures", failures == 0, str(failures)))
    checks.append(
        (
            f"int8 >= 1.5x fp32 (served, {MIDDLE} users)",
            bool(int8) and min(int8) >= 1.5,
            ", ".join(f"{x:.2f}x" for x in int8),
        )
    )
    return checks


def plot(points: list[Point], raw: float) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for workload in WORKLOADS:
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
        for system in SYSTEMS:
            series = sorted(
                (p for p in points if p.system == system and p.workload == workload),
                key=lambda p: p.users,
            )
            if len(series) < 2:
                continue
            users = [p.users for p in series]
            left.plot(users, [p.sentences_per_s for p in series], marker="o", label=system)
            (line,) = right.plot(
                users, [p.p50_ms for p in series], marker="o", label=f"{system} p50"
            )
            right.plot(
                users,
                [p.p99_ms for p in series],
                marker="x",
                linestyle="--",
                color=line.get_color(),
                label=f"{system} p99",
            )
        left.axhline(raw, color="black", linestyle=":", label="raw engine")
        left.set(
            title=f"{workload}: throughput", xlabel="users", ylabel="sentences/s", xticks=USERS
        )
        right.set(
            title=f"{workload}: latency", xlabel="users", ylabel="ms", yscale="log", xticks=USERS
        )
        left.legend(fontsize=8)
        right.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        path = OUT / f"{workload}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def main() -> int:
    quick = os.environ.get("BENCH_QUICK", "") not in ("", "0")
    seconds = float(os.environ.get("BENCH_SECONDS", 4 if quick else 30))
    OUT.mkdir(parents=True, exist_ok=True)
    from models import contracts

    print(
        f"benchmark: {'quick, ' if quick else ''}{seconds:.0f} s a point, users {USERS}", flush=True
    )
    raw = {
        "fp32": raw_engine(contracts.ONNX_FP32, 1 if quick else 3),
        "int8": raw_engine(contracts.ONNX_INT8, 1 if quick else 3),
    }
    print(
        f"raw engine: {raw['fp32']['sentences_per_s']:.0f} sentences/s (fp32), {raw['int8']['sentences_per_s']:.0f} (int8)",
        flush=True,
    )
    points: list[Point] = []
    for system, server in servers().items():
        with server:
            for workload in WORKLOADS:
                for users in USERS:
                    runs = [(system, "")]
                    if system == STACK and users == MIDDLE:  # int8 on the same server, same load
                        runs.append((INT8, "onnx-int8"))
                    for name, backend in runs:
                        drain(server.url)
                        point = locust_point(server.url, name, workload, users, seconds, backend)
                        points.append(point)
                        print(
                            f"  {name:<20} {workload:<5} {users:>3} users: {point.sentences_per_s:7.1f} sentences/s, "
                            f"p50 {point.p50_ms:.0f} ms, p99 {point.p99_ms:.0f} ms, {point.failures} failures",
                            flush=True,
                        )
    rows = ratios(points, raw["fp32"]["sentences_per_s"])
    table = markdown(points, rows, raw)
    checks = targets(rows, points)
    meta = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.processor() or platform.platform()}",
        "python": sys.version.split()[0],
        "quick": quick,
        "seconds_per_point": seconds,
        "users": list(USERS),
        "middle_users": MIDDLE,
    }
    results = {"meta": meta, "raw": raw, "points": [asdict(p) for p in points], "ratios": rows,
               "targets": [{"target": t, "met": ok, "measured": m} for t, ok, m in checks]}  # fmt: skip
    (OUT / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (OUT / "results.md").write_text(table + "\n")
    plots = plot(points, raw["fp32"]["sentences_per_s"])
    print("\n" + table + "\n")
    for target, ok, measured in checks:
        print(f"{'met   ' if ok else 'MISSED'} {target}: {measured}")
    print(
        f"\nwritten: {OUT / 'results.json'}, {OUT / 'results.md'}, "
        + ", ".join(str(p) for p in plots)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
