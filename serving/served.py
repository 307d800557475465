"""The catalogue's models as a service serves them: which of them (a setting may narrow them), their
store entries declared at class scope, and the spec each entry records.

BentoML finds a service's models among its class attributes (``bentoml.models.BentoModel``), and a
bento carries the models it finds there; a service declares the entries of the models it serves
with ``declare`` before ``@bentoml.service`` runs, so no model is named in code.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import bentoml

from serving.catalogue import SPEC, Catalogue, Entry, ModelSpec


@dataclass(frozen=True)
class Declared:
    """One store entry a service holds: the model, which of its entries, the class attribute."""

    entry: Entry
    artefact: str  # "tokenizer", or a backend
    attribute: str

    def ref(self, owner: Any) -> Any:
        """The entry's ``BentoModel`` on ``owner`` (the service class or its instance)."""
        return getattr(owner, self.attribute)


def chosen(catalogue: Catalogue, names: Sequence[str] | None, setting: str) -> list[Entry]:
    """The catalogue's models a service serves: ``names`` (a setting, in the catalogue's order),
    or every one. A name the catalogue does not have stops the service at start, named."""
    if names is None:
        return list(catalogue.models)
    unknown = [n for n in names if catalogue.get(n) is None]
    if unknown:
        served = ", ".join(m.name for m in catalogue.models)
        raise ValueError(f"{setting}: {unknown} not in the catalogue (it has: {served})")
    return [m for m in catalogue.models if m.name in names]


def declare(cls: type, entries: Iterable[Entry], artefacts: Sequence[str]) -> list[Declared]:
    """Declare each model's store entries among ``artefacts`` (a backend only where the model is
    built for it) as ``BentoModel`` class attributes of ``cls``; returns what was declared."""
    declared = []
    for index, entry in enumerate(entries):
        for artefact in artefacts:
            if artefact != "tokenizer" and artefact not in entry.backends:
                continue
            attribute = f"model_{index}_{artefact.replace('-', '_')}"
            setattr(
                cls, attribute, bentoml.models.BentoModel(f"{entry.store_name(artefact)}:latest")
            )
            declared.append(Declared(entry, artefact, attribute))
    return declared


def spec_of(ref: Any) -> ModelSpec:
    """The spec a store entry recorded at build (``make models``). ``ref``: a ``BentoModel``, or
    the stored model a service instance's attribute resolves it to."""
    metadata = getattr(ref, "stored", ref).info.metadata
    if SPEC not in metadata:
        raise ValueError(f"{ref.tag} has no spec in its metadata: rebuild it with `make models`")
    return ModelSpec.model_validate(metadata[SPEC])
