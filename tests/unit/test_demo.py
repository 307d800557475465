"""The demo heads' build steps without training a model: the held-out split, the gate that stops
a demo below it, and the reuse of one trained from the same inputs (the training itself runs in
`make models`; tests/integration/test_models.py and tests/e2e/test_graph.py read what it made)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from models import demo, source
from models.checks import BuildError
from serving.catalogue import Entry


def test_held_out_templates_are_never_trained_on() -> None:
    train, held = demo.split_templates()
    assert sorted(train) == sorted(held) and len(train) >= 20
    for intent in train:
        assert held[intent] and not set(held[intent]) & set(train[intent])
    seen = {text for text, _ in demo.utterances(train, seed=1)}
    tests = demo.utterances(held, seed=2)
    assert tests and not seen & {text for text, _ in tests}


class FolderStore:
    """models/store.py's ``existing`` and ``ensure`` on a folder: the machine's model store is not
    the tests' to write."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def existing(self, tag: str) -> Any:
        path = self.root / tag.replace(":", "-")
        if not path.is_dir():
            return None
        metadata = json.loads((path / "model.yaml").read_text())
        return SimpleNamespace(tag=tag, path=str(path), info=SimpleNamespace(metadata=metadata))

    def ensure(self, artefact: Any) -> None:
        path = self.root / artefact.tag.replace(":", "-")
        path.mkdir(parents=True)
        (path / "model.yaml").write_text(json.dumps(artefact.build(path)))


@pytest.fixture
def demos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The demo classifier's trainer replaced by one that writes a file and reports the held-out
    accuracy the test sets: the gate and the reuse are demo.checkpoint's own."""
    monkeypatch.setattr(demo, "OUT", tmp_path / "demo")
    monkeypatch.setattr(demo, "QUALITY", tmp_path / "quality.json")
    kept = FolderStore(tmp_path / "store")
    monkeypatch.setattr(demo.store, "existing", kept.existing)
    monkeypatch.setattr(demo.store, "ensure", kept.ensure)
    trained: dict[str, Any] = {"calls": 0, "accuracy": 0.9}

    def trainer(out: Path, log: Any) -> dict[str, Any]:
        trained["calls"] += 1
        (out / "config.json").write_text("{}")
        return {"accuracy": trained["accuracy"], "baseline_accuracy": 0.8}

    classifier = dataclasses.replace(demo.DEMOS["intent-classifier"], train=trainer)
    monkeypatch.setitem(demo.DEMOS, "intent-classifier", classifier)
    return trained


def test_a_demo_below_its_gate_fails_the_build_and_leaves_no_checkpoint(
    demos: dict[str, Any], tmp_path: Path
) -> None:
    demos["accuracy"] = demo.MIN_ACCURACY - 0.01
    with pytest.raises(BuildError, match=r"intent-classifier: held-out accuracy 0\.740 is below"):
        demo.checkpoint("intent-classifier", log=lambda _: None)
    assert demo.built("intent-classifier") is None
    assert not list((tmp_path / "demo").iterdir())  # neither the checkpoint nor its partial copy
    assert demo.from_store("intent-classifier") is None  # nor a copy for other clones
    recorded = json.loads((tmp_path / "quality.json").read_text())["intent-classifier"]
    assert recorded["accuracy"] < demo.MIN_ACCURACY and "below the gate" in recorded["failure"]


