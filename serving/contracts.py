"""Names in the model store and the input/output contract of each model, written once.

Runners check a loaded model against its contract at start-up (the idea of Triton's
``config.pbtxt``): a model whose signature differs fails loudly at start, not on the first request.
"""

from __future__ import annotations

from dataclasses import dataclass

# Model store names. Services reference ``NAME:latest``; the builder keeps one version per name.
TOKENIZER = "minilm-tokenizer"
ONNX_FP32 = "minilm-onnx"
ONNX_OPTIMISED = "minilm-onnx-opt"
ONNX_INT8 = "minilm-onnx-int8"
TF_SAVEDMODEL = "minilm-tf"
SENTENCEPIECE = "spm-unigram"

EMBEDDING_DIM = 384
# Vocabulary sizes: token ids are validated against them on the wire (serving/protocol.py), and the
# build pipeline checks the tokenizers it builds against them.
MINILM_VOCAB = 30522  # MiniLM's WordPiece vocabulary (vocab.txt)
SPM_VOCAB = 2000  # the project's SentencePiece model (what its corpus supports)
# all-MiniLM-L6-v2 was trained on sequences of up to 256 word pieces (sentence_bert_config.json);
# its tokenizer.json says 128, which would silently cut longer texts. 256 is the model's limit.
MAX_SEQ_LEN = 256


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name
    shape: tuple[int | None, ...]  # None: dynamic


@dataclass(frozen=True)
class Contract:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [spec.name for spec in self.outputs]


SENTENCE_EMBEDDING = Contract(
    inputs=(
        TensorSpec("input_ids", "int64", (None, None)),
        TensorSpec("attention_mask", "int64", (None, None)),
        TensorSpec("token_type_ids", "int64", (None, None)),
    ),
    outputs=(TensorSpec("sentence_embedding", "float32", (None, EMBEDDING_DIM)),),
)


class ContractError(RuntimeError):
    """A model does not have the inputs/outputs its contract requires."""


def check_contract(
    contract: Contract,
    inputs: dict[str, tuple[str, tuple[int | None, ...]]],
    outputs: dict[str, tuple[str, tuple[int | None, ...]]],
    model: str,
) -> None:
    """Compare what an engine reports (name -> (dtype, shape)) with a contract; raise on mismatch."""
    problems: list[str] = []
    for kind, specs, seen in (
        ("input", contract.inputs, inputs),
        ("output", contract.outputs, outputs),
    ):
        for spec in specs:
            if spec.name not in seen:
                problems.append(f"missing {kind} {spec.name!r} (has {sorted(seen)})")
                continue
            dtype, shape = seen[spec.name]
            if dtype != spec.dtype:
                problems.append(f"{kind} {spec.name!r} is {dtype}, expected {spec.dtype}")
            if len(shape) != len(spec.shape) or any(
                want is not None and got not in (None, want)
                for want, got in zip(spec.shape, shape, strict=True)
            ):
                problems.append(f"{kind} {spec.name!r} has shape {shape}, expected {spec.shape}")
    if problems:
        raise ContractError(f"{model} does not match its contract: " + "; ".join(problems))


# A tenant's intent classifier: SentencePiece ids in, one probability per intent out.
TENANT_CLASSIFIER = Contract(
    inputs=(
        TensorSpec("input_ids", "int64", (None, None)),
        TensorSpec("attention_mask", "int64", (None, None)),
    ),
    outputs=(TensorSpec("probabilities", "float32", (None, None)),),
)
