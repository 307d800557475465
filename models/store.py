"""Content-addressed entries in the BentoML model store.

An artefact's version is a fingerprint of everything that determines it (source weights, export
settings, the code that builds it, library versions, upstream artefacts). A second build with the
same inputs finds the tag and reuses it; any change gives a new version. One version per name is
kept, so ``NAME:latest`` is always the current build.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bentoml
from bentoml.exceptions import NotFound

ROOT = Path(__file__).resolve().parents[1]


def code_hash(*files: str) -> str:
    """Hash of the source files that shape an artefact (paths relative to the repository root),
    so a code change rebuilds it."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode())
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()[:16]


def fingerprint(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Artefact:
    name: str
    inputs: dict[str, Any]
    build: Callable[[Path], dict[str, Any]]  # writes into the dir; returns metadata (figures)
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def tag(self) -> str:
        return f"{self.name}:{fingerprint(self.inputs)}"


def existing(tag: str) -> bentoml.Model | None:
    try:
        return bentoml.models.get(tag)
    except NotFound:
        return None


def _prune(name: str, keep: str) -> None:
    try:
        stored = bentoml.models.list(name)
    except NotFound:
        return
    for model in stored:
        if str(model.tag) != keep:
            bentoml.models.delete(model.tag)


def ensure(artefact: Artefact, force: bool = False) -> tuple[bentoml.Model, float | None]:
    """Return the stored model for ``artefact``, building it if needed.

    The second value is the build time in seconds, or None when the stored model was reused.
    ``bentoml.models.create`` writes to a temporary directory and only adds the model to the
    store when the block succeeds, so a failed build leaves the store as it was.
    """
    tag = artefact.tag
    found = existing(tag)
    if found is not None and not force:
        _prune(artefact.name, tag)
        return found, None
    if found is not None:
        bentoml.models.delete(tag)
    started = time.perf_counter()
    with bentoml.models.create(
        tag,
        labels={"project": "bento-bundle", **artefact.labels},
        metadata={"inputs": artefact.inputs},
    ) as model:
        model.info.metadata.update(artefact.build(Path(model.path)))
    _prune(artefact.name, tag)
    return bentoml.models.get(tag), time.perf_counter() - started


def latest(name: str) -> bentoml.Model:
    """The current version of a stored model; NotFound names the model and says how to build it."""
    try:
        return bentoml.models.get(f"{name}:latest")
    except NotFound:
        raise NotFound(f"model {name!r} is not in the model store: run `make models`") from None


def path_of(name: str) -> Path:
    return Path(latest(name).path)
