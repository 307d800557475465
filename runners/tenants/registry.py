"""Registry operations shared by the HTTP API and the command line: train, upload, list, show, delete.

Every new version is complete and checked (a model loads, its contract matches, a probe answers a
probability distribution; a head's shapes match its labels) in a staging directory before
``TenantStore.publish`` makes it current.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

import numpy as np

from runners.tenants import classifier, heads
from runners.tenants.loader import load
from runners.tenants.store import (
    MODEL_FILES,
    ONNX_FILE,
    TF_DIR,
    InvalidModel,
    Manifest,
    TenantStore,
    check_name,
    discard,
    read_manifest,
    size_of,
    write_manifest,
)
from serving.contracts import SPM_VOCAB
from serving.protocol import Registered
from serving.tenant_names import MAX_LABEL_CHARS


def _checked_publish(store: TenantStore, tenant: str, staged: Path) -> Registered:
    try:
        manifest = read_manifest(staged)
        if manifest.format == "head":
            heads.load("staged", staged)
        else:
            load(tenant, "staged", staged)
        version = store.publish(tenant, staged)
    except BaseException:
        discard(staged)
        raise
    _, published = store.require(tenant)
    return Registered(
        tenant=tenant,
        version=version,
        labels=manifest.labels,
        bytes=size_of(published),
        metrics=manifest.metrics,
    )


def _check_examples(count: int, intents: Sequence[str]) -> None:
    if count != len(intents):
        raise InvalidModel(f"{count} texts but {len(intents)} intents")
    if len(set(intents)) < 2:
        raise InvalidModel("training needs examples of at least two intents")
    if long := [i for i in set(intents) if len(i) > MAX_LABEL_CHARS]:
        raise InvalidModel(
            f"intents: {len(long)} with more than {MAX_LABEL_CHARS} characters; labels must have "
            f"at most {MAX_LABEL_CHARS} characters"
        )


def train_head(
    store: TenantStore,
    tenant: str,
    vectors: np.ndarray,
    intents: Sequence[str],
    *,
    encoder: str,
    source: str = "train",
    extra_metrics: dict[str, float] | None = None,
) -> Registered:
    """Examples embedded by ``encoder`` (a catalogue model) in, a head trained (in milliseconds:
    docs/decisions/0011-head-tenants.md), registered as the tenant's new version."""
    check_name(tenant)
    _check_examples(len(vectors), intents)
    labels, weights, bias = heads.train(vectors, intents)
    head = heads.Head("staged", labels, weights, bias, encoder)
    predicted = [labels[i] for i in head.probabilities(np.asarray(vectors, np.float32)).argmax(1)]
    staged = store.staging()
    try:
        heads.save(staged, weights, bias)
        metrics = {
            "train_examples": float(len(intents)),
            "train_accuracy": classifier.accuracy(predicted, intents),
            **(extra_metrics or {}),
        }
        write_manifest(
            staged,
            Manifest(format="head", labels=labels, source=source, metrics=metrics, encoder=encoder),
        )
    except BaseException:
        discard(staged)
        raise
    return _checked_publish(store, tenant, staged)


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
    _check_examples(len(ids), intents)
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
            raise InvalidModel(f"unknown format {fmt!r}: onnx or tf (heads: train_head)")
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


def upload(
    store: TenantStore,
    tenant: str,
    archive: Path,
    max_bytes: int,
    formats: Collection[str] = ("onnx", "tf"),
) -> Registered:
    """A model archive (.tar.gz of manifest.json + model.onnx, saved_model/ or head.npz), validated
    first; a whole model only of the ``formats`` served (a head always)."""
    check_name(tenant)
    staged = store.unpack(archive, max_bytes)
    expected = {"manifest.json"}
    try:
        manifest = read_manifest(staged)
        if manifest.format != "head" and manifest.format not in formats:
            raise InvalidModel(
                f"a {manifest.format} model; this runner serves heads and "
                f"{list(formats) or 'no whole models'} (BUNDLE_TENANTS_FORMATS)"
            )
        expected.add(MODEL_FILES[manifest.format])
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
