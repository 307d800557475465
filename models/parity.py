"""The parity report (``make parity``): every backend of every catalogue model against PyTorch.

The backends are the engines the runners serve with (serving/engines) over the stored models, so
what is checked is what is served; the gate is the one ``make models`` applies (models/checks.py):
on at least 500 inputs, fp32 backends 0 flipped and a max |difference| of at most 1e-5 (a rerank
or classify model's relative to its largest logit where that is over 1, as are its figures here),
int8 at most 1 % flipped. Writes build/parity.json; exits 1 when a gate fails.

    python -m models.parity [--catalogue PATH] [--out build/parity.json] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from models import source, store
from models.checks import Checks, parity_failure
from serving import catalogue
from serving.catalogue import Entry
from serving.features import Feeds
from serving.served import spec_of

Run = Callable[[Feeds], np.ndarray]


def engines(entry: Entry, threads: int = 2) -> dict[str, Run]:
    """The served engines of ``entry``'s backends, over its store entries."""
    from serving.engines.onnx import OnnxEngine
    from serving.engines.tf import TFEngine

    out: dict[str, Run] = {}
    for backend in entry.backends:
        ref = store.latest(entry.store_name(backend))
        spec = spec_of(ref)
        if backend == "tf":
            out[backend] = TFEngine(
                Path(ref.path_of("saved_model")), spec.contract(), threads=threads
            )
        else:
            path = Path(ref.path_of("model.onnx"))
            providers = ["CPUExecutionProvider"]
            out[backend] = OnnxEngine(path, spec.contract(), threads=threads, providers=providers)
    return out


def report(entry: Entry, base: Path, threads: int = 2) -> dict[str, dict[str, float]]:
    spec = spec_of(store.latest(entry.store_name("tokenizer")))
    checks = Checks(source.resolve(entry, base), spec)
    return {backend: checks.parity(run) for backend, run in engines(entry, threads).items()}


def markdown(name: str, results: dict[str, dict[str, float]]) -> str:
    lines = [
        f"**{name}**",
        "",
        "| backend | flipped | inputs | threshold | max diff | mean diff | std diff |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for backend, r in results.items():
        lines.append(
            f"| {backend} | {r['mismatches']} | {r['inputs']} | {r['threshold']:.3f} | "
            f"{r['max_diff']:.2e} | {r['mean_diff']:.2e} | {r['std_diff']:.2e} |"
        )
    return "\n".join(lines)


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1 (ONNX Runtime reads 0 threads as "every
    core", which is not what a parity run at a lane's width means)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m models.parity", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--catalogue", type=Path, default=catalogue.path())
    parser.add_argument("--out", type=Path, default=Path("build/parity.json"))
    parser.add_argument(
        "--threads",
        type=positive,
        default=2,
        help="each engine's threads (the runners' lanes run one-thread sessions)",
    )
    args = parser.parse_args(argv)
    cat = catalogue.load(args.catalogue)
    results: dict[str, dict[str, dict[str, float]]] = {}
    failures: list[str] = []
    for entry in cat.models:
        store.latest(entry.store_name("tokenizer"))  # a clear error if it was never built
        results[entry.name] = report(entry, args.catalogue.parent, args.threads)
        print(markdown(entry.name, results[entry.name]) + "\n")
        for backend, figures in results[entry.name].items():
            if failure := parity_failure(backend, figures):
                failures.append(f"{entry.name}: {failure}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {args.out}")
    for failure in failures:
        print(f"gate failed: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
