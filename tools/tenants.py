"""Tenant registry from the command line (the same operations as the HTTP API, on the store directly).

    python -m tools.tenants list
    python -m tools.tenants show NAME
    python -m tools.tenants train NAME --examples examples.json [--format head|onnx|tf]
    python -m tools.tenants upload NAME model.tar.gz
    python -m tools.tenants export NAME model.tar.gz
    python -m tools.tenants delete NAME
    python -m tools.tenants demo --count 10000         # make tenants N=10000 (head tenants)
    python -m tools.tenants demo --count 300 --format mixed   # whole models: ONNX, every 4th TF

examples.json: [{"text": "where is my order", "intent": "order_status"}, ...]
The store is BUNDLE_TENANTS_STORE (default $BENTOML_HOME/tenants) or --store.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from functools import cache
from pathlib import Path

from models import demo_tenants
from runners.tenants import registry
from runners.tenants.settings import TenantRunnerSettings
from runners.tenants.store import TenantStore, read_manifest
from serving.errors import ApiError


@cache
def _encode() -> Callable[[Sequence[str]], list[list[int]]]:
    """The SentencePiece model from the model store (what the tokenizer service encodes with)."""
    import sentencepiece

    from models import store
    from serving import contracts

    processor = sentencepiece.SentencePieceProcessor(
        model_file=str(store.path_of(contracts.SENTENCEPIECE) / "spiece.model")
    )
    return lambda texts: processor.encode(list(texts))


def _build_demo_tenant(root: str, index: int, epochs: int) -> str:
    """Train and publish one demo tenant (runs in a worker process)."""
    spec = demo_tenants.tenant(index)
    registry.train(
        TenantStore(Path(root)), spec.name, _encode()([t for t, _ in spec.train]), [i for _, i in spec.train],
        fmt=spec.fmt, dim=spec.dim, epochs=epochs, seed=index, source="demo", extra_metrics={"demo_seed": float(index)},
    )  # fmt: skip
    return spec.name


def _demo_todo(store: TenantStore, count: int, fmt: str, force: bool) -> list[int]:
    """Demo tenants 1..count not yet built from the same seed in the wanted format."""
    todo = []
    for index in range(1, count + 1):
        spec = demo_tenants.tenant(index)
        wanted = "head" if fmt == "head" else spec.fmt
        found = store.current(spec.name)
        manifest = read_manifest(found[1]) if found else None
        if (
            force
            or not manifest
            or manifest.metrics.get("demo_seed") != index
            or manifest.format != wanted
        ):
            todo.append(index)
    return todo


def _progress(log, started: float, done: int, total: int) -> None:
    if done % 250 == 0 or done == total:
        rate = done / (time.perf_counter() - started)
        log(
            f"[{done}/{total}] built, {rate:.1f} tenants/s, about {(total - done) / rate:.0f} s left"
        )


def build_demo(
    store: TenantStore,
    count: int,
    *,
    epochs: int,
    fmt: str = "head",
    jobs: int = 2,
    force: bool = False,
    log=print,
) -> None:
    """Build demo tenants 1..count, as heads or (mixed) whole ONNX/TF models; ones already built
    from the same seed in that format are kept (unless force)."""
    started = time.perf_counter()
    todo = _demo_todo(store, count, fmt, force)
    log(f"{count - len(todo)} of {count} demo tenants already built; building {len(todo)} ({fmt})")
    if fmt == "head":
        # In this process: every distinct example text embedded once (a few thousand for any
        # count), then milliseconds of training per tenant.
        from models.encoder import Embedder

        embed = Embedder()
        for done, index in enumerate(todo, 1):
            spec = demo_tenants.tenant(index)
            registry.train_head(
                store, spec.name, embed([t for t, _ in spec.train]), [i for _, i in spec.train],
                encoder=embed.name, source="demo", extra_metrics={"demo_seed": float(index)},
            )  # fmt: skip
            _progress(log, started, done, len(todo))
        return
    # spawn, not fork: TensorFlow's threads do not survive a fork.
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [
            pool.submit(_build_demo_tenant, str(store.root), index, epochs) for index in todo
        ]
        for done, future in enumerate(as_completed(futures), 1):
            future.result()
            _progress(log, started, done, len(todo))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.tenants", description="Tenant model registry."
    )
    parser.add_argument("--store", type=Path, help="tenant store directory")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list")
    for name in ("show", "delete"):
        sub.add_parser(name).add_argument("tenant")
    train = sub.add_parser("train")
    train.add_argument("tenant")
    train.add_argument("--examples", type=Path, required=True)
    train.add_argument("--format", choices=["head", "onnx", "tf"], default="head")
    train.add_argument(
        "--encoder", help="head: the catalogue model whose vectors it reads (default: the first)"
    )
    for name in ("upload", "export"):
        p = sub.add_parser(name)
        p.add_argument("tenant")
        p.add_argument("archive", type=Path)
    d = sub.add_parser("demo")
    d.add_argument("--count", type=int, default=1000)
    d.add_argument("--force", action="store_true")
    d.add_argument("--format", choices=["head", "mixed"], default="head",
                   help="head tenants, or whole models (ONNX, every fourth TF)")  # fmt: skip
    d.add_argument(
        "--jobs", type=int, default=2, help="processes training whole models in parallel"
    )
    args = parser.parse_args(argv)

    settings = TenantRunnerSettings(**({"store": args.store} if args.store else {}))
    store = TenantStore(settings.store, keep_versions=settings.keep_versions)
    try:
        if args.command == "list":
            print("\n".join(store.names()))
        elif args.command == "show":
            print(store.show(args.tenant).model_dump_json(indent=2))
        elif args.command == "delete":
            store.delete(args.tenant)
            print(f"deleted {args.tenant}")
        elif args.command == "export":
            print(store.archive(args.tenant, args.archive))
        elif args.command == "upload":
            published = registry.upload(store, args.tenant, args.archive, settings.max_upload_bytes)
            print(published.model_dump_json())
        elif args.command == "train":
            examples = json.loads(args.examples.read_text())
            if args.format == "head":
                from models.encoder import Embedder

                texts, intents = [e["text"] for e in examples], [e["intent"] for e in examples]
                embed = Embedder(args.encoder)
                published = registry.train_head(
                    store, args.tenant, embed(texts), intents, encoder=embed.name
                )
                print(published.model_dump_json())
                return 0
            published = registry.train(
                store, args.tenant, _encode()([e["text"] for e in examples]), [e["intent"] for e in examples],
                fmt=args.format, dim=settings.train_dim, epochs=settings.train_epochs,
            )  # fmt: skip
            print(published.model_dump_json())
        elif args.command == "demo":
            print(f"demo tenants into {store.root}", flush=True)
            build_demo(
                store,
                args.count,
                epochs=settings.train_epochs,
                fmt=args.format,
                jobs=args.jobs,
                force=args.force,
                log=lambda m: print(m, flush=True),
            )
    except ApiError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
