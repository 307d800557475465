"""The profile's sampling arithmetic: a py-spy stack goes under the first category its frames
match, leaf first (a call into an extension at the Python line that made it), and samples are
split between the main thread and the others by thread id."""

from __future__ import annotations

from collections import Counter

from loadtests.profile import ASYNC, OTHER, categorize, markdown, parse, split
from loadtests.profile import LOOP as IN_UVLOOP

LOOP = "run (asyncio/runners.py:118);run_until_complete (asyncio/base_events.py:640)"


def frames(text: str) -> list[str]:
    return text.split(";")


def test_the_leaf_most_matching_frame_names_the_category() -> None:
    dumps = f"{LOOP};respond (serving/hot_path.py:80);dumps (json/__init__.py:231)"
    assert categorize(frames(dumps)) == "JSON"  # our route called it: the JSON's time
    route = "the lean route (serving/hot_path.py, replies.py)"
    assert categorize(frames(f"{LOOP};respond (serving/hot_path.py:80)")) == route
    assert (
        categorize(frames(f"{LOOP};plan (serving/batching/grouping.py:9)"))
        == "batching (serving/batching)"
    )
    assert categorize(frames(f"{LOOP};serialize_value (_bentoml_impl/serde.py:3)")) == (
        "ASGI app, BentoML's machinery"
    )
    assert categorize(frames(LOOP)) == IN_UVLOOP  # the loop's entry is the leaf: uvloop's C
    assert categorize(frames(f"{LOOP};_copy_future_state (asyncio/futures.py:3)")) == ASYNC
    orjson = f"{LOOP};respond (serving/hot_path.py:80);dumps (serving/replies.py:12)"
    assert categorize(frames(orjson)) == "JSON"
    http = f"{LOOP};data_received (uvicorn/protocols/http/httptools_impl.py:120)"
    assert categorize(frames(http)) == "HTTP (uvicorn)"
    hop = f"{LOOP};data_received (services/tokenizer/hop.py:60)"  # the tokenizer's runner calls
    assert categorize(frames(hop)) == "HTTP client (the hop to the runner)"
    assert categorize(frames("<module> (<string>:4)")) == OTHER


def test_a_call_into_an_extension_counts_as_the_extension() -> None:
    rust = f"{LOOP};embed (services/tokenizer/service.py:200);tokenize (serving/features.py:40)"
    assert categorize(frames(rust)) == "tokenizing (tokenizers, Rust)"
    lane = "_bootstrap (threading.py:1002);run (serving/lanes.py:50);run (onnxruntime/capi/onnxruntime_inference_collection.py:220)"
    assert categorize(frames(lane)) == "engine (ONNX Runtime)"
    # a lane thread between calls: waiting in SimpleQueue.get, or handing a result to the loop
    idle = "_bootstrap (threading.py:1002);run (threading.py:975);_serve (serving/batching/batcher.py:130)"
    assert categorize(frames(idle)) == ASYNC
    compute = f"{idle};_compute (serving/batching/batcher.py:330)"  # the call's own checks
    assert categorize(frames(compute)) == "batching (serving/batching)"


def test_samples_are_split_by_thread_and_counted() -> None:
    raw = "\n".join(
        [
            f"thread (100): MainThread;{LOOP} 30",
            f"thread (100): MainThread;{LOOP};dumps (json/__init__.py:231) 10",
            "thread (0x7f01): lane-0;run (onnxruntime/capi/session.py:220) 50",
            "thread (0x64): MainThread;dumps (json/__init__.py:231) 5",  # 0x64 == 100
            "thread (101): lane-1;run (onnxruntime/capi/session.py:220) 20",
            "a line that is not a sample",
        ]
    )
    counted = parse(raw, pid=100)
    assert counted["main"] == {IN_UVLOOP: 30, "JSON": 15}
    assert counted["other_threads"] == {"engine (ONNX Runtime)": 70}


def test_proc_cpu_is_split_in_the_samples_proportions() -> None:
    proc = {"main_ms": 0.4, "other_threads_ms": 0.0, "total_ms": 0.4}
    samples = {"main": Counter({"HTTP (uvicorn)": 30, "JSON": 10}), "other_threads": Counter()}
    # 40 samples though the process had less CPU: the samples give the shares, /proc the amounts
    assert split(proc, samples) == {
        "main": {"HTTP (uvicorn)": 0.3, "JSON": 0.1},
        "other_threads": {},
    }


def record(processes: dict, **more: object) -> dict:
    """A recorded profile as ``markdown`` reads it: 64 users, 30 s, 9,000 requests at 300 a second
    sampled at 250 Hz; ``more``: further fields of the run (its floor)."""
    return {
        "meta": {"date": "2026-11-27T12:00:00+00:00", "machine": "x86_64, 2 cores", "commit": "abc1234"},
        "profile": {
            "users": 64, "seconds": 30, "rate_hz": 250, "requests": 9000, "failed": 0,
            "requests_per_s": 300.0, "processes": processes, **more,
        },
    }  # fmt: skip


def tokenizer_at(main_ms: float, other_ms: float = 0.0, **main: float) -> dict:
    """The tokenizer's figures: /proc's CPU, its main thread's split by category."""
    return {
        "from_proc": {"main_ms": main_ms, "other_threads_ms": other_ms, "total_ms": main_ms + other_ms},
        "main": main,
        "other_threads": {},
        "samples": {"main": 4000, "other_threads": 0},
    }  # fmt: skip


def test_the_figures_are_proc_cpu_by_category() -> None:
    parts = {"HTTP (uvicorn)": 0.3, "JSON": 0.1}
    text = markdown(record({"tokenizer": tokenizer_at(0.4, **parts)}))
    assert "| tokenizer | main | HTTP (uvicorn) | 0.300 | 75% |" in text
    assert "| tokenizer | main | **all** (4,000 samples) | **0.400** | |" in text
    assert "300 requests/s answered, 0 failed or shed" in text


def runner_at(main_ms: float, **more: float) -> dict:
    """The ONNX runner's figures: 675 main-thread samples, 6 ms a request in the engine;
    ``more``: further fields."""
    return {
        "from_proc": {"main_ms": main_ms, "other_threads_ms": 6.0, "total_ms": main_ms + 6.0},
        "main": {"HTTP (uvicorn)": main_ms},
        "other_threads": {"engine (ONNX Runtime)": 6.0},
        "samples": {"main": 675, "other_threads": 9000},
        **more,
    }
