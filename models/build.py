"""Build every model of the catalogue into the BentoML model store (``make models``).

    python -m models.build [--catalogue PATH] [--force] [--only NAME,...]

The catalogue (``models/catalogue.yaml``; ``--catalogue``, ``BUNDLE_CATALOGUE``) is checked whole
before anything is built: every entry's fields, its checkpoint's files, its architecture against
its backends, its task against its head. A bad entry stops the build with one line naming the
entry and the field. Then, for each model: its tokenizer and one entry per backend it lists (ONNX
fp32, int8 behind its accuracy gate, a TensorFlow SavedModel), each behind the parity gate against
PyTorch; then the project's SentencePiece model (tenants' whole models read it).

Each entry is content-addressed (models/store.py): a second run with the same inputs reuses what is
stored and takes seconds; ``--force`` (``make models FORCE=1``) rebuilds. Every stored model records
its source hash, export settings, parity figures and spec in its metadata.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from models import checkpoints, recipes, source, store
from models.checks import BuildError
from serving import catalogue
from serving.catalogue import CatalogueError, Entry
from serving.internals import bentoml_home

log = recipes.log
PROJECT = "sentencepiece"  # the project's own model, beside the catalogue's


def check(entries: list[Entry], base: Path) -> dict[str, source.Source]:
    """Every entry's checkpoint found and fit for what the entry asks, before anything is built
    (a hub id is fetched here, and a demo trained, behind its gate, if it is not already)."""
    found: dict[str, source.Source] = {}
    for entry in entries:
        try:
            src = source.resolve(entry, base)
            checkpoints.check(entry, checkpoints.read(src.path))
        except source.SourceError as exc:
            raise source.SourceError(f"models ({entry.name}): {exc}") from None
        found[entry.name] = src
    return found


def build_model(entry: Entry, src: source.Source, force: bool) -> None:
    made = recipes.ModelRecipes(entry, src)
    steps: list[tuple[str, object]] = [("tokenizer", made.tokenizer)]
    if "onnx" in entry.backends or "onnx-int8" in entry.backends:
        steps.append(("onnx", made.onnx))
    if "onnx-int8" in entry.backends:
        steps.append(("onnx-int8", lambda: made.onnx_int8(made.onnx())))
    if "tf" in entry.backends:
        steps.append(("tf", made.tf))
    for index, (name, make) in enumerate(steps, 1):
        artefact = make()  # type: ignore[operator]
        prefix = f"  [{index}/{len(steps)}] {name:<10}"
        if force or store.existing(artefact.tag) is None:
            log(f"{prefix} {artefact.tag} building …")
        model, seconds = store.ensure(artefact, force=force)
        log(f"{prefix} {model.tag} {'reused' if seconds is None else f'built in {seconds:.1f} s'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m models.build", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--catalogue",
        type=Path,
        default=catalogue.path(),
        help=f"the catalogue to build (default: ${catalogue.ENV} or models/catalogue.yaml)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        default=bool(os.environ.get("FORCE")),
        help="rebuild even when the store holds a model with the same inputs",
    )
    parser.add_argument(
        "--only", help=f"comma-separated: catalogue model names, and {PROJECT} for the project's"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        cat = catalogue.load(args.catalogue)
        only = {n.strip() for n in args.only.split(",") if n.strip()} if args.only else None
        if only is not None and (unknown := only - {m.name for m in cat.models} - {PROJECT}):
            parser.error(f"--only: {sorted(unknown)} not in {args.catalogue} (nor {PROJECT})")
        chosen = [m for m in cat.models if only is None or m.name in only]
        sources = check(chosen, args.catalogue.parent)
        log(f"catalogue {args.catalogue}: {len(cat.models)} models; model store {bentoml_home()}")
        for entry in chosen:
            src = sources[entry.name]
            log(f"{entry.name} ({entry.task}, {', '.join(entry.backends)}) from {src.origin}")
            build_model(entry, src, args.force)
        if only is None or PROJECT in only:
            artefact = recipes.sentencepiece()
            model, seconds = store.ensure(artefact, force=args.force)
            state = "reused" if seconds is None else f"built in {seconds:.1f} s"
            log(f"{PROJECT} (the tenants' tokenizer) {model.tag} {state}")
    except (CatalogueError, source.SourceError, checkpoints.CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    log(f"models ready in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
