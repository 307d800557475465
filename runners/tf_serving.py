"""TF Serving's REST API, mounted on every embedding runner (ONNX and TF alike), under ``/v1``.

- ``POST /v1/models/{name}[/versions/{n}|/labels/{label}]:predict`` with ``instances`` (row format:
  one object per sequence, ``{"input_ids": [...], "attention_mask": [...]}``) → ``{"predictions"}``,
  or ``inputs`` (columnar: ``{"input_ids": [[...]], ...}``) → ``{"outputs"}``; ``signature_name``.
- ``GET /v1/models/{name}[/versions/{n}|/labels/{label}]``: version status.
- ``GET /v1/models/{name}[...]/metadata``: the signature def, from the model's contract.

Each catalogue model the runner serves is a servable under its own name (its int8 backend under
the name and ``-int8``), and ``model``, the name TF Serving's own image serves by default, is the
runner's first model, so TF Serving's clients work unchanged. Errors are ``{"error": "..."}`` with
TF Serving's messages and status codes (a shed request's 429 or 503 adds ``"retry_after"`` and a
``Retry-After`` header). Each model has one version, 1, labelled ``stable`` (TF Serving has no
labels unless configured; these are ours). Padding is stripped using the mask, and the sequences go
through the same batcher as ``/embed`` (re-padded per batch, batched with every other caller).
Departures from TF Serving, each to refuse less or say more: ``attention_mask`` and
``token_type_ids`` may be left out (the model needs only the ids; one segment is served here, so
token types must be 0, and only a model that takes them accepts them), instances may differ in
length, and an unknown input name is refused in both forms.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import bentoml
from pydantic import BeforeValidator, Field, TypeAdapter, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from serving.batching import Batcher
from serving.catalogue import Entry, ModelSpec
from serving.contracts import Contract
from serving.error_bodies import ConformingErrors
from serving.errors import ApiError, Overloaded
from serving.openapi_docs import OpenApiDocs
from serving.protocol import MAX_SEQUENCES, MAX_TOKENS, TokenIds, check_ids
from serving.replies import reply

MOUNT = "/v1"  # where the runners mount this app (@bentoml.asgi_app(..., path=MOUNT))
# The hot routes, for the tracing exclusion (``{x}`` is one path segment).
PREDICT_ROUTES = [
    f"{MOUNT}/models/{{name}}:predict",
    f"{MOUNT}/models/{{name}}/versions/{{n}}:predict",
    f"{MOUNT}/models/{{name}}/labels/{{label}}:predict",
]
SIGNATURE = "serving_default"
# Two sequences padded to one length, as TF Serving clients send them: what the Swagger UI's "Try
# it out" sends (ids every vocabulary has; /tokenize gives a text's).
EXAMPLE = {
    "inputs": {
        "input_ids": [[2, 10, 11, 12, 3], [2, 13, 3, 0, 0]],
        "attention_mask": [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]],
    }
}
VERSION = 1
LABELS = {"stable": VERSION}
# TF Serving's own URL grammar (http_rest_api_util.cc), case-insensitive as its (?i) regexes are
# (from /models on: the /v1 of the mount is BentoML's, and matched as written).
_URL = re.compile(
    r"^/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+)|/labels/(?P<label>[^/:]+))?"
    r"(?::(?P<verb>predict)|/(?P<metadata>metadata))?$",
    re.IGNORECASE,
)
_DTYPES = {"int64": "DT_INT64", "int32": "DT_INT32", "float32": "DT_FLOAT"}
# The same limits as the runner's own API (sequence length, sequences per call); each model's own
# (its vocabulary, its length) are checked once the model is known.
_validate_ids = TypeAdapter(TokenIds).validate_python


def _not_a_bool(value: object) -> object:
    # pydantic's lax int takes JSON true as 1; a boolean is not a token id, nor a mask value.
    if isinstance(value, bool):
        raise ValueError("must be an integer, not a boolean")
    return value


_Int = Annotated[int, BeforeValidator(_not_a_bool)]
# The ids' shape: rows of integers; then the limits, on the sequences with padding stripped.
_validate_rows = TypeAdapter(list[list[_Int]]).validate_python
# A mask, or token types: rows of 0/1 (a mask's 1.0 is a 1, as TF Serving clients send it).
_validate_flags = TypeAdapter(list[list[Annotated[_Int, Field(ge=0, le=1)]]]).validate_python


class Refused(Exception):
    """A request TF Serving would refuse: its status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    def response(self) -> JSONResponse:
        return JSONResponse({"error": str(self)}, status_code=self.status)


