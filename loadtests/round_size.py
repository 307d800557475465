"""What the engine serves when its calls are cut from ``k`` sentences at a time (no HTTP, one process).

A server sorts and groups only the sentences waiting when a lane frees: at 64 one-sentence users
that is a few dozen at most, never the whole corpus that the raw limit (``raw_engine.py``) sorts
at once. This measures what that costs: texts drawn at random (with replacement) from the
load-test corpus, cut into rounds of ``k``, each round planned on its own with the ONNX runner's
planner and default policy (``serving.batching.plan``) and run on a one-thread session, as many
calls at once as there are cores (the runner's lanes). It models a server that sees ``k`` rows
each time it plans; the runner's batcher carries rows it holds into its next plan, so what it
sees is what waits there. The last row, "all", plans every drawn text at once, as raw does.
Round sizes interleaved; medians of the repeats, each on a fresh draw.

``--call-cost`` measures instead the two parts of an engine call that the planner's
``call_overhead_tokens`` weighs against each other: the lane session's CPU a call (its thread's,
medians of 7, one lane running alone) over shapes of up to 256 padded tokens (the size of chat's
calls, not of bulk's), fitted as a fixed part a call plus a part a padded token; their quotient
is the fixed part in padded tokens. The engine call only: the runner's own CPU around each call
(its event loop, the lane's padding and hand-offs) is not in it, and is one more reason for
fewer calls.

    python -m loadtests.round_size [--model minilm-onnx] [--rounds 4,8,17,32,64] [--repeats 3]
    python -m loadtests.round_size --call-cost [--model minilm-onnx]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from serving.batching import Policy
from serving.batching.grouping import efficiency, plan


def round_calls(
    texts: list[list[int]], size: int, policy: Policy
) -> tuple[list[list[list[int]]], float]:
    """The engine calls the runner's planner cuts from ``texts`` taken ``size`` at a time, in
    order, each round planned on its own (no call mixes two rounds), and their real tokens over
    padded tokens."""
    batches, groups, lengths = [], [], []
    for start in range(0, len(texts), size):
        round_ = texts[start : start + size]
        cut = plan(
            [len(t) for t in round_],
            policy.max_batch_tokens,
            policy.max_batch_rows,
            policy.call_overhead_tokens,
        )
        batches += [[round_[k] for k in g.indices] for g in cut]
        groups += cut
        lengths += [len(t) for t in round_]
    return batches, efficiency(lengths, groups)


def call_cost(
    engine: Callable[[Any], Any], pad: Callable[[list[list[int]]], Any]
) -> tuple[float, float]:
    """(seconds a call, seconds a padded token): a least-squares line through the engine's thread
    CPU a call at each shape of up to 256 padded tokens (medians of 7 calls, after one to warm the
    shape up)."""
    tokens, seconds = [], []
    for width in (8, 16, 32):
        for rows in [r for r in (1, 2, 4, 8, 16, 32) if r * width <= 256]:
            feeds = pad([[101] + [1000] * (width - 2) + [102]] * rows)
            engine(feeds)
            times = []
            for _ in range(7):
                started = time.thread_time()
                engine(feeds)
                times.append(time.thread_time() - started)
            tokens.append(rows * width)
            seconds.append(statistics.median(times))
    per_token, per_call = statistics.linear_regression(tokens, seconds)
    return per_call, per_token


def main() -> None:
    from models import corpus, store
    from runners.onnx.settings import OnnxRunnerSettings
    from serving import contracts
    from serving.engines.onnx import OnnxEngine
    from serving.features import load_tokenizer, pad, tokenize

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=contracts.ONNX_FP32)
    parser.add_argument("--rounds", default="4,8,17,32,64", help="round sizes, comma-separated")
    parser.add_argument("--texts", type=int, default=2000, help="texts drawn per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--call-cost",
        action="store_true",
        help="fit the engine's CPU a call as a fixed part + a part a padded token, and print it "
        "(the other options do not apply)",
    )
    args = parser.parse_args()

    policy = OnnxRunnerSettings().policy
    cores = os.cpu_count() or 2
    lane = OnnxEngine(
        store.path_of(args.model) / "model.onnx",
        contracts.SENTENCE_EMBEDDING,
        threads=1,
        providers=["CPUExecutionProvider"],
    )
    if args.call_cost:
        per_call, per_token = call_cost(lane, pad)
        print(
            f"{args.model}, a one-thread lane: {per_call * 1e3:.2f} ms a call + "
            f"{per_token * 1e6:.1f} us a padded token = {per_call / per_token:.1f} padded tokens "
            f"a call, the engine alone (the planner's weight: {policy.call_overhead_tokens})"
        )
        return
    tokenizer = load_tokenizer(store.path_of(contracts.TOKENIZER) / "tokenizer.json")
    ids = tokenize(tokenizer, corpus.load_texts())
    lane(pad(ids[:32]))  # warm-up: allocations, kernel choice
    draw = random.Random(0)
    lanes = ThreadPoolExecutor(max_workers=cores)

    sizes = [int(n) for n in args.rounds.split(",")] + [args.texts]
    rates: dict[int, list[float]] = {n: [] for n in sizes}
    shapes: dict[int, list[tuple[float, float]]] = {n: [] for n in sizes}
    for _ in range(args.repeats):
        for size in sizes:
            texts = [ids[draw.randrange(len(ids))] for _ in range(args.texts)]
            batches, padding = round_calls(texts, size, policy)
            started = time.perf_counter()
            list(lanes.map(lambda batch: lane(pad(batch)), batches))
            rates[size].append(args.texts / (time.perf_counter() - started))
            shapes[size].append((padding, args.texts / len(batches)))
    lanes.shutdown()
    best = statistics.median(rates[args.texts])
    print(
        f"{args.model}, {cores} one-thread lanes, {args.texts} corpus texts, medians of {args.repeats}"
    )
    print("| round | sentences/s | of all at once | real/padded tokens | rows a call |")
    print("|---|---:|---:|---:|---:|")
    for size in sizes:
        rate = statistics.median(rates[size])
        padding = statistics.median(p for p, _ in shapes[size])
        rows = statistics.median(r for _, r in shapes[size])
        name = "all" if size == args.texts else str(size)
        print(f"| {name} | {rate:.0f} | {rate / best:.2f} | {padding:.3f} | {rows:.1f} |")


if __name__ == "__main__":
    main()
