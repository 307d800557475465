"""Demo tenants, trained for real, served through the same loader the runner uses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import sentencepiece

from models import demo_tenants as demo
from models import store
from runners.tenants import classifier, registry
from runners.tenants.loader import load
from runners.tenants.settings import TenantRunnerSettings
from runners.tenants.store import TenantStore
from serving import contracts
from serving.features import pad

SPM = sentencepiece.SentencePieceProcessor(
    model_file=str(store.path_of(contracts.SENTENCEPIECE) / "spiece.model")
)


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> TenantStore:
    tenant_store = TenantStore(tmp_path_factory.mktemp("tenants"))
    for index in (1, 3):  # tenant 1 is ONNX, tenant 3 TensorFlow
        spec = demo.tenant(index)
        registry.train(
            tenant_store, spec.name, SPM.encode([t for t, _ in spec.train]), [i for _, i in spec.train],
            vocab=SPM.get_piece_size(), fmt=spec.fmt, dim=spec.dim, epochs=TenantRunnerSettings().train_epochs, seed=index, source="demo",
        )  # fmt: skip
    return tenant_store


@pytest.mark.parametrize(("index", "fmt"), [(1, "onnx"), (3, "tf")])
def test_tenant_classifies_held_out_phrases(tenants: TenantStore, index: int, fmt: str) -> None:
    spec = demo.tenant(index)
    assert spec.fmt == fmt
    version, directory = tenants.require(spec.name)
    model = load(spec.name, version, directory)

    def predict(texts: list[str]) -> list[str]:
        return [
            model.labels[i] for i in np.asarray(model.engine(pad(SPM.encode(texts)))).argmax(axis=1)
        ]

    def accuracy(examples: list[tuple[str, str]]) -> float:
        return classifier.accuracy(predict([t for t, _ in examples]), [i for _, i in examples])

    heldout = accuracy(spec.heldout_phrases)
    unseen = accuracy(spec.unseen_templates)
    assert len(spec.heldout_phrases) >= 15  # not vacuous
    assert heldout >= 0.9, f"held-out phrases of the training templates: {heldout:.2f}"
    # Phrasings the tenant never saw: a bag of subwords trained on 8 of them per intent gets ~0.75
    # on average; well above chance (1/6-1/12) is what this model class can promise.
    assert unseen >= 0.5, f"unseen templates: {unseen:.2f}"


@pytest.mark.parametrize("fmt", ["onnx", "tf"])
def test_exports_compute_what_the_reference_computes(tmp_path: Path, fmt: str) -> None:
    rng = np.random.default_rng(0)
    clf = classifier.Classifier(
        rng.normal(size=(100, 16)).astype(np.float32), rng.normal(size=(16, 3)).astype(np.float32),
        rng.normal(size=3).astype(np.float32), ["a", "b", "c"],
    )  # fmt: skip
    ids = [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10, 11]]
    directory = tmp_path / fmt
    directory.mkdir()
    if fmt == "onnx":
        classifier.export_onnx(clf, directory / "model.onnx")
    else:
        classifier.export_tf(clf, directory / "saved_model")
    from runners.tenants.store import Manifest, write_manifest

    write_manifest(directory, Manifest(format=fmt, labels=clf.labels))
    engine = load("t", "v", directory).engine
    np.testing.assert_allclose(engine(pad(ids)), clf.probabilities(ids), atol=1e-5)
