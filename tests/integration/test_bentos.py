"""Every bentofile builds with `bentoml build` (package locking on), and each bento carries only its
own engine and its own models."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import bentoml
import pytest
import yaml
from pathspec import PathSpec

from deploy import bentos as deploy_bentos
from serving import catalogue
from serving.catalogue import BACKENDS


@pytest.fixture(scope="module")
def built() -> Iterator[dict[str, Path]]:
    tags = {name: deploy_bentos.build(name, base_image=None) for name in deploy_bentos.BENTOS}
    yield {name: Path(bentoml.get(tag).path) for name, tag in tags.items()}
    for tag in tags.values():  # each build is a new version: do not pile them up in the store
        bentoml.delete(tag)


def locked(bento: Path) -> dict[str, str]:
    # With locking on, bentoml writes the resolved set, every package pinned, to requirements.txt.
    lines = (bento / "env" / "python" / "requirements.txt").read_text().splitlines()
    pins = dict(
        m.groups() for line in lines if (m := re.match(r"([A-Za-z0-9_.-]+)==(\S+)", line.strip()))
    )
    return {name.lower().replace("_", "-"): version for name, version in pins.items()}


def models(bento: Path) -> set[str]:
    info = bentoml.get(f"{bento.parent.name}:{bento.name}").info
    return {str(m.tag).split(":")[0] for service in info.services for m in service.models}


def test_every_bento_builds_with_a_full_lock(built: dict[str, Path]) -> None:
    for name, bento in built.items():
        pins = locked(bento)
        assert pins.get("bentoml") == "1.4.39", name
        assert len(pins) > 20, f"{name}: {len(pins)} packages locked: is locking off?"
        dockerfile = (bento / "env" / "docker" / "Dockerfile").read_text()
        assert "python3.11" in dockerfile or "3.11" in dockerfile, name
        # No usage report from an image: on the stack's internal network it held each start.
        assert "ARG BENTOML_DO_NOT_TRACK=true" in dockerfile, name


def test_each_bento_has_only_its_own_engine_and_models(built: dict[str, Path]) -> None:
    tokenizer, onnx, tf, tenants = (
        locked(built[n]) for n in ("tokenizer", "onnx-runner", "tf-runner", "tenant-runner")
    )
    assert "onnxruntime" not in tokenizer and "tensorflow-cpu" not in tokenizer
    assert "onnxruntime" in onnx and "tensorflow-cpu" not in onnx
    assert "tensorflow-cpu" in tf and "onnxruntime" not in tf
    assert "onnxruntime" in tenants and "tensorflow-cpu" in tenants  # serves both kinds
    assert "torch" not in set().union(tokenizer, onnx, tf, tenants)  # export-time only

    # The default catalogue's models (MiniLM and the demo heads): each bento holds their
    # entries for what it serves.
    entries = catalogue.load(catalogue.DEFAULT).models
    stored = {b: {m.store_name(b) for m in entries if b in m.backends} for b in BACKENDS}
    assert models(built["onnx-runner"]) == stored["onnx"] | stored["onnx-int8"]
    assert models(built["onnx-runner"]) >= {
        "all-minilm-l6-v2-onnx",
        "intent-classifier-onnx",
        "intent-reranker-onnx",
    }
    assert models(built["tf-runner"]) == stored["tf"] == {"all-minilm-l6-v2-tf"}
    # The tokenizer holds each model's tokenizer; the runners are reached by URL, not bundled.
    assert models(built["tokenizer"]) >= {
        "all-minilm-l6-v2-tokenizer",
        "intent-classifier-tokenizer",
        "intent-reranker-tokenizer",
    }
    assert "all-minilm-l6-v2-onnx" not in models(built["tokenizer"])
    assert models(built["bento-bundle"]) >= {"all-minilm-l6-v2-onnx", "all-minilm-l6-v2-tf"}
    for bento in built.values():  # what the services read at start to know what they serve
        assert (bento / "src" / "models" / "catalogue.yaml").is_file(), bento


def test_each_bento_holds_every_file_its_bentofile_includes_and_the_readme(
    built: dict[str, Path],
) -> None:
    """Each bento is built from a folder of only the files its bentofile includes
    (deploy/bentos.py): it holds every tracked file of the checkout that its patterns include, as
    a build from the checkout itself does, and the project's README as its own."""
    # the checkout's tracked files (a file deleted but not yet committed is not there to include)
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=deploy_bentos.ROOT, capture_output=True,
                            text=True, check=True).stdout.split("\0")  # fmt: skip
    listed = [f for f in listed if f and (deploy_bentos.ROOT / f).is_file()]
    for name, bento in built.items():
        spec = yaml.safe_load((deploy_bentos.ROOT / deploy_bentos.BENTOS[name]).read_text())
        include = PathSpec.from_lines("gitwildmatch", spec.get("include") or ["*"])
        exclude = PathSpec.from_lines("gitwildmatch", spec.get("exclude") or [])
        wanted = {f for f in listed if include.match_file(f) and not exclude.match_file(f)}
        held = {p.relative_to(bento / "src").as_posix() for p in (bento / "src").rglob("*")}
        assert wanted and not wanted - held, (name, sorted(wanted - held))
        readme = (deploy_bentos.ROOT / "README.md").read_text()
        assert (bento / "README.md").read_text() == readme, name


def test_the_build_script_refuses_an_unknown_bento(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        deploy_bentos.main(["build", "--only", "tokenizer,nope"])
    assert info.value.code == 2 and "nope" in capsys.readouterr().err


def sources(bento: Path) -> set[str]:
    src = bento / "src"
    return {p.relative_to(src).as_posix() for p in src.rglob("*.py")}


@pytest.mark.parametrize(
    ("name", "own"),
    [
        ("tokenizer", ("services/",)),
        ("onnx-runner", ("runners/onnx/",)),
        ("tf-runner", ("runners/tf/",)),
        ("tenant-runner", ("runners/tenants/",)),
    ],
)
def test_each_bento_carries_its_own_folder_and_the_shared_core_only(
    built: dict[str, Path], name: str, own: tuple[str, ...]
) -> None:
    files = sources(built[name])
    assert "serving/batching/queue.py" in files and "serving/protocol.py" in files
    assert any(f.startswith(own) for f in files), (name, sorted(files))
    # What the runners share among themselves (runners/*.py) is a runner's own; nothing else is.
    runner_common = {f for f in files if f.startswith("runners/") and f.count("/") == 1}
    foreign = {f for f in files if not f.startswith(("serving/", *own)) and f not in runner_common}
    if name == "tokenizer":
        foreign |= runner_common  # the public service carries no runner code at all
    assert not foreign, (
        f"{name} carries code of other services or of the build pipeline: {sorted(foreign)}"
    )
