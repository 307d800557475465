"""Tenant registry from the command line (the same operations as the HTTP API, on the store directly).

    python -m runners.tenants list
    python -m runners.tenants show NAME
    python -m runners.tenants train NAME --examples examples.json [--format onnx|tf]
    python -m runners.tenants upload NAME model.tar.gz
    python -m runners.tenants export NAME model.tar.gz
    python -m runners.tenants delete NAME
    python -m runners.tenants demo --count 1000          # make tenants N=1000

examples.json: [{"text": "where is my order", "intent": "order_status"}, ...]
The store is BUNDLE_TENANTS_STORE (default $BENTOML_HOME/tenants) or --store.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from runners.errors import ApiError


def _encoder():
    import sentencepiece

    from models import contracts, store

    processor = sentencepiece.SentencePieceProcessor(
        model_file=str(store.path_of(contracts.SENTENCEPIECE) / "spiece.model")
    )
    return processor.encode, processor.get_piece_size()


def main(argv: list[str] | None = None) -> int:
    from runners.tenants import demo, registry
    from runners.tenants.settings import TenantRunnerSettings
    from runners.tenants.store import TenantStore

    parser = argparse.ArgumentParser(
        prog="python -m runners.tenants", description="Tenant model registry."
    )
    parser.add_argument("--store", type=Path, help="tenant store directory")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list")
    for name in ("show", "delete"):
        sub.add_parser(name).add_argument("tenant")
    train = sub.add_parser("train")
    train.add_argument("tenant")
    train.add_argument("--examples", type=Path, required=True)
    train.add_argument("--format", choices=["onnx", "tf"], default="onnx")
    for name in ("upload", "export"):
        p = sub.add_parser(name)
        p.add_argument("tenant")
        p.add_argument("archive", type=Path)
    d = sub.add_parser("demo")
    d.add_argument("--count", type=int, default=1000)
    d.add_argument("--force", action="store_true")
    d.add_argument("--jobs", type=int, default=2, help="processes training in parallel")
    args = parser.parse_args(argv)

    settings = TenantRunnerSettings(**({"store": args.store} if args.store else {}))
    store = TenantStore(settings.store, keep_versions=settings.keep_versions)
    try:
        if args.command == "list":
            print("\n".join(store.names()))
        elif args.command == "show":
            print(json.dumps(store.show(args.tenant), indent=2))
        elif args.command == "delete":
            store.delete(args.tenant)
            print(f"deleted {args.tenant}")
        elif args.command == "export":
            print(store.archive(args.tenant, args.archive))
        elif args.command == "upload":
            print(
                json.dumps(
                    vars(
                        registry.upload(store, args.tenant, args.archive, settings.max_upload_bytes)
                    )
                )
            )
        elif args.command == "train":
            examples = json.loads(args.examples.read_text())
            encode, vocab = _encoder()
            published = registry.train(
                store, args.tenant, encode([e["text"] for e in examples]), [e["intent"] for e in examples],
                vocab=vocab, fmt=args.format, dim=settings.train_dim, epochs=settings.train_epochs,
            )  # fmt: skip
            print(json.dumps(vars(published)))
        elif args.command == "demo":
            _, vocab = _encoder()
            print(f"demo tenants into {store.root}", flush=True)
            demo.build(
                store,
                args.count,
                vocab,
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