def servable(request: Request, names: Callable[[], Any]) -> tuple[str, re.Match[str]]:
    """The model a URL names (its version or label checked), or Refused as TF Serving words it."""
    match = _URL.match(request.url.path.removeprefix(MOUNT))
    # POST predicts; GET reads a status or the metadata: any other pairing is not a request.
    if match is None or (request.method == "POST") != (match["verb"] is not None):
        raise Refused(400, f"Malformed request: {request.method} {request.url.path}")
    name, version, label = match["name"], match["version"], match["label"]
    if label is not None and label not in LABELS:
        raise Refused(400, f"Unrecognized servable version label: {label}")
    if name not in names():
        spec = f"Specific({name}, {version})" if version else f"Latest({name})"
        raise Refused(404, f"Servable not found for request: {spec}")
    if version is not None and int(version) != VERSION:
        raise Refused(404, f"Servable not found for request: Specific({name}, {version})")
    return name, match


@dataclass(frozen=True)
class Servable:
    """A model as TF Serving's routes serve it: its batcher and its spec."""

    batcher: Batcher
    spec: ModelSpec


def servables(
    batchers: Mapping[tuple[str, str], Batcher],
    specs: Mapping[tuple[str, str], ModelSpec],
    suffixes: Mapping[str, str],
    aliases: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Servable]:
    """Each model of a runner under its TF Serving name (its name, and the suffix of a backend
    that has one: ``-int8``), under its catalogue aliases the same way, and ``model`` (TF
    Serving's default name) for the first."""
    named = {}
    for (name, backend), batcher in batchers.items():
        for base in (name, *(aliases or {}).get(name, ())):
            named[base + suffixes.get(backend, "")] = Servable(batcher, specs[(name, backend)])
    if named:
        named.setdefault("model", next(iter(named.values())))
    return named


def names_of(entries: list[Entry], backends: list[str], suffixes: Mapping[str, str]) -> list[str]:
    """The TF Serving names of ``entries`` on ``backends`` (``servables``' keys, from the
    catalogue alone: for the OpenAPI document, before any model is loaded)."""
    names = [
        base + suffixes.get(b, "")
        for e in entries
        for b in e.backends
        if b in backends
        for base in (e.name, *e.aliases)
    ]
    return [*names, "model"] if names else names


def sequences(body: Any, spec: ModelSpec) -> tuple[str, list[list[int]]]:
    """The request's form ("instances" or "inputs") and its sequences with padding stripped."""
    contract = spec.contract()
    if not isinstance(body, dict):
        raise Refused(400, "JSON Value: request body Is not object")
    signature = body.get("signature_name", SIGNATURE)
    if not isinstance(signature, str):
        raise Refused(400, "'signature_name' key must be a string value.")
    if signature != SIGNATURE:
        raise Refused(400, f'Serving signature name: "{signature}" not found in signature def')
    forms = [key for key in ("instances", "inputs") if key in body]
    if len(forms) != 1:
        raise Refused(
            400,
            "Missing 'inputs' or 'instances' key"
            if not forms
            else "Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist",
        )
    unknown = set(body) - {"signature_name", *forms}
    if unknown:
        raise Refused(400, f"Unknown key(s) in request: {', '.join(sorted(unknown))}")
    form = forms[0]
    columns = _columns(body[form], form, contract)
    ids = _checked(_validate_rows, columns["input_ids"], form, "input_ids")
    flags = {}
    for name in ("attention_mask", "token_type_ids"):
        if name in columns:
            flags[name] = _checked(_validate_flags, columns[name], form, name)
            if [len(r) for r in flags[name]] != [len(r) for r in ids]:
                raise Refused(400, f"{form}: {name} must have the same shape as input_ids")
    if any(any(row) for row in flags.get("token_type_ids", [])):
        raise Refused(400, f"{form}: token_type_ids must be 0: one segment is served here")
    if "attention_mask" in flags:
        mask = flags["attention_mask"]
        ids = [
            [t for t, m in zip(r, keep, strict=True) if m]
            for r, keep in zip(ids, mask, strict=True)
        ]
    # The runner's own limits (sequence length, sequences per call), then the model's.
    ids = _checked(_validate_ids, ids, form, "input_ids")
    try:
        check_ids(ids, spec, field=f"{form}: input_ids")
    except ApiError as exc:
        raise Refused(400, exc.message) from None
    return form, ids


