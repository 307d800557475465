"""JSON replies written once, in Rust: orjson, with NumPy arrays written as they are.

The hot routes answer with vectors. Written by orjson straight from the float32 array, a vector
takes a fraction of the time and fewer bytes than through ``tolist()`` and pydantic's serialiser
(docs/decisions/0007-per-request-trims.md). Each number is the shortest decimal that reads back as
the same float32
(-0.42763337 rather than the float64 expansion -0.4276333749294281): exact, for what the engines
compute in float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson
from starlette.responses import Response

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def _fallback(value: Any) -> Any:
    # orjson writes C-contiguous arrays itself and hands anything else here (a strided view).
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def dumps(content: Any) -> bytes:
    return orjson.dumps(content, default=_fallback, option=_OPTIONS)


def reply(
    content: Any, status_code: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """A JSON response of ``content`` (dicts, lists, str, numbers, NumPy arrays), one sized body."""
    return Response(dumps(content), status_code, headers, "application/json")