def other_inputs(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """As if the templates, the recipe or the weights of ``names`` had changed."""
    today = demo.inputs_hash
    monkeypatch.setattr(demo, "inputs_hash", lambda n: "other" if n in names else today(n))


def test_a_demo_is_trained_once_for_the_same_inputs(
    demos: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = Entry(name="intents", source="demo:intent-classifier", task="classify")
    assert source.locate(entry, tmp_path, fetch=False) is None  # not trained, not training
    first = demo.checkpoint("intent-classifier", log=lambda _: None)
    again = source.locate(entry, tmp_path)
    assert first == again == demo.built("intent-classifier") and demos["calls"] == 1
    recorded = json.loads((tmp_path / "quality.json").read_text())["intent-classifier"]
    assert recorded["accuracy"] == 0.9 and "failure" not in recorded
    other_inputs(monkeypatch, "intent-classifier")
    assert demo.built("intent-classifier") is None
    demo.checkpoint("intent-classifier", log=lambda _: None)
    assert demos["calls"] == 2


def test_a_fresh_clone_copies_a_demo_from_the_model_store_instead_of_training_it(
    demos: dict[str, Any], tmp_path: Path
) -> None:
    """What the store keeps is of today's inputs only (other inputs train again, above)."""
    first = demo.checkpoint("intent-classifier", log=lambda _: None)
    figures = json.loads((tmp_path / "quality.json").read_text())
    shutil.rmtree(tmp_path / "demo")  # what a new clone of the repository lacks
    (tmp_path / "quality.json").unlink()
    said: list[str] = []
    again = demo.checkpoint("intent-classifier", log=said.append)
    assert demos["calls"] == 1 and again == first == demo.built("intent-classifier")
    assert sorted(p.name for p in again.iterdir()) == ["config.json", "inputs.sha"]
    copied = json.loads((tmp_path / "quality.json").read_text())["intent-classifier"]
    kept = demo.from_store("intent-classifier")
    assert kept is not None and copied == {**figures["intent-classifier"], "copied_from": kept.tag}
    assert said and "copied from the model store" in said[0] and "0.900 >= 0.750" in said[0]


def test_a_store_that_refuses_the_demo_costs_a_warning_not_the_training(
    demos: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(artefact: Any) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(demo.store, "ensure", full)
    said: list[str] = []
    out = demo.checkpoint("intent-classifier", log=said.append)
    assert out == demo.built("intent-classifier") and (out / "config.json").is_file()
    assert said[-1].startswith("warning: intent-classifier not kept in the model store (OSError")
    assert demo.from_store("intent-classifier") is None


def test_an_unknown_demo_is_a_source_error_naming_those_there_are(tmp_path: Path) -> None:
    entry = Entry(name="m", source="demo:nope", task="classify")
    with pytest.raises(source.SourceError, match=r"demo:nope is not a demo \(demos: intent-"):
        source.locate(entry, tmp_path)


@pytest.fixture
def reranker(demos: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The reranker's trainer replaced too (the classifier's, by ``demos``, writes weights for it
    to start from): it reports the MAP the test sets against the cosine's 0.82."""
    figures = {"map": 0.80, "baseline_map": 0.82, "mrr": 0.9, "baseline_mrr": 0.93, "calls": 0}

    def trainer(out: Path, log: Any) -> dict[str, Any]:
        figures["calls"] += 1
        (out / "config.json").write_text("{}")
        return {k: v for k, v in figures.items() if k != "calls"}

    classifier = demo.DEMOS["intent-classifier"]

    def weights_too(out: Path, log: Any) -> dict[str, Any]:
        (out / "model.safetensors").write_bytes(b"weights %d" % demos["calls"])
        return classifier.train(out, log)

    monkeypatch.setitem(
        demo.DEMOS, "intent-classifier", dataclasses.replace(classifier, train=weights_too)
    )
    rerank = dataclasses.replace(demo.DEMOS["intent-reranker"], train=trainer)
    monkeypatch.setitem(demo.DEMOS, "intent-reranker", rerank)
    return figures


def test_the_reranker_must_match_the_cosines_map_on_its_pools(reranker: dict[str, Any]) -> None:
    """The reranker's floor is not a constant: it is what MiniLM's cosine scores on the same pools.
    The classifier it starts from is trained first, and kept when the reranker fails its gate."""
    with pytest.raises(BuildError, match=r"held-out MAP 0\.800 is below the gate's 0\.820"):
        demo.checkpoint("intent-reranker", log=lambda _: None)
    assert demo.built("intent-classifier") is not None and demo.built("intent-reranker") is None
    reranker["map"] = 0.82  # matching it is enough
    assert demo.checkpoint("intent-reranker", log=lambda _: None).is_dir()


def test_a_classifier_trained_again_trains_the_reranker_again(
    demos: dict[str, Any], reranker: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    reranker["map"] = 0.9
    demo.checkpoint("intent-reranker", log=lambda _: None)
    assert (demos["calls"], reranker["calls"]) == (1, 1)
    demo.checkpoint("intent-reranker", log=lambda _: None)  # reused
    assert (demos["calls"], reranker["calls"]) == (1, 1)
    shutil.rmtree(demo.OUT)  # a fresh clone: both copied from the store, neither trained
    demo.checkpoint("intent-reranker", log=lambda _: None)
    assert (demos["calls"], reranker["calls"]) == (1, 1)
    other_inputs(monkeypatch, "intent-classifier")
    assert demo.built("intent-reranker") is None  # stale with the weights it started from
    demo.checkpoint("intent-reranker", log=lambda _: None)  # new weights to start from
    assert (demos["calls"], reranker["calls"]) == (2, 2)


def test_mrr_and_map_read_each_pool_in_score_order() -> None:
    pools = [("q", ["a", "b", "c"], [False, True, True]), ("r", ["d", "e"], [True, False])]
    # First pool ordered b, a, c: relevant at ranks 1 and 3. Second: e, d: relevant at rank 2.
    scores = [np.array([0.5, 0.9, 0.1]), np.array([0.2, 0.7])]
    quality = demo.ranking_quality(scores, pools)
    assert quality["mrr"] == pytest.approx((1 + 1 / 2) / 2)
    assert quality["map"] == pytest.approx(((1 + 2 / 3) / 2 + 1 / 2) / 2)
    # Ties keep the pool's own order: the cosine's, which ranked the pool.
    assert demo.ranking_quality([np.zeros(3), np.zeros(2)], pools)["mrr"] == pytest.approx(0.75)
