"""Registry operations shared by the HTTP API and the command line: train, upload, list, show, delete.

Every new version is complete and checked (it loads, its contract matches, a probe answers a
probability distribution) in a staging directory before ``TenantStore.publish`` makes it current.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from runners.tenants import classifier
from runners.tenants.loader import load
from runners.tenants.store import (
    ONNX_FILE,
    TF_DIR,
    InvalidModel,
    Manifest,
    TenantStore,
    check_name,
    discard,
    read_manifest,
    write_manifest,
)
from serving.contracts import SPM_VOCAB
from serving.protocol import Registered


def _checked_publish(store: TenantStore, tenant: str, staged: Path) -> Registered:
    try:
        model = load(tenant, "staged", staged)
        metrics = read_manifest(staged).metrics
        version = store.publish(tenant, staged)
    except BaseException:
        discard(staged)
        raise
    return Registered(
        tenant=tenant, version=version, labels=model.labels, bytes=model.file_bytes, metrics=metrics
    )


def train(
    store: TenantStore,
    tenant: str,
    ids: Sequence[Sequence[int]],
    intents: Sequence[str],
    *,
    vocab: int = SPM_VOCAB,
    fmt: str = "onnx",
    dim: int,
    epochs: int,
    seed: int = 0,
    source: str = "train",
    extra_metrics: dict[str, float] | None = None,
) -> Registered:
    """Examples in, classifier trained, exported, registered as the tenant's new version."""
    check_name(tenant)
    if len(ids) != len(intents):
        raise InvalidModel(f"{len(ids)} texts but {len(intents)} intents")
    if len(set(intents)) < 2:
        raise InvalidModel("training needs examples of at least two intents")
    clf = classifier.train(ids, intents, vocab=vocab, dim=dim, epochs=epochs, seed=seed)
    predicted = [clf.labels[i] for i in clf.probabilities(ids).argmax(axis=1)]
    accuracy = classifier.accuracy(predicted, intents)
    staged = store.staging()
    try:
        if fmt == "onnx":
            classifier.export_onnx(clf, staged / ONNX_FILE)
        elif fmt == "tf":
            classifier.export_tf(clf, staged / TF_DIR)
        else:
            raise InvalidModel(f"unknown format {fmt!r}: onnx or tf")
        metrics = {
            "train_examples": float(len(ids)),
            "train_accuracy": accuracy,
            **(extra_metrics or {}),
        }
        write_manifest(
            staged, Manifest(format=fmt, labels=clf.labels, source=source, metrics=metrics)
        )
    except BaseException:
        discard(staged)
        raise
    return _checked_publish(store, tenant, staged)


def upload(store: TenantStore, tenant: str, archive: Path, max_bytes: int) -> Registered:
    """A model archive (.tar.gz of manifest.json + model.onnx or saved_model/), validated first."""
    check_name(tenant)
    staged = store.unpack(archive, max_bytes)
    expected = {"manifest.json"}
    try:
        manifest = read_manifest(staged)
        expected.add(ONNX_FILE if manifest.format == "onnx" else TF_DIR)
        found = {p.name for p in staged.iterdir()}
        if found != expected:
            raise InvalidModel(
                f"archive must hold exactly {sorted(expected)}, found {sorted(found)}"
            )
        write_manifest(staged, manifest.model_copy(update={"source": "upload", "created": ""}))
    except BaseException:
        discard(staged)
        raise
    return _checked_publish(store, tenant, staged)
