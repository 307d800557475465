"""Tenant models on disk: immutable versions, published atomically, names that cannot escape.

    STORE/<tenant>/versions/<version>/{manifest.json, model.onnx | saved_model/ | head.npz}
    STORE/<tenant>/current -> versions/<version>        (a symlink, swapped with os.replace)
    STORE/.staging/<random>/                            (uploads and trainings being prepared)

A version is written in full under .staging, fsynced, renamed into versions/ and only then made
current by replacing the symlink: a crash at any step leaves the previous version current, and two
concurrent publishes each produce a complete version, the later one current. (BentoML's own store
rewrites its ``latest`` file in place, which a concurrent reader can see empty.)
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import secrets
import shutil
import tarfile
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from serving.errors import ApiError
from serving.protocol import TenantFormat, TenantInfo
from serving.tenant_names import MAX_LABEL_CHARS, MAX_LABELS, NAME, check_name

MANIFEST = "manifest.json"
ONNX_FILE = "model.onnx"
TF_DIR = "saved_model"
HEAD_FILE = "head.npz"
# What each format's version holds beside its manifest.
MODEL_FILES = {"onnx": ONNX_FILE, "tf": TF_DIR, "head": HEAD_FILE}


class UnknownTenant(ApiError):
    status = 404


class InvalidModel(ApiError):
    """An upload or training result refused before it could replace anything."""

    status = 422


# Heads written before manifests named their encoder were all trained on this one model's vectors:
# such a manifest still reads as what it is.
ENCODER_BEFORE_CATALOGUE = "all-MiniLM-L6-v2"


class Manifest(BaseModel):
    """What a tenant model declares: its format, its label set, where it came from; a head, the
    catalogue model whose vectors it reads."""

    model_config = ConfigDict(extra="forbid")
    format: TenantFormat
    labels: list[str] = Field(min_length=2, max_length=MAX_LABELS)
    source: Literal["train", "upload", "demo"] = "upload"
    created: str = ""
    metrics: dict[str, float] = Field(default_factory=dict)
    encoder: str | None = Field(
        None, min_length=1, max_length=63, description="head: the model whose vectors it reads."
    )

    @model_validator(mode="after")
    def _encoder(self) -> Manifest:
        if self.format != "head" and self.encoder is not None:
            raise ValueError(f"encoder: a {self.format} model reads SentencePiece ids, not vectors")
        if self.format == "head" and self.encoder is None:
            self.encoder = ENCODER_BEFORE_CATALOGUE
        return self

    @field_validator("labels")
    @classmethod
    def _unique(cls, labels: list[str]) -> list[str]:
        if len(set(labels)) != len(labels) or any(not label for label in labels):
            raise ValueError("labels must be unique and non-empty")
        if any(len(label) > MAX_LABEL_CHARS for label in labels):
            raise ValueError(f"labels must have at most {MAX_LABEL_CHARS} characters")
        return labels


def read_manifest(directory: Path) -> Manifest:
    try:
        return Manifest.model_validate_json((directory / MANIFEST).read_bytes())
    except FileNotFoundError:
        raise InvalidModel(f"{MANIFEST} is missing") from None
    except ValidationError as exc:
        raise InvalidModel(
            f"{MANIFEST} is invalid: {exc.errors(include_url=False)[0]['msg']}"
        ) from None


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    """Flush a directory's files and entries, so a rename after it never exposes half a model."""
    for p in [*path.rglob("*"), path]:
        _fsync(p)


