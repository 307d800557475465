"""TF Serving's REST predict API, mounted on every embedding runner (ONNX and TF alike):
``POST /v1/models/{name}:predict``.

Clients written for TF Serving send ``{"inputs": {"input_ids": [[…]], "attention_mask": [[…]]}}``
(padded to a fixed length) and read ``{"outputs": [[…]]}``. Padding is stripped using the mask and the rows go
through the same batcher as everything else, re-padded per batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import bentoml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from serving.batching import Batcher
from serving.errors import Overloaded
from serving.protocol import TokenIds

MOUNT = "/v1"  # where the runners mount this app (@bentoml.asgi_app(..., path=MOUNT))
PREDICT_ROUTE = f"{MOUNT}/models/{{name}}:predict"

Matrix = Annotated[list[list[Annotated[int, Field(ge=0, le=1)]]], Field(min_length=1)]


class PredictInputs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_ids: list[list[int]] = Field(min_length=1)
    attention_mask: Matrix | None = None
    token_type_ids: list[list[int]] | None = None

    @model_validator(mode="after")
    def _same_shape(self) -> PredictInputs:
        for name in ("attention_mask", "token_type_ids"):
            other = getattr(self, name)
            if other is not None and [len(r) for r in other] != [len(r) for r in self.input_ids]:
                raise ValueError(f"{name} must have the same shape as input_ids")
        return self

    def sequences(self) -> list[list[int]]:
        if self.attention_mask is None:
            return self.input_ids
        return [
            [t for t, m in zip(ids, mask, strict=True) if m]
            for ids, mask in zip(self.input_ids, self.attention_mask, strict=True)
        ]


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inputs: PredictInputs
    signature_name: str = "serving_default"


# The same limits as the runner's own API (vocabulary, sequence length, sequences per call).
_validate_ids = TypeAdapter(TokenIds).validate_python


def predict_app(servables: Callable[[], dict[str, Batcher]]) -> Starlette:
    """``servables`` maps a model name to its batcher, read from the running service instance."""

    async def predict(request: Request) -> JSONResponse:
        name = request.path_params["name"]
        batchers = servables()
        if name not in batchers:
            return JSONResponse(
                {"error": f"Servable not found for request: Latest({name})"}, status_code=404
            )
        try:
            body = PredictRequest.model_validate_json(await request.body())
            if body.signature_name != "serving_default":
                return JSONResponse(
                    {"error": f'Serving signature name: "{body.signature_name}" not found'},
                    status_code=400,
                )
            sequences = _validate_ids(body.inputs.sequences())
        except ValidationError as exc:
            return JSONResponse(
                {
                    "error": "invalid predict request",
                    "detail": exc.errors(
                        include_url=False, include_input=False, include_context=False
                    ),
                },
                status_code=400,
            )
        try:
            rows, _ = await batchers[name].submit(sequences)
        except Overloaded as exc:
            return exc.response()
        return JSONResponse({"outputs": rows.tolist()})

    return Starlette(routes=[Route(PREDICT_ROUTE.removeprefix(MOUNT), predict, methods=["POST"])])


def current_servables() -> dict[str, Batcher]:
    service = bentoml.get_current_service()
    return service.servables if service is not None else {}
