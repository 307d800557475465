"""Load one tenant version from disk into an engine, and check it before anything relies on it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models.contracts import TENANT_CLASSIFIER, ContractError
from models.features import pad
from runners.batching.core import Engine
from runners.tenants.store import ONNX_FILE, TF_DIR, InvalidModel, Manifest, read_manifest, size_of

PROBE = [[3, 4, 5], [6]]


@dataclass
class LoadedModel:
    tenant: str
    version: str
    labels: list[str]
    engine: Engine
    nbytes: int  # on-disk size of the version: what the memory budget counts
    batcher: Any = None  # where its requests are batched, attached by the runner


def load(tenant: str, version: str, directory: Path, threads: int = 1) -> LoadedModel:
    """Build the engine, check the contract, and run a probe: a model that loads but answers
    nonsense (wrong label count, NaN, not a distribution) is refused here, not on a request."""
    manifest: Manifest = read_manifest(directory)
    try:
        if manifest.format == "onnx":
            from runners.onnx.engine import OnnxEngine

            engine: Engine = OnnxEngine(
                directory / ONNX_FILE,
                TENANT_CLASSIFIER,
                threads=threads,
                providers=["CPUExecutionProvider"],
                name=tenant,
            )
        else:
            from runners.tf.engine import TFEngine

            engine = TFEngine(directory / TF_DIR, TENANT_CLASSIFIER, threads=threads, name=tenant)
        probe = np.asarray(engine(pad(PROBE)))
    except ContractError as exc:
        raise InvalidModel(str(exc)) from None
    except InvalidModel:
        raise
    except Exception as exc:  # onnxruntime / tensorflow refusing the files
        raise InvalidModel(
            f"the {manifest.format} model does not load: {str(exc).splitlines()[0][:300]}"
        ) from None
    if probe.shape != (len(PROBE), len(manifest.labels)):
        raise InvalidModel(
            f"model outputs {probe.shape[-1]} scores, the manifest declares {len(manifest.labels)} labels"
        )
    if not np.all(np.isfinite(probe)) or not np.allclose(probe.sum(axis=1), 1, atol=1e-3):
        raise InvalidModel("model output is not a probability distribution")
    return LoadedModel(tenant, version, manifest.labels, engine, size_of(directory))
