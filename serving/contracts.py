"""The input/output contract of a model, checked when a runner loads it.

Runners check a loaded model against its contract at start-up (the idea of Triton's
``config.pbtxt``): a model whose signature differs fails loudly at start, not on the first request.
A catalogue model's contract comes from its spec (``serving.catalogue.ModelSpec.contract``); a
tenant's whole-model classifier has ``TENANT_CLASSIFIER``.
"""

from __future__ import annotations

from dataclasses import dataclass

# The project's SentencePiece model, which tenants' whole models read (model store name), and its
# vocabulary: tenant ids are validated against it on the wire (serving/protocol.py), and the build
# pipeline checks the model it trains against it (what the project's corpus supports).
SENTENCEPIECE = "spm-unigram"
SPM_VOCAB = 2000


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
