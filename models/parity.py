"""The parity check as a report (``make parity``): every backend against PyTorch.

On a fixed set of STS-style sentence pairs, every backend's cosine similarity is compared with the
PyTorch reference: how many pairs flip their 0/1 label at a threshold, and the max/min/mean/std of
the absolute difference. The backends are the engines the runners serve with (serving/engines)
over the stored models, so what is checked is what is served. Writes build/parity.json; exits
non-zero when a gate fails.

    python -m models.parity [--threshold 0.5] [--pairs 600] [--out build/parity.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from models import corpus, source, store
from serving import contracts
from serving.features import Feeds, cosine, load_tokenizer, pad, tokenize

FP32_MAX_DIFF = 1e-5
INT8_MAX_MISMATCH_RATE = 0.01


def backends(threads: int = 2) -> dict[str, Callable[[Feeds], np.ndarray]]:
    from models import torch_reference
    from serving.engines.onnx import OnnxEngine
    from serving.engines.tf import TFEngine

    contract = contracts.SENTENCE_EMBEDDING
    reference = torch_reference.load(source.resolve().path)
    onnx = {
        name: OnnxEngine(
            store.path_of(model) / "model.onnx",
            contract,
            threads=threads,
            providers=["CPUExecutionProvider"],
            name=model,
        )
        for name, model in (
            ("onnx", contracts.ONNX_FP32),
            ("onnx-opt", contracts.ONNX_OPTIMISED),
            ("onnx-int8", contracts.ONNX_INT8),
        )
    }
    tf = TFEngine(store.path_of(contracts.TF_SAVEDMODEL) / "saved_model", contract, threads=threads)
    return {"torch": lambda feeds: torch_reference.embed(reference, feeds), **onnx, "tf": tf}


def similarities(
    embed: Callable[[Feeds], np.ndarray], ids: list[list[int]], pairs: list[tuple[int, int]]
) -> np.ndarray:
    # Unsorted batches of 32: every batch mixes lengths, so padding leaking into an embedding shows.
    vectors = np.concatenate([embed(pad(ids[i : i + 32])) for i in range(0, len(ids), 32)])
    return cosine(vectors[[p[0] for p in pairs]], vectors[[p[1] for p in pairs]])


def report(threshold: float = 0.5, count: int = 600) -> tuple[dict[str, dict], dict[str, float]]:
    pairs = corpus.sentence_pairs(count)
    texts = sorted({t for pair in pairs for t in pair})
    index = {t: i for i, t in enumerate(texts)}
    tokenizer = load_tokenizer(store.path_of(contracts.TOKENIZER) / "tokenizer.json")
    ids = tokenize(tokenizer, texts)
    pair_ids = [(index[a], index[b]) for a, b in pairs]
    scores = {name: similarities(embed, ids, pair_ids) for name, embed in backends().items()}
    reference = scores.pop("torch")
    results = {}
    for name, got in scores.items():
        diff = np.abs(got - reference)
        results[name] = {
            "mismatches": int(np.sum((got >= threshold) != (reference >= threshold))),
            "pairs": len(pairs),
            "max_diff": float(diff.max()),
            "min_diff": float(diff.min()),
            "mean_diff": float(diff.mean()),
            "std_diff": float(diff.std()),
        }
    spread = {
        "threshold": threshold,
        "reference_min": float(reference.min()),
        "reference_max": float(reference.max()),
        "near_threshold": int(np.sum(np.abs(reference - threshold) < 0.05)),
    }
    return results, spread


def gate_failures(results: dict[str, dict]) -> list[str]:
    failures = []
    for name, r in results.items():
        if name == "onnx-int8":
            if r["mismatches"] > INT8_MAX_MISMATCH_RATE * r["pairs"]:
                failures.append(
                    f"{name}: {r['mismatches']} mismatches > {INT8_MAX_MISMATCH_RATE:.0%} of {r['pairs']} pairs"
                )
        elif r["mismatches"] or r["max_diff"] > FP32_MAX_DIFF:
            failures.append(
                f"{name}: {r['mismatches']} mismatches, max diff {r['max_diff']:.2e} (fp32 needs 0 and <= {FP32_MAX_DIFF:g})"
            )
    return failures


def markdown(results: dict[str, dict]) -> str:
    lines = [
        "| backend | 0/1 mismatches | pairs | max diff | min diff | mean diff | std diff |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['mismatches']} | {r['pairs']} | {r['max_diff']:.2e} | {r['min_diff']:.2e} | {r['mean_diff']:.2e} | {r['std_diff']:.2e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m models.parity", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--threshold", type=float, default=0.5, help="cosine at which a pair counts as similar (1)"
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=600,
        help="how many sentence pairs (at least 500 for the report)",
    )
    parser.add_argument("--out", type=Path, default=Path("build/parity.json"))
    args = parser.parse_args(argv)
    results, spread = report(args.threshold, args.pairs)
    print(
        f"Parity against PyTorch on {args.pairs} sentence pairs, threshold {spread['threshold']} "
        f"(reference cosines {spread['reference_min']:.2f}..{spread['reference_max']:.2f}, "
        f"{spread['near_threshold']} pairs within 0.05 of the threshold)\n"
    )
    print(markdown(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwritten to {args.out}")
    failures = gate_failures(results)
    for failure in failures:
        print(f"gate failed: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
