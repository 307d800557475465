"""The catalogue's rules (serving/catalogue.py): what a good catalogue is, and that a bad one's
message names the entry and the field. The same refusals through `make models`, with checkpoints,
are in tests/integration/test_models.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from serving import catalogue
from serving.catalogue import CatalogueError, parse

ROOT = Path(__file__).resolve().parents[2]


def test_the_default_catalogue_serves_minilm_on_every_backend_and_the_demo_heads() -> None:
    served = catalogue.load(catalogue.DEFAULT)
    names = [m.name for m in served.models]
    assert names == ["all-MiniLM-L6-v2", "intent-classifier", "intent-reranker"]
    for task, name in (("classify", "intent-classifier"), ("rerank", "intent-reranker")):
        demo = served.default(task)
        assert demo is not None and demo.source == f"demo:{name}" and demo.backends == ("onnx",)
    entry = served.default("embed")
    assert entry is not None and entry.backends == ("onnx", "onnx-int8", "tf")
    assert [entry.store_name(a) for a in catalogue.ARTEFACTS] == [
        "all-minilm-l6-v2-tokenizer",
        "all-minilm-l6-v2-onnx",
        "all-minilm-l6-v2-onnx-int8",
        "all-minilm-l6-v2-tf",
    ]


def test_the_readmes_catalogue_example_is_a_valid_catalogue() -> None:
    blocks = re.findall(r"```yaml\n(models:.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "README.md has no catalogue example"
    for block in blocks:
        parsed = parse(yaml.safe_load(block), "README.md")
        assert parsed.default() is not None


def test_an_entry_takes_its_defaults() -> None:
    entry = parse({"models": [{"name": "m", "source": "org/m"}]}).models[0]
    assert (entry.task, entry.pooling, entry.normalize, entry.backends) == (
        "embed",
        "mean",
        True,
        ("onnx",),
    )
    assert entry.max_length is None and entry.dimensions is None


@pytest.mark.parametrize(
    ("entries", "words"),
    [
        ([{"name": "m", "source": "s", "poolling": "cls"}], ["models[1] (m)", "unknown key 'poolling'"]),
        ([{"name": "m"}], ["models[1] (m)", "source is required"]),
        ([{"name": "m", "source": "s", "backends": ["tensorrt"]}], ["models[1] (m)", "backends.0"]),
        ([{"name": "m", "source": "s", "backends": ["onnx", "onnx"]}], ["listed twice"]),
        ([{"name": "m", "source": "s", "task": "generate"}], ["models[1] (m)", "task"]),
        ([{"name": "m", "source": "s", "pooling": "max"}], ["models[1] (m)", "pooling"]),
        ([{"name": "m", "source": "s", "dimensions": [0]}], ["dimensions must be positive"]),
        ([{"name": "m", "source": "s", "max_length": 1}], ["models[1] (m)", "max_length"]),
        ([{"name": "my model", "source": "s"}], ["'my model' is not a model name"]),
        ([{"name": "M", "source": "s"}, {"name": "m", "source": "s"}], ["two entries are named"]),
        ([{"name": "ok", "source": "s"}], ["two entries are named 'ok'"]),
        ([{"name": "ok-int8", "source": "s"}], ["'ok-int8' is the name of 'ok'"]),
        ([{"name": "m", "source": "s", "aliases": ["ok"]}], ["alias 'ok' of 'm' also names 'ok'"]),
        (
            [{"name": "m", "source": "s", "aliases": ["x"]}, {"name": "n", "source": "s", "aliases": ["x"]}],
            ["alias 'x' of 'n' also names 'm'"],
        ),
        ([{"name": "m", "source": "s", "aliases": ["x"]}, {"name": "x-tf", "source": "s"}], ["'x-tf' is the name of 'm'"]),
        ([{"name": "m", "source": "s", "aliases": ["a b"]}], ["'a b' is not a model name"]),
    ],
    ids=[
        "unknown key", "missing source", "unknown backend", "backend twice", "unknown task",
        "unknown pooling", "zero dimensions", "max_length too short", "name not fit for a URL",
        "names equal in the store", "duplicate name", "a backend's name", "alias of a name",
        "alias twice", "a backend's name by alias", "alias not fit for a URL",
    ],
)  # fmt: skip
def test_a_bad_entry_is_refused_naming_the_entry_and_the_field(
    entries: list[dict], words: list[str]
) -> None:
    good = {"name": "ok", "source": "org/ok"}
    with pytest.raises(CatalogueError) as info:
        parse({"models": [good, *entries]}, "c.yaml")
    message = str(info.value)
    assert message.startswith("c.yaml: ")
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (None, ["models"]),
        ({"models": []}, ["models"]),
        ({"model": [{"name": "m", "source": "s"}]}, ["unknown key", "model"]),
    ],
    ids=["empty file", "no models", "misspelt top-level key"],
)
def test_a_catalogue_without_models_is_refused(data: object, words: list[str]) -> None:
    with pytest.raises(CatalogueError) as info:
        parse(data)
    for word in words:
        assert word in str(info.value), info.value


def test_another_catalogue_is_named_by_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"models": [{"name": "tiny", "source": "./tiny"}]}))
    monkeypatch.setenv(catalogue.ENV, str(other))
    assert catalogue.path() == other
    assert [m.name for m in catalogue.load().models] == ["tiny"]
    other.write_text("models: [\n")
    with pytest.raises(CatalogueError, match="not valid YAML"):
        catalogue.load()
