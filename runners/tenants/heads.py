"""Head tenants: a linear softmax layer (width × labels) over the sentence vectors of a catalogue
model the stack already serves, the head's encoder, named in its manifest. The encoder is shared (a
runner embeds every tenant's texts in the same batches); what is per tenant is a few KB of weights a
label, so every head stays resident: no budget, no eviction, no cold load. Stored as a version like
any other model: manifest.json + head.npz.
"""

from __future__ import annotations

import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runners.tenants.store import HEAD_FILE, InvalidModel, read_manifest
from serving.protocol import MAX_WIDTH

# Full-batch gradient descent on the softmax cross-entropy, from zeros (deterministic): as accurate
# on unseen phrasings as more, slower steps, in milliseconds a tenant
# (docs/decisions/0011-head-tenants.md).
STEPS = 40
RATE = 10.0
L2 = 1e-4


def max_head_bytes(labels: int) -> int:
    """The largest head a manifest's labels allow: float32 over the widest vector, with room for
    the .npy headers."""
    return 4 * (MAX_WIDTH + 1) * labels + 4096


@dataclass(frozen=True)
class Head:
    version: str
    labels: list[str]
    weights: np.ndarray  # float32 [the encoder's width, labels]
    bias: np.ndarray  # float32 [labels]

    encoder: str

    @property
    def width(self) -> int:
        return int(self.weights.shape[0])

    def probabilities(self, vectors: np.ndarray) -> np.ndarray:
        logits = vectors @ self.weights + self.bias
        logits -= logits.max(axis=1, keepdims=True)
        exp = np.exp(logits)
        return exp / exp.sum(axis=1, keepdims=True)

    @property
    def nbytes(self) -> int:
        return self.weights.nbytes + self.bias.nbytes


def train(vectors: np.ndarray, intents: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Labels (sorted), weights and bias of a softmax regression from embedded examples."""
    labels = sorted(set(intents))
    index = {label: i for i, label in enumerate(labels)}
    x = np.asarray(vectors, dtype=np.float32)
    targets = np.eye(len(labels), dtype=np.float32)[[index[i] for i in intents]]
    weights = np.zeros((x.shape[1], len(labels)), np.float32)
    bias = np.zeros(len(labels), np.float32)
    for _ in range(STEPS):
        logits = x @ weights + bias
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        grad = (p - targets) / len(x)
        weights -= RATE * (x.T @ grad + L2 * weights)
        bias -= RATE * grad.sum(axis=0)
    return labels, weights, bias


def save(directory: Path, weights: np.ndarray, bias: np.ndarray) -> None:
    with open(directory / HEAD_FILE, "wb") as fh:
        np.savez(fh, weights=weights.astype(np.float32), bias=bias.astype(np.float32))


def load(version: str, directory: Path) -> Head:
    """Read and check a head: shapes against the manifest's labels, finite weights."""
    manifest = read_manifest(directory)
    path = directory / HEAD_FILE
    try:
        # Sizes first: an upload's compressed arrays must not unpack into gigabytes.
        with zipfile.ZipFile(path) as archive:
            unpacked = sum(member.file_size for member in archive.infolist())
        most = max_head_bytes(len(manifest.labels))
        if unpacked > most:
            raise InvalidModel(f"{HEAD_FILE} unpacks to {unpacked} bytes; at most {most}")
        with np.load(path, allow_pickle=False) as arrays:
            weights, bias = arrays["weights"], arrays["bias"]
        weights, bias = weights.astype(np.float32), bias.astype(np.float32)
    except FileNotFoundError:
        raise InvalidModel(f"{HEAD_FILE} is missing") from None
    except InvalidModel:
        raise
    except Exception as exc:  # not a zip, not .npy arrays, not numbers: not a head
        raise InvalidModel(f"{HEAD_FILE} is not a head (arrays weights, bias): {exc}") from None
    labels = len(manifest.labels)
    if (
        weights.ndim != 2
        or not 1 <= weights.shape[0] <= MAX_WIDTH
        or weights.shape[1] != labels
        or bias.shape != (labels,)
    ):
        raise InvalidModel(
            f"{HEAD_FILE}: weights {weights.shape} and bias {bias.shape}; the manifest's "
            f"{labels} labels need (width, {labels}) and ({labels},), a width of at most {MAX_WIDTH}"
        )
    if not (np.all(np.isfinite(weights)) and np.all(np.isfinite(bias))):
        raise InvalidModel(f"{HEAD_FILE} holds non-finite weights")
    assert manifest.encoder is not None  # a head's manifest always names one (store.Manifest)
    return Head(version, manifest.labels, weights, bias, manifest.encoder)


class HeadBank:
    """Every head tenant's current head, in memory. A version published since (by this replica or
    another writing the same store) is read on the next request for it: a small file read, not a
    load (docs/decisions/0011-head-tenants.md)."""

    def __init__(self) -> None:
        self.heads: dict[str, Head] = {}
        self.reads = 0

    def get(self, tenant: str, version: str, directory: Path) -> Head:
        head = self.heads.get(tenant)
        if head is None or head.version != version:
            head = self.heads[tenant] = load(version, directory)
            self.reads += 1
        return head

    def drop(self, tenant: str) -> None:
        self.heads.pop(tenant, None)

    def preload(self, current: Sequence[tuple[str, str, Path]]) -> float:
        """Reads every (tenant, version, directory) given; seconds taken. Broken or vanished ones
        are skipped (a request for one answers the error)."""
        started = time.perf_counter()
        for tenant, version, directory in current:
            try:
                self.get(tenant, version, directory)
            except (InvalidModel, OSError):
                continue
        return time.perf_counter() - started

    @property
    def nbytes(self) -> int:
        return sum(head.nbytes for head in self.heads.values())
