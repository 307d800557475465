"""The catalogue's models as the public service serves them: each one's spec, tokenizer and
coalescing queue per backend; and the rules a request's ``model``, ``backend`` and
``dimensions`` follow (an unknown model is a 404 naming it; a model of another task, a backend it
was not built for, a width it does not offer, a 400 naming the field).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.tokenizer.coalesce import Coalescer
from serving.catalogue import Backend, ModelSpec, Task
from serving.errors import ApiError
from serving.features import PairTooLong, tokenize, tokenize_pairs


@dataclass
class Model:
    spec: ModelSpec
    tokenizer: Any  # tokenizers.Tokenizer: no padding, cut at the model's max_length
    queues: dict[Backend, Coalescer] = field(default_factory=dict)
    # Text pairs' (a head's): cut from the second text only. A tokenizer set so cannot encode a
    # single text that needs cutting, hence one of each.
    pair_tokenizer: Any = None

    @property
    def name(self) -> str:
        return self.spec.name

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return tokenize(self.tokenizer, texts)

    def encode_pairs(
        self,
        pairs: Sequence[tuple[str, str]],
        field: str,
        truncate: bool = True,
        first: str | None = None,
    ) -> tuple[list[list[int]], list[int]]:
        """Pairs as the model's tokenizer encodes them, and where each second text starts. A 400
        for a pair whose first text leaves no room for the second (naming ``first``, the field
        that holds every pair's first text, or ``field[i][0]``), or, with ``truncate`` off, for
        any pair longer than the model reads (naming ``field[i]``)."""
        try:
            ids, segments = tokenize_pairs(self.pair_tokenizer or self.tokenizer, pairs)
        except PairTooLong as exc:
            where = first or f"{field}[{exc.index}][0]"
            raise ApiError(
                f"{where}: too long for {self.name}: with the special tokens it leaves no room "
                f"for the text it is paired with within the {self.spec.max_length} tokens the "
                "model reads",
                400,
            ) from None
        if not truncate:
            for index, pair in enumerate(pairs):
                if len(ids[index]) == self.spec.max_length and self._cut(pair):
                    raise ApiError(
                        f"{field}[{index}]: longer than {self.name} reads "
                        f"({self.spec.max_length} tokens); send truncate: true to cut it",
                        400,
                    )
        return ids, segments

    def _cut(self, pair: tuple[str, str]) -> bool:
        return bool((self.pair_tokenizer or self.tokenizer).encode(*pair).overflowing)

    def backend(self, asked: Backend | None) -> Backend:
        """The backend a request asked for (default: the model's first), or a 400 naming it."""
        if asked is None:
            return self.spec.backends[0]
        if asked not in self.spec.backends:
            raise ApiError(
                f"backend: {self.name} is not built for {asked} (its backends: "
                f"{', '.join(self.spec.backends)})",
                400,
            )
        return asked

    def width(self, dimensions: int | None) -> int | None:
        """The vector width a request asked for: None (the model's own), or one the catalogue
        offers for it; a 400 naming ``dimensions`` otherwise."""
        if dimensions is None or dimensions == self.spec.dim:
            return None
        offered = self.spec.dimensions or ()
        if dimensions not in offered:
            widths = ", ".join(str(d) for d in sorted({self.spec.dim, *offered}))
            raise ApiError(
                f"dimensions: {self.name} gives vectors of {widths} dimensions; not {dimensions}",
                400,
            )
        return dimensions

    def shorten(self, vectors: np.ndarray, width: int | None) -> np.ndarray:
        """Matryoshka: the first ``width`` dimensions, then L2-normalised again where the model's
        vectors are normalised (as text-embeddings-inference does)."""
        if width is None:
            return vectors
        cut = vectors[:, :width]
        if not self.spec.normalize:
            return cut
        norms = np.linalg.norm(cut, axis=1, keepdims=True)
        return (cut / np.maximum(norms, 1e-12)).astype(np.float32)


class Models:
    """Every catalogue model this service serves, by name."""

    def __init__(self, served: dict[str, Model]) -> None:
        self.by_name = served

    def names(self, task: Task | None = None) -> list[str]:
        return [name for name, m in self.by_name.items() if task is None or m.spec.task == task]

    def default(self, task: Task) -> Model | None:
        names = self.names(task)
        return self.by_name[names[0]] if names else None

    def get(self, name: str | None, task: Task | None, route: str) -> Model:
        """The model a request named (default: the first of ``task``, or of embed when any task
        will do), or the error that names it: a 404 for one not served here, a 400 for one of
        another task."""
        if name is None:
            task = task or "embed"
            model = self.default(task)
            if model is None:
                raise ApiError(f"{route}: no {task} model is served here", 404)
            return model
        model = self.by_name.get(name)
        if model is None:
            raise ApiError(
                f"model: {name!r} is not served here (models: {', '.join(self.by_name)})", 404
            )
        if task is not None and model.spec.task != task:
            raise ApiError(
                f"model: {name} is a model for {model.spec.task}; {route} takes {task} models "
                f"({', '.join(self.names(task)) or 'none served here'})",
                400,
            )
        return model
