"""How each entry of the model store is made: for a catalogue model, its tokenizer and one entry per
backend it lists; for the project, the tenants' SentencePiece model. Each is an ``Artefact`` whose
inputs (the weights' hash, the entry, the code that builds it, library versions) fingerprint its
version, and each catalogue model's entries record its ``ModelSpec`` (what serving it needs).
"""

from __future__ import annotations

from functools import cached_property
from importlib.metadata import version
from pathlib import Path
from typing import Any

from models import checkpoints, corpus, store
from models.checks import INT8_GATE, BuildError, Checks, int8_gate, parity_failure, speed
from models.source import Source, sha256_file
from serving import contracts
from serving.catalogue import SPEC, Entry, ModelSpec
from serving.features import load_tokenizer, tokenize

# Runtime code every artefact of a catalogue model depends on: its spec and contract, its feeds.
SHARED_CODE = ("serving/catalogue.py", "serving/contracts.py", "serving/features.py")


def log(message: str) -> None:
    print(message, flush=True)


def _versions(*packages: str) -> dict[str, str]:
    return {name: version(name) for name in packages}


class ModelRecipes:
    """The store entries of one catalogue model, built from its checkpoint."""

    def __init__(self, entry: Entry, src: Source) -> None:
        self.entry = entry
        self.src = src
        self.checkpoint = checkpoints.read(src.path)

    @cached_property
    def hf_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.src.path))

    @cached_property
    def spec(self) -> ModelSpec:
        tokenizer = load_tokenizer(self.src.path / "tokenizer.json", 8192)
        spec = checkpoints.spec(
            self.entry,
            self.checkpoint,
            tokenizer,
            token_types="token_type_ids" in self.hf_tokenizer.model_input_names,
        )
        pad_id = self.hf_tokenizer.pad_token_id
        return spec if pad_id is None else spec.model_copy(update={"pad_id": int(pad_id)})

    @cached_property
    def checks(self) -> Checks:
        return Checks(self.src, self.spec)

    def inputs(self, *code: str, packages: tuple[str, ...] = ()) -> dict[str, Any]:
        return {
            "source_sha256": self.src.sha256,
            "spec": self.spec.model_dump(mode="json", exclude_none=True),
            "code": store.code_hash(*SHARED_CODE, "models/recipes.py", *code),
            "versions": _versions("numpy", "tokenizers", *packages),
        }

    def recorded(self, **figures: Any) -> dict[str, Any]:
        return {
            "source_sha256": self.src.sha256,
            SPEC: self.spec.model_dump(mode="json", exclude_none=True),  # no None in metadata
            **figures,
        }

    def gated(self, backend: str, run: Any) -> dict[str, Any]:
        """The backend's parity against PyTorch, or BuildError when it fails the gate: a model
        that a backend cannot compute as PyTorch does is never stored, so never served."""
        figures = self.checks.parity(run)
        if failure := parity_failure(backend, figures):
            raise BuildError(f"{self.entry.name}: parity gate failed: {failure}")
        log(
            f"      parity: {figures['mismatches']} of {figures['inputs']} flipped, max |diff| "
            f"{figures['max_diff']:.1e}"
        )
        return figures

    def tokenizer(self) -> store.Artefact:
        def build(out: Path) -> dict[str, Any]:
            fixed = load_tokenizer(self.src.path / "tokenizer.json", self.spec.max_length)
            fixed.save(str(out / "tokenizer.json"))
            for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
                if (self.src.path / name).exists():
                    (out / name).write_bytes((self.src.path / name).read_bytes())
            # Proof that removing the fixed padding changed nothing but padding: the ids equal
            # transformers' own tokenizer's.
            texts = self.checks.texts
            want = self.hf_tokenizer(texts, truncation=True, max_length=self.spec.max_length)
            got = tokenize(load_tokenizer(out / "tokenizer.json", self.spec.max_length), texts)
            mismatches = sum(a != b for a, b in zip(got, want["input_ids"], strict=True))
            if mismatches:
                raise BuildError(
                    f"{self.entry.name}: the served tokenizer differs from transformers' on "
                    f"{mismatches} texts"
                )
            return self.recorded(
                padding="none (the source tokenizer.json's fixed padding removed)",
                parity={"texts": len(texts), "mismatches_vs_transformers": mismatches},
            )

        return store.Artefact(
            self.entry.store_name("tokenizer"),
            self.inputs(packages=("transformers",)),
            build,
            labels={"kind": "tokenizer", "model": self.entry.name},
        )

    def onnx(self) -> store.Artefact:
        from models import onnx_export

        def build(out: Path) -> dict[str, Any]:
            onnx_export.export_fp32(self.src.path, self.spec, out / "model.onnx")
            run = onnx_export.runner(out / "model.onnx", self.spec)
            return self.recorded(
                export={"exporter": "torch.onnx.export(dynamo=False)", "opset": onnx_export.OPSET},
                agreement=self.checks.agreement(run),
                parity=self.gated("onnx", run),
            )

        inputs = self.inputs(
            "models/onnx_export.py",
            "models/reference.py",
            "models/checks.py",
            packages=("torch", "transformers", "onnx"),
        ) | {"opset": onnx_export.OPSET}
        return store.Artefact(
            self.entry.store_name("onnx"),
            inputs,
            build,
            labels={"kind": "onnx", "precision": "fp32", "model": self.entry.name},
        )

    def onnx_int8(self, base: store.Artefact) -> store.Artefact:
        from models import onnx_export

        calibration = corpus.calibration_sentences(onnx_export.SMOOTHING["calibration_sentences"])
        fp32 = store.path_of(base.name) / "model.onnx"

        def build(out: Path) -> dict[str, Any]:
            quantised = onnx_export.quantise(
                fp32, out / "model.onnx", self.checks.in_batches(calibration)
            )
            int8 = onnx_export.runner(out / "model.onnx", self.spec)
            figures = int8_gate(self.checks, onnx_export.runner(fp32, self.spec), int8)
            gain = speed(self.checks, fp32, out / "model.onnx")
            log(f"      int8 vs fp32: {gain['speedup']:.2f}x")
            return self.recorded(
                export={
                    "quantisation": "onnxruntime.quantization.quantize_dynamic",
                    **onnx_export.QUANTISATION,
                    "smoothing": "SmoothQuant (models/smoothing.py)",
                    **onnx_export.SMOOTHING,
                    **quantised,
                    "base": base.tag,
                },
                gate=INT8_GATE,
                agreement=figures,
                parity=self.gated("onnx-int8", int8),
                speed_vs_fp32=gain,
            )

        inputs = self.inputs(
            "models/onnx_export.py",
            "models/checks.py",
            "models/smoothing.py",
            "models/corpus.py",
            packages=("onnxruntime", "onnx"),
        ) | {
            "upstream": base.tag,
            # The calibration's token ids: its sentences (CPython's pydoc text, which changes with
            # the Python version) and the tokenizer (source_sha256 is the weights').
            "calibration_sha256": store.fingerprint({"lines": calibration}),
            "tokenizer_sha256": sha256_file(self.src.path / "tokenizer.json"),
            "quantisation": onnx_export.QUANTISATION,
            "smoothing": onnx_export.SMOOTHING,
            "fp32_nodes": onnx_export.FP32_NODES,
            "gate": INT8_GATE,
        }
        return store.Artefact(
            self.entry.store_name("onnx-int8"),
            inputs,
            build,
            labels={"kind": "onnx", "precision": "int8", "model": self.entry.name},
        )

    def tf(self) -> store.Artefact:
        def build(out: Path) -> dict[str, Any]:
            from models import tf_encoder
            from serving.engines.tf import TFEngine

            tf_encoder.export(self.src.path, self.spec, out / "saved_model")
            engine = TFEngine(out / "saved_model", self.spec.contract(), threads=2)
            return self.recorded(
                export={
                    "signature": "serving_default",
                    "framework": "tf.Module (models/tf_encoder.py)",
                },
                agreement=self.checks.agreement(engine),
                parity=self.gated("tf", engine),
            )

        inputs = self.inputs(
            "models/tf_encoder.py",
            "models/reference.py",
            "models/checks.py",
            "serving/engines/tf.py",
            packages=("tensorflow-cpu", "safetensors"),
        )
        return store.Artefact(
            self.entry.store_name("tf"),
            inputs,
            build,
            labels={"kind": "tensorflow", "model": self.entry.name},
        )


def sentencepiece() -> store.Artefact:
    """The project's SentencePiece model, which tenants' whole models read."""
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