def _checked(validate: Callable[[Any], Any], value: Any, form: str, name: str) -> Any:
    """The value validated, or Refused naming the input and the place: inputs: input_ids[0][3]: …"""
    try:
        return validate(value)
    except ValidationError as exc:
        problem = exc.errors(include_url=False)[0]
        where = "".join(f"[{part}]" for part in problem["loc"])
        raise Refused(400, f"{form}: {name}{where}: {problem['msg']}") from None


def _columns(value: Any, form: str, contract: Contract) -> dict[str, Any]:
    """Name → list of rows, from either form; unknown input names refused, naming them."""
    if form == "inputs":
        if not isinstance(value, dict):
            raise Refused(
                400,
                "inputs is a plain value/list, but expecting an object as multiple input tensors "
                "required as per tensorinfo_map",
            )
        rows = value
    else:
        if not isinstance(value, list) or not value:
            raise Refused(400, "Expecting 'instances' to be a non-empty list/array")
        if not all(isinstance(item, dict) for item in value):
            raise Refused(
                400,
                "instances is a plain list, but expecting list of objects as multiple input "
                "tensors required as per tensorinfo_map",
            )
        keys = set(value[0])
        for i, item in enumerate(value):
            if set(item) != keys:
                raise Refused(
                    400, f"Failed to process element: {i} of 'instances' list: every instance "
                    f"must have the same keys as the first ({', '.join(sorted(keys))})",
                )  # fmt: skip
        rows = {key: [item[key] for item in value] for key in keys}
    for name in rows:
        if name not in contract.input_names:
            raise Refused(
                400,
                f"{form}: does not have named input: {name} "
                f"(inputs: {', '.join(contract.input_names)})",
            )
    if "input_ids" not in rows:
        raise Refused(400, f"Missing named input: input_ids in '{form}'.")
    return rows


def status() -> dict[str, Any]:
    state = {"error_code": "OK", "error_message": ""}
    return {
        "model_version_status": [{"version": str(VERSION), "state": "AVAILABLE", "status": state}]
    }


def metadata(name: str, contract: Contract) -> dict[str, Any]:
    """The signature def as TF Serving's metadata route sends it, from the model's contract."""

    def tensor(spec: Any, tensor_name: str) -> dict[str, Any]:
        dims = [{"size": str(-1 if d is None else d), "name": ""} for d in spec.shape]
        return {
            "dtype": _DTYPES[spec.dtype],
            "tensor_shape": {"dim": dims, "unknown_rank": False},
            "name": tensor_name,
        }

    signature = {
        "inputs": {s.name: tensor(s, f"{SIGNATURE}_{s.name}:0") for s in contract.inputs},
        "outputs": {s.name: tensor(s, f"{s.name}:0") for s in contract.outputs},
        "method_name": "tensorflow/serving/predict",
    }
    return {
        "model_spec": {"name": name, "signature_name": "", "version": str(VERSION)},
        "metadata": {"signature_def": {"signature_def": {SIGNATURE: signature}}},
    }


def tf_serving_app(servables: Callable[[], dict[str, Servable]]) -> Starlette:
    """``servables`` maps a model name to its batcher and spec, read from the running service
    instance."""

    async def predict(request: Request) -> Response:
        try:
            name, _ = servable(request, servables)  # the URL first: a wrong one says so
            raw = await request.body()
            try:
                body = json.loads(raw)
            except (ValueError, RecursionError) as exc:  # (nested deeper than Python parses)
                raise Refused(400, f"JSON Parse error: {str(exc)[:200]}") from None
            served = servables()[name]
            form, ids = sequences(body, served.spec)
            rows, _ = await served.batcher.submit(ids)
        except Refused as exc:
            return exc.response()
        except Overloaded as exc:
            return exc.response()  # {"error": ...} with Retry-After
        return reply({"predictions" if form == "instances" else "outputs": rows})

    async def route(request: Request) -> Response:
        """Every path under /v1: TF Serving's grammar decides, not Starlette's (case, verbs)."""
        if request.method == "POST":
            return await predict(request)
        if request.method == "GET":
            return await describe(request)
        return Refused(400, f"Malformed request: {request.method} {request.url.path}").response()

    async def describe(request: Request) -> JSONResponse:
        try:
            name, match = servable(request, servables)
        except Refused as exc:
            wanted = _URL.match(request.url.path.removeprefix(MOUNT))
            if exc.status == 404 and wanted is not None and not wanted["metadata"]:
                exc = Refused(404, _status_not_found(wanted))  # the status route's own wording
            return exc.response()
        contract = servables()[name].spec.contract()
        return JSONResponse(metadata(name, contract) if match["metadata"] else status())

    # One route for all of /v1 (BentoML's own 404 for what no route matched is plain text).
    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    return Starlette(routes=[Route("/{rest:path}", route, methods=methods)])