class TenantStore:
    def __init__(self, root: Path, keep_versions: int = 3) -> None:
        self.root = Path(root)
        self.keep_versions = keep_versions
        (self.root / ".staging").mkdir(parents=True, exist_ok=True)

    def _dir(self, name: str) -> Path:
        return self.root / check_name(name)

    def current(self, name: str) -> tuple[str, Path] | None:
        """(version, directory) of the tenant's current model, or None if the tenant is unknown."""
        link = self._dir(name) / "current"
        try:
            target = os.readlink(link)
        except (FileNotFoundError, NotADirectoryError):
            return None
        version = Path(target).name
        return version, link.parent / "versions" / version

    def require(self, name: str) -> tuple[str, Path]:
        found = self.current(name)
        if found is None:
            raise UnknownTenant(f"unknown tenant {name!r}")
        return found

    def staging(self) -> Path:
        path = self.root / ".staging" / secrets.token_hex(8)
        path.mkdir()
        return path

    def publish(self, name: str, staged: Path) -> str:
        """Make a fully written staging directory the tenant's current version; returns the version."""
        tenant = self._dir(name)
        versions = tenant / "versions"
        versions.mkdir(parents=True, exist_ok=True)
        version = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ") + "-" + secrets.token_hex(3)
        _fsync_tree(staged)
        os.rename(staged, versions / version)  # same filesystem: atomic
        link = tenant / f".current-{secrets.token_hex(4)}"
        os.symlink(f"versions/{version}", link)
        os.replace(link, tenant / "current")  # atomic: readers see the old or the new version
        _fsync(tenant)
        self._prune(tenant)
        return version

    def _prune(self, tenant: Path) -> None:
        current = os.readlink(tenant / "current")
        old = sorted(p for p in (tenant / "versions").iterdir() if f"versions/{p.name}" != current)
        for path in old[: max(0, len(old) - (self.keep_versions - 1))]:
            shutil.rmtree(path, ignore_errors=True)

    def names(self) -> list[str]:
        return sorted(
            p.name
            for p in self.root.iterdir()
            if NAME.fullmatch(p.name) and (p / "current").is_symlink()
        )

    def show(self, name: str) -> TenantInfo:
        version, path = self.require(name)
        manifest = read_manifest(path)
        return TenantInfo(
            tenant=name,
            version=version,
            format=manifest.format,
            labels=manifest.labels,
            source=manifest.source,
            created=manifest.created,
            metrics=manifest.metrics,
            encoder=manifest.encoder,
            bytes=size_of(path),
            versions=sorted(p.name for p in (path.parent).iterdir()),
        )

    def delete(self, name: str) -> None:
        tenant = self._dir(name)
        self.require(name)
        trash = self.root / ".staging" / f"deleted-{name}-{secrets.token_hex(4)}"
        os.rename(
            tenant, trash
        )  # atomic: the tenant disappears at once; loaded copies finish their requests
        shutil.rmtree(trash, ignore_errors=True)

    def archive(self, name: str, out: Path) -> Path:
        """The current version as a .tar.gz that ``unpack`` accepts (the upload format)."""
        _, path = self.require(name)
        with tarfile.open(out, "w:gz") as tar:
            for child in sorted(path.iterdir()):
                tar.add(child, arcname=child.name)
        return out

    def unpack(self, archive: Path, max_bytes: int) -> Path:
        """Extract an uploaded archive into a new staging directory, refusing anything unsafe."""
        if archive.stat().st_size > max_bytes:
            raise InvalidModel(
                f"upload is {archive.stat().st_size} bytes, over the {max_bytes}-byte limit"
            )
        staged = self.staging()
        try:
            with tarfile.open(archive, "r:*") as tar:
                members = tar.getmembers()
                if sum(m.size for m in members) > 4 * max_bytes:
                    raise InvalidModel("upload expands beyond the size limit")
                # The "data" filter refuses absolute paths, '..', links out of the target and devices.
                tar.extractall(staged, filter="data")
        except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
            shutil.rmtree(staged, ignore_errors=True)
            raise InvalidModel(f"upload is not a readable .tar.gz model archive ({exc})") from None
        except InvalidModel:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        return staged

    def clean_staging(self, older_than_s: float = 3600) -> int:
        """Remove what interrupted uploads left behind; returns how many entries went."""
        removed = 0
        for path in (self.root / ".staging").iterdir():
            if time.time() - path.stat().st_mtime > older_than_s:
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
        return removed


def write_manifest(directory: Path, manifest: Manifest) -> None:
    if not manifest.created:
        manifest = manifest.model_copy(
            update={"created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
        )
    (directory / MANIFEST).write_text(json.dumps(manifest.model_dump(), indent=2) + "\n")


def discard(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)
