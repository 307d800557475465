"""Vectors on the wire: JSON floats, or base64 of their little-endian float32 bytes.

base64 is what OpenAI's API sends (its SDK asks for it by default and decodes it): 4 bytes a number,
under half the bytes of JSON floats written from float32 (docs/decisions/0007-per-request-trims.md),
and less to format and parse on both sides."""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np

Encoding = Literal["float", "base64"]


def encode(vectors: np.ndarray, encoding: Encoding) -> list[Any]:
    """One entry per row: the row itself (written as JSON numbers by ``serving.replies``), or a
    base64 string of its float32 bytes."""
    if encoding == "base64":
        little = vectors.astype("<f4", copy=False)
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in little]
    return list(vectors)
