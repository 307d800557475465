"""Load one tenant version from disk into an engine, and check it before anything relies on it."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runners.tenants.store import ONNX_FILE, TF_DIR, InvalidModel, Manifest, read_manifest, size_of
from serving.batching import Engine
from serving.contracts import TENANT_CLASSIFIER, ContractError
from serving.features import pad

PROBE = [[3, 4, 5], [6]]
# Resident memory of a loaded, serving model per byte of its files, measured under LRU churn with
# freed memory given back after evictions (release_freed_memory): an ONNX Runtime session without
# its per-session arena (plus what the allocator keeps between loads); a TF SavedModel, which holds
# far more than its files (graph, function library, executors). The budget counts this estimate,
# so it bounds what models really hold. Runtimes themselves are a fixed cost, loaded at start,
# outside the budget (docs/decisions/0010-tenant-memory.md has the figures).
RESIDENT_PER_FILE_BYTE = {"onnx": 1.6, "tf": 3.3}


def release_freed_memory() -> None:
    """Collect unreachable models (TensorFlow's objects hold reference cycles: an evicted
    SavedModel is freed only by the cycle collector) and hand the freed heap back to the system
    (glibc keeps it otherwise: without this, a worker churning TF models grew many times its
    budget; docs/decisions/0010-tenant-memory.md)."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@dataclass
class LoadedModel:
    tenant: str
    version: str
    labels: list[str]
    engine: Engine
    nbytes: int  # estimated resident bytes: what the memory budget counts
    file_bytes: int = 0  # size of the version on disk
    batcher: Any = None  # where its requests are batched, attached by the runner
    load_seconds: float = 0.0  # reading, building and probing, excluding any wait for a thread


def load(tenant: str, version: str, directory: Path, threads: int = 1) -> LoadedModel:
    """Build the engine, check the contract, and run a probe: a model that loads but answers
    nonsense (wrong label count, NaN, not a distribution) is refused here, not on a request."""
    started = time.perf_counter()
    manifest: Manifest = read_manifest(directory)
    try:
        if manifest.format == "onnx":
            from serving.engines.onnx import OnnxEngine

            engine: Engine = OnnxEngine(
                directory / ONNX_FILE,
                TENANT_CLASSIFIER,
                threads=threads,
                providers=["CPUExecutionProvider"],
                name=tenant,
                memory_arena=False,
            )
        else:
            from serving.engines.tf import TFEngine

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
    file_bytes = size_of(directory)
    return LoadedModel(
        tenant,
        version,
        manifest.labels,
        engine,
        nbytes=int(file_bytes * RESIDENT_PER_FILE_BYTE[manifest.format]),
        file_bytes=file_bytes,
        load_seconds=time.perf_counter() - started,
    )
