"""The tenant store on a real filesystem: names, atomic publishes, refused and interrupted uploads."""

from __future__ import annotations

import json
import os
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest

from runners.tenants import classifier, registry
from runners.tenants.store import (
    InvalidModel,
    Manifest,
    TenantStore,
    UnknownTenant,
    write_manifest,
)
from serving.tenant_names import InvalidTenantName, check_name

BAD_NAMES = [
    "../x",
    "a/b",
    "x" * 300,
    "",
    ".",
    "..",
    "A",
    "a b",
    "a.b",
    "é",
    "-a",
    "a\x00b",
    "/etc/passwd",
    "a\\b",
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_invalid_names_are_refused_before_touching_the_filesystem(
    tmp_path: Path, name: str
) -> None:
    root = tmp_path / "store"
    with pytest.raises(InvalidTenantName) as info:
        check_name(name)
    assert info.value.status == 422
    store = TenantStore(root)
    before = sorted(root.rglob("*"))
    for operation in (store.current, store.show, store.delete):
        with pytest.raises(InvalidTenantName):
            operation(name)
    assert sorted(root.rglob("*")) == before


def tiny_model(directory: Path, labels: list[str], fmt: str = "onnx", seed: int = 0) -> Path:
    """A real (untrained) classifier written in a version directory."""
    rng = np.random.default_rng(seed)
    clf = classifier.Classifier(
        rng.normal(size=(50, 8)).astype(np.float32),
        rng.normal(size=(8, len(labels))).astype(np.float32),
        np.zeros(len(labels), np.float32),
        labels,
    )
    directory.mkdir(parents=True, exist_ok=True)
    if fmt == "onnx":
        classifier.export_onnx(clf, directory / "model.onnx")
    else:
        classifier.export_tf(clf, directory / "saved_model")
    write_manifest(directory, Manifest(format=fmt, labels=labels))
    return directory


def archive(directory: Path, out: Path) -> Path:
    with tarfile.open(out, "w:gz") as tar:
        for child in directory.iterdir():
            tar.add(child, arcname=child.name)
    return out


@pytest.fixture
def store(tmp_path: Path) -> TenantStore:
    store = TenantStore(tmp_path / "store")
    registry.upload(
        store,
        "acme",
        archive(tiny_model(tmp_path / "v1", ["a", "b"]), tmp_path / "v1.tar.gz"),
        1 << 24,
    )
    return store


def test_upload_publishes_and_show_describes(store: TenantStore) -> None:
    info = store.show("acme")
    assert info.labels == ["a", "b"] and info.format == "onnx" and info.source == "upload"
    assert store.names() == ["acme"]
    with pytest.raises(UnknownTenant):
        store.show("nobody")


def test_corrupt_upload_is_refused_and_the_old_version_stays(
    store: TenantStore, tmp_path: Path
) -> None:
    old = store.current("acme")
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(os.urandom(4096))
    with pytest.raises(InvalidModel):
        registry.upload(store, "acme", garbage, 1 << 24)
    # A well-formed archive whose model file is garbage.
    bad = tiny_model(tmp_path / "bad", ["a", "b"])
    (bad / "model.onnx").write_bytes(b"not an onnx model")
    with pytest.raises(InvalidModel, match="does not load"):
        registry.upload(store, "acme", archive(bad, tmp_path / "bad.tar.gz"), 1 << 24)
    assert store.current("acme") == old
    assert list((store.root / ".staging").iterdir()) == []


def test_wrong_contract_is_refused(store: TenantStore, tmp_path: Path) -> None:
    old = store.current("acme")
    wrong = tiny_model(tmp_path / "wrong", ["a", "b", "c"])
    manifest = json.loads((wrong / "manifest.json").read_text())
    manifest["labels"] = ["a", "b"]  # the model answers 3 scores, the manifest declares 2 labels
    (wrong / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InvalidModel, match="3 scores"):
        registry.upload(store, "acme", archive(wrong, tmp_path / "wrong.tar.gz"), 1 << 24)
    too_big = archive(tiny_model(tmp_path / "big", ["a", "b"]), tmp_path / "big.tar.gz")
    with pytest.raises(InvalidModel, match="limit"):
        registry.upload(store, "acme", too_big, 100)
    assert store.current("acme") == old


def test_a_format_the_runner_does_not_serve_is_refused_before_it_loads(
    store: TenantStore, tmp_path: Path
) -> None:
    """A heads-only runner (BUNDLE_TENANTS_FORMATS=[]) never loads a runtime for an upload: the
    archive's format is refused from its manifest, and nothing is published."""
    old = store.current("acme")
    onnx = archive(tiny_model(tmp_path / "onnx", ["a", "b"]), tmp_path / "onnx.tar.gz")
    with pytest.raises(InvalidModel, match="BUNDLE_TENANTS_FORMATS"):
        registry.upload(store, "acme", onnx, 1 << 24, formats=[])
    assert store.current("acme") == old
    assert list((store.root / ".staging").iterdir()) == []
    registry.upload(store, "acme", onnx, 1 << 24, formats=["onnx"])  # served: published
    assert store.current("acme") != old


def test_archive_escaping_the_staging_directory_is_refused(
    store: TenantStore, tmp_path: Path
) -> None:
    evil = tmp_path / "evil.tar.gz"
    payload = tmp_path / "payload"
    payload.write_text("x")
    with tarfile.open(evil, "w:gz") as tar:
        tar.add(payload, arcname="../../escaped")
    with pytest.raises(InvalidModel):
        registry.upload(store, "acme", evil, 1 << 24)
    assert not (store.root.parent / "escaped").exists()


def test_two_concurrent_uploads_end_with_one_complete_current_version(
    store: TenantStore, tmp_path: Path
) -> None:
    archives = [
        archive(
            tiny_model(tmp_path / f"c{i}", ["x", "y", f"z{i}"], seed=i), tmp_path / f"c{i}.tar.gz"
        )
        for i in range(2)
    ]
    results = []
    threads = [
        threading.Thread(
            target=lambda a=a: results.append(registry.upload(store, "acme", a, 1 << 24))
        )
        for a in archives
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    version, path = store.current("acme")
    assert version in {r.version for r in results}
    assert (path / "model.onnx").is_file() and (path / "manifest.json").is_file()
    labels = json.loads((path / "manifest.json").read_text())["labels"]
    assert labels in (["x", "y", "z0"], ["x", "y", "z1"])


def test_a_label_over_the_public_limit_is_refused_on_every_path(
    store: TenantStore, tmp_path: Path
) -> None:
    """The store's manifest holds the public API's label limit, so the command line's training and
    an upload refuse it too; nothing is written."""
    long = "x" * 101
    with pytest.raises(InvalidModel, match="at most 100 characters"):
        registry.train_head(
            store, "acme", np.ones((4, 16), np.float32), ["a", "a", long, long], encoder="e"
        )
    with pytest.raises(ValueError, match="at most 100 characters"):
        Manifest(format="onnx", labels=["a", long])
    assert store.show("acme").labels == ["a", "b"]  # the current version is untouched
