"""How each model in the store is made: one recipe per artefact, each an ``Artefact`` whose inputs
(source hash, settings, the code that builds it, library versions) fingerprint its version."""

from __future__ import annotations

import shutil
from importlib.metadata import version
from pathlib import Path
from typing import Any

from models import corpus, source, store
from models.checks import INT8_GATE, BuildError, Checks
from serving import contracts
from serving.features import load_tokenizer, tokenize

# Runtime code every MiniLM artefact depends on: the contract it is checked against, the feeds.
SHARED_CODE = ("serving/contracts.py", "serving/features.py")


def log(message: str) -> None:
    print(message, flush=True)


def _versions(*packages: str) -> dict[str, str]:
    return {name: version(name) for name in packages}


class Recipes:
    def __init__(self, checks: Checks) -> None:
        self.checks = checks
        self.src = checks.src

    def common_inputs(self, *code: str, packages: tuple[str, ...] = ()) -> dict[str, Any]:
        return {
            "source_sha256": self.src.sha256,
            "max_seq_len": self.src.max_seq_len,
            "code": store.code_hash(*SHARED_CODE, *code),
            "versions": _versions("numpy", "tokenizers", *packages),
        }

    def tokenizer(self) -> store.Artefact:
        def build(out: Path) -> dict[str, Any]:
            self.checks.tokenizer().save(str(out / "tokenizer.json"))
            for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
                if (self.src.path / name).exists():
                    shutil.copy(self.src.path / name, out / name)
            # Proof the padding fix changes nothing but padding: ids equal transformers' own.
            from transformers import AutoTokenizer

            texts = self.checks.texts
            reference = AutoTokenizer.from_pretrained(str(self.src.path))
            want = reference(texts, truncation=True, max_length=self.src.max_seq_len)["input_ids"]
            got = tokenize(load_tokenizer(out / "tokenizer.json", self.src.max_seq_len), texts)
            mismatches = sum(a != b for a, b in zip(got, want, strict=True))
            if mismatches:
                raise BuildError(
                    f"fixed tokenizer differs from transformers' on {mismatches} texts"
                )
            if (vocab := self.checks.tokenizer().get_vocab_size()) != contracts.MINILM_VOCAB:
                raise BuildError(
                    f"tokenizer has {vocab} pieces, the contract {contracts.MINILM_VOCAB}"
                )
            return {
                "source_sha256": self.src.sha256,
                "max_seq_len": self.src.max_seq_len,
                "padding": "none (fixed-128 padding of the source tokenizer.json removed)",
                "parity": {"texts": len(want), "mismatches_vs_transformers": mismatches},
            }

        return store.Artefact(
            contracts.TOKENIZER,
            self.common_inputs("models/recipes.py", packages=("transformers",)),
            build,
            labels={"kind": "tokenizer"},
        )

    def onnx_fp32(self) -> store.Artefact:
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
                "parity": self.checks.agreement(lambda feeds: onnx_export.embed(sess, feeds)),
            }

        inputs = self.common_inputs(
            "models/onnx_export.py",
            "models/torch_reference.py",
            packages=("torch", "transformers", "onnx"),
        ) | {"opset": onnx_export.OPSET}
        return store.Artefact(
            contracts.ONNX_FP32, inputs, build, labels={"kind": "onnx", "precision": "fp32"}
        )

    def onnx_optimised(self, fp32: Path) -> store.Artefact:
        from models import onnx_export

        cfg = {"num_heads": 12, "hidden_size": contracts.EMBEDDING_DIM}

        def build(out: Path) -> dict[str, Any]:
            fused = onnx_export.optimise(fp32, out / "model.onnx", **cfg)
            sess = onnx_export.session(out / "model.onnx")
            speed = self.checks.speed(fp32, out / "model.onnx")
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
                "parity": self.checks.agreement(lambda feeds: onnx_export.embed(sess, feeds)),
            }

        inputs = self.common_inputs("models/onnx_export.py", packages=("onnxruntime",)) | {
            "upstream": str(store.latest(contracts.ONNX_FP32).tag),
            **cfg,
        }
        return store.Artefact(
            contracts.ONNX_OPTIMISED, inputs, build, labels={"kind": "onnx", "precision": "fp32"}
        )

    def onnx_int8(self, base: Path, base_tag: str) -> store.Artefact:
        from models import onnx_export

        calibration = corpus.calibration_sentences(onnx_export.SMOOTHING["calibration_sentences"])

        def build(out: Path) -> dict[str, Any]:
            quantised = onnx_export.quantise(
                base, out / "model.onnx", self.checks.in_batches(calibration)
            )
            fp32 = onnx_export.session(base)
            int8 = onnx_export.session(out / "model.onnx")
            figures = self.checks.int8_gate(
                lambda feeds: onnx_export.embed(fp32, feeds),
                lambda feeds: onnx_export.embed(int8, feeds),
            )
            speed = self.checks.speed(base, out / "model.onnx")
            log(f"      int8 vs fp32: {speed['speedup']:.2f}x")
            return {
                "source_sha256": self.src.sha256,
                "export": {
                    "quantisation": "onnxruntime.quantization.quantize_dynamic",
                    **onnx_export.QUANTISATION,
                    "smoothing": "SmoothQuant (models/smoothing.py)",
                    **onnx_export.SMOOTHING,
                    **quantised,
                    "base": base_tag,
                },
                "gate": INT8_GATE,
                "parity": figures,
                "speed_vs_fp32": speed,
            }

        inputs = self.common_inputs(
            "models/onnx_export.py",
            "models/checks.py",
            "models/smoothing.py",
            "models/corpus.py",
            "models/recipes.py",
            packages=("onnxruntime", "onnx"),
        ) | {
            "upstream": base_tag,
            # The calibration's token ids: its sentences (CPython's pydoc text, which changes
            # with the Python version) and the source's tokenizer (source_sha256 is the weights').
            "calibration_sha256": store.fingerprint({"lines": calibration}),
            "tokenizer_sha256": source.sha256_file(self.src.path / "tokenizer.json"),
            "quantisation": onnx_export.QUANTISATION,
            "smoothing": onnx_export.SMOOTHING,
            "fp32_nodes": onnx_export.FP32_NODES,
            "gate": INT8_GATE,
        }
        return store.Artefact(
            contracts.ONNX_INT8, inputs, build, labels={"kind": "onnx", "precision": "int8"}
        )

    def tf(self) -> store.Artefact:
        def build(out: Path) -> dict[str, Any]:
            from models import tf_bert

            tf_bert.export(self.src.path, out / "saved_model")
            import tensorflow as tf

            serve = tf.saved_model.load(str(out / "saved_model")).signatures["serving_default"]
            return {
                "source_sha256": self.src.sha256,
                "export": {"signature": "serving_default", "framework": "tf.Module (native BERT)"},
                "parity": self.checks.agreement(
                    lambda feeds: serve(**{k: tf.constant(v) for k, v in feeds.items()})[
                        "sentence_embedding"
                    ].numpy()
                ),
            }

        inputs = self.common_inputs("models/tf_bert.py", packages=("tensorflow-cpu", "safetensors"))
        return store.Artefact(contracts.TF_SAVEDMODEL, inputs, build, labels={"kind": "tensorflow"})

    def sentencepiece(self) -> store.Artefact:
        from models import sentencepiece_build

        lines = list(corpus.training_lines())
        inputs = {
            "corpus_sha256": store.fingerprint({"lines": lines}),
            "trainer": sentencepiece_build.TRAINER,
            "code": store.code_hash("models/sentencepiece_build.py", "models/corpus.py"),
            "versions": _versions("sentencepiece", "transformers", "tokenizers"),
        }

        def build(out: Path) -> dict[str, Any]:
            figures = sentencepiece_build.build(lines, out)
            if figures["mismatches"]:
                raise BuildError(
                    f"transformers tokenizer differs from sentencepiece on {figures['mismatches']} lines"
                )
            if figures["vocab_size"] != contracts.SPM_VOCAB:
                raise BuildError(
                    f"SentencePiece model has {figures['vocab_size']} pieces, the contract {contracts.SPM_VOCAB}"
                )
            return {
                "corpus_lines": len(lines),
                "trainer": sentencepiece_build.TRAINER,
                "parity": figures,
            }

        return store.Artefact(contracts.SENTENCEPIECE, inputs, build, labels={"kind": "tokenizer"})
