"""The public JSON contract. Limits come from the settings; unknown fields are refused (400).

Optional fields are not nullable: BentoML's OpenAPI drops the ``| None`` of optional fields, so the
documented schema is the value's own type, and an explicit null is refused like any other value of
the wrong type. Their default is None, for "not given" (hence the ``type: ignore`` on each)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    FiniteFloat,
    SerializerFunctionWrapHandler,
    StringConstraints,
    TypeAdapter,
    WithJsonSchema,
    model_serializer,
)

from services.tokenizer.settings import SETTINGS
from services.tokenizer.vectors import Encoding
from serving.catalogue import Backend
from serving.tenant_names import MAX_LABEL_CHARS, MAX_LABELS

# A text to embed must say something: empty or blank strings are refused, not embedded as [CLS][SEP].
# "Something" is a character that is white space in no regex dialect: `\S` differs between the
# validator (Rust's regex) and clients reading the OpenAPI schema (ECMA-262), e.g. on U+0085.
VISIBLE = r"[^\t\n\v\f\r \x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
Text = Annotated[
    str, StringConstraints(min_length=1, max_length=SETTINGS.max_chars, pattern=VISIBLE)
]
# Tokenizing an empty string is meaningful (it gives the special tokens), so only length is limited.
AnyText = Annotated[str, StringConstraints(max_length=SETTINGS.max_chars)]


class Request(BaseModel):
    # Unknown fields are refused, and so are values of the wrong JSON type (strict: `false` is not
    # a threshold, "3" not a number): what the OpenAPI schema says is exactly what is accepted.
    model_config = ConfigDict(extra="forbid", strict=True)


ModelName = Annotated[str, StringConstraints(min_length=1, max_length=63)]


class EmbedRequest(Request):
    texts: list[Text] = Field(
        min_length=1, max_length=SETTINGS.max_texts, description="Texts to embed."
    )
    model: ModelName = Field(  # type: ignore[assignment]
        None,
        description="An embed model of GET /v1/models (default: the catalogue's first).",
        validate_default=False,
    )
    backend: Backend = Field(  # type: ignore[call-overload]
        None,
        description="onnx (fp32), onnx-int8 or tf, as the model is built (default: its first).",
        validate_default=False,
    )
    encoding: Encoding = Field(
        "float",
        description="float: lists of numbers; base64: each vector's little-endian float32 bytes, "
        "base64-encoded (under half the bytes; numpy.frombuffer(base64.b64decode(v), '<f4')).",
    )
    dimensions: Annotated[int, Field(ge=1)] = Field(  # type: ignore[assignment]
        None,
        description="A shorter vector, where the model offers it (Matryoshka): its first "
        "dimensions, normalised again.",
        validate_default=False,
    )


class EmbedResponse(BaseModel):
    embeddings: list[list[float]] | list[str] = Field(
        description="One vector per text, in order (base64 strings when asked): the model's "
        "width, or the dimensions asked for."
    )
    model: str = Field(description="The model that answered.")
    backend: Backend
    tokens: list[int] = Field(
        description="Tokens per text after truncation, the model's special tokens included."
    )


class SimilarityRequest(Request):
    pairs: list[tuple[Text, Text]] = Field(
        min_length=1, max_length=SETTINGS.max_pairs, description="Text pairs."
    )
    threshold: Annotated[FiniteFloat, Field(ge=-1, le=1)] = Field(  # type: ignore[assignment]
        None,
        description="When given, labels[i] = 1 if scores[i] >= threshold else 0.",
        validate_default=False,
    )
    model: ModelName = Field(  # type: ignore[assignment]
        None, description="An embed model (default: the catalogue's first).", validate_default=False
    )
    backend: Backend = Field(  # type: ignore[call-overload]
        None,
        description="onnx, onnx-int8 or tf (default: the model's first).",
        validate_default=False,
    )


def _without_null(data: dict[str, Any], name: str) -> dict[str, Any]:
    # An optional field is left out, not sent as `null`: `null` would break the documented
    # schema (see the module's docstring), and clients test for the key.
    if data.get(name) is None:
        data.pop(name, None)
    return data


class SimilarityResponse(BaseModel):
    scores: list[float] = Field(description="Cosine similarity of each pair's sentence vectors.")
    labels: list[Literal[0, 1]] | None = Field(
        None, description="Present when a threshold was given."
    )

    @model_serializer(mode="wrap")
    def _absent_not_null(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_null(handler(self), "labels")


class TokenizeRequest(Request):
    texts: list[AnyText] = Field(min_length=1, max_length=SETTINGS.max_texts)
    model: ModelName = Field(  # type: ignore[assignment]
        None,
        description="The model whose tokenizer to use, any of GET /v1/models' (default: the "
        "catalogue's first embed model).",
        validate_default=False,
    )
    tokenizer: Literal["model", "sentencepiece", "minilm"] = Field(
        "model",
        description="model: the model's own tokenizer, its special tokens included; "
        "sentencepiece: the unigram model tenants' whole models read; minilm: what `model` was "
        "called when one model was served, kept for the clients that send it.",
    )


class TokenizeResponse(BaseModel):
    ids: list[list[int]]


TenantName = Annotated[
    str, Field(description="Checked by the service: invalid names get 422, unknown ones 404.")
]
Intent = Annotated[str, StringConstraints(min_length=1, max_length=MAX_LABEL_CHARS)]


def _form_text(value: Any) -> Any:
    # BentoML parses every multipart form field as JSON when it can, so `-F tenant=123` arrives as
    # the number 123 (and `true` as a bool): a form field is text, so turn it back into its text.
    return value if isinstance(value, str) else json.dumps(value)


FormText = Annotated[str, BeforeValidator(_form_text)]


class ClassifyRequest(Request):
    tenant: TenantName
    texts: list[Text] = Field(min_length=1, max_length=SETTINGS.max_texts)


class Example(Request):
    text: Text
    intent: Intent


MAX_INTENTS = MAX_LABELS  # labels a tenant model may have (the store's manifest holds as many)


class TrainRequest(Request):
    tenant: TenantName
    examples: list[Example] = Field(min_length=2, max_length=10_000)
    format: Literal["head", "onnx", "tf"] = Field(
        "head",
        description="head (default): a layer over a served sentence encoder, trained on request "
        "in moments, always in memory; onnx or tf: a whole model of the tenant's own.",
    )
    encoder: ModelName = Field(  # type: ignore[assignment]
        None,
        description="head: the embed model whose vectors it reads (default: the catalogue's "
        "first); the head is scored with that model only.",
        validate_default=False,
    )


class TenantRequest(Request):
    tenant: TenantName


class RerankRequest(Request):
    query: Text = Field(description="What the texts are ranked against; kept whole.")
    texts: list[Text] = Field(
        min_length=1,
        max_length=SETTINGS.max_documents,
        description="Texts to score against the query, each as a (query, text) pair.",
    )
    model: ModelName = Field(  # type: ignore[assignment]
        None,
        description="A rerank model (default: the catalogue's first).",
        validate_default=False,
    )
    top_n: Annotated[int, Field(ge=1)] = Field(  # type: ignore[assignment]
        None, description="Return the best top_n only (default: all).", validate_default=False
    )
    raw_scores: bool = Field(False, description="The head's logit, not its sigmoid (0 to 1).")
    return_text: bool = Field(False, description="Each result carries its text.")
    truncate: bool = Field(
        True,
        description="Cut a pair longer than the model reads from its text's end; false: a 400 "
        "naming the text instead.",
    )


class Ranked(BaseModel):
    index: int = Field(description="The text's position in the request.")
    score: float = Field(description="Relevance: sigmoid of the logit, or the logit (raw_scores).")
    text: str | None = Field(None, description="The text, when return_text was set.")

    @model_serializer(mode="wrap")
    def _absent_not_null(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_null(handler(self), "text")


def _inputs(value: Any) -> Any:
    # One text is one input: the shape every classification server takes. A pair arrives as a JSON
    # array; validated after this function, in Python's mode, a strict tuple takes a tuple only.
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [tuple(item) if isinstance(item, list) else item for item in value]
    return value


# What a client may send as /predict's inputs, as its schema says it: the validator below takes one
# text too, and the item counts belong on the arrays (on the field they would read as a string's).
_PREDICT_INPUTS_SCHEMA = TypeAdapter(
    Text
    | Annotated[list[Text], Field(min_length=1, max_length=SETTINGS.max_texts)]
    | Annotated[list[tuple[Text, Text]], Field(min_length=1, max_length=SETTINGS.max_texts)]
).json_schema()


class PredictRequest(Request):
    inputs: Annotated[
        list[Text] | list[tuple[Text, Text]],
        BeforeValidator(_inputs),
        WithJsonSchema(_PREDICT_INPUTS_SCHEMA),
    ] = Field(
        description="A text, a list of texts, or a list of [text, text] pairs to classify.",
        min_length=1,
        max_length=SETTINGS.max_texts,
    )
    model: ModelName = Field(  # type: ignore[assignment]
        None,
        description="A classify model (default: the catalogue's first).",
        validate_default=False,
    )
    raw_scores: bool = Field(False, description="The head's logits, not their softmax.")


class LabelScore(BaseModel):
    label: str
    score: float


class PredictResponse(BaseModel):
    predictions: list[list[LabelScore]] = Field(
        description="For each input, in order, every label with its score, the best first."
    )
    model: str = Field(description="The model that answered.")


class InferenceRequest(Request):
    """One text to embed (the single-text contract: input_text in, outputs out)."""

    input_text: Text


class InferenceResponse(BaseModel):
    outputs: list[float] = Field(description="The sentence embedding of input_text.")