def _status_not_found(match: re.Match[str]) -> str:
    """As get_model_status_impl.cc words it."""
    if match["version"]:
        return f"Could not find version {match['version']} of model {match['name']}"
    return f"Could not find any versions of model {match['name']}"


def install(
    service: Any, entries: list[Entry], backends: list[str], suffixes: Mapping[str, str]
) -> None:
    """Mount this API on a runner service (``entries``: the catalogue models it serves on
    ``backends``, each a servable in the instance's ``servables``), document it in the runner's
    OpenAPI document (BentoML documents its own APIs only), and give the runner's 4xx bodies the
    one error format."""
    names = names_of(entries, backends, suffixes)

    def refine(spec: dict[str, Any]) -> dict[str, Any]:
        paths = spec.setdefault("paths", {})
        embed = paths.get("/embed", {}).get("post", {}).get("requestBody", {}).get("content", {})
        for media in embed.values():  # the runner's own API: token ids, as the tokenizer sends
            media["example"] = {"ids": EXAMPLE["inputs"]["input_ids"][:1]}
        paths.update(openapi_paths(names))
        return spec

    service.mount_asgi_app(tf_serving_app(current_servables), path=MOUNT)
    service.add_asgi_middleware(ConformingErrors)
    service.add_asgi_middleware(OpenApiDocs, refine=refine)


def openapi_paths(names: list[str]) -> dict[str, Any]:
    ids = {
        "type": "array",
        "items": {"type": "integer", "minimum": 0},
        "minItems": 1,
        "maxItems": MAX_TOKENS,
    }
    flags = {"type": "array", "items": {"type": "integer", "enum": [0, 1]}}
    types = {"type": "array", "items": {"type": "integer", "enum": [0]}}
    properties = {"input_ids": ids, "attention_mask": flags, "token_type_ids": types}
    row = {  # one sequence; attention_mask and token_type_ids as long as input_ids
        "type": "object",
        "properties": properties,
        "required": ["input_ids"],
        "additionalProperties": False,
    }
    rows = {"type": "array", "items": ids, "minItems": 1, "maxItems": MAX_SEQUENCES}
    columns = {**row, "properties": {k: {**rows, "items": v} for k, v in properties.items()}}
    signature = {"type": "string", "enum": [SIGNATURE]}
    request = {
        "oneOf": [
            {
                "type": "object",
                "properties": {
                    "instances": {"type": "array", "items": row, "minItems": 1},
                    "signature_name": signature,
                },
                "required": ["instances"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {"inputs": columns, "signature_name": signature},
                "required": ["inputs"],
                "additionalProperties": False,
            },
        ]
    }
    vectors = {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}
    predicted = {
        "oneOf": [
            {"type": "object", "properties": {"predictions": vectors}, "required": ["predictions"]},
            {"type": "object", "properties": {"outputs": vectors}, "required": ["outputs"]},
        ]
    }
    error = _answer(
        "TF Serving's error shape",
        {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]},
    )
    described = _answer("TF Serving's answer", {"type": "object"})
    params = {
        "": [],
        "/versions/{version}": [_param("version", {"type": "integer", "enum": [VERSION]})],
        "/labels/{label}": [_param("label", {"type": "string", "enum": list(LABELS)})],
    }
    name = _param("name", {"type": "string", "enum": names})
    paths: dict[str, Any] = {}
    for suffix, extra in params.items():
        base = f"{MOUNT}/models/{{name}}{suffix}"
        paths[f"{base}:predict"] = {
            "post": {
                "summary": "TF Serving predict: instances (rows) or inputs (columns)",
                "parameters": [name, *extra],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": request, "example": EXAMPLE}},
                },
                "responses": {
                    "200": _answer("outputs or predictions", predicted),
                    **{code: error for code in ("400", "404", "429", "503")},
                },
            }
        }
        paths[base] = {
            "get": {
                "summary": "TF Serving model status",
                "parameters": [name, *extra],
                "responses": {"200": described, "400": error, "404": error},
            }
        }
    paths[f"{MOUNT}/models/{{name}}/metadata"] = {
        "get": {
            "summary": "TF Serving model metadata (the signature def)",
            "parameters": [name],
            "responses": {"200": described, "404": error},
        }
    }
    return paths


def _param(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _answer(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def current_servables() -> dict[str, Servable]:
    service = bentoml.get_current_service()
    return service.servables if service is not None else {}
