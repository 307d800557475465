"""Typed clients of the runners: one class per runner, the same answer types however it is reached.

A runner is a dependency in the same ``bentoml serve`` graph (its answers arrive as the models
themselves) or a URL (one container each; answers arrive as JSON): ``_as`` turns either into the
declared type of ``serving.protocol``. Every call retries once on a dead connection and passes a
runner's overload (429/503 + Retry-After) and the caller's mistakes (4xx) through as they are.

The hot calls (embed, classify) go through ``HotCalls``: BentoML's wire format to the runner, on a
lean HTTP/1.1 connection (services/tokenizer/hop.py), without its generic client's per-call work;
where that client cannot run (serving/internals.py), through BentoML's own client's public calls.
"""

from __future__ import annotations

import asyncio
import json
import pickle
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import numpy as np
import orjson
from bentoml.exceptions import BentoMLException
from pydantic import BaseModel

from services.tokenizer.coalesce import Embedded
from services.tokenizer.hop import HopClient, Unreachable, hop_for
from serving import internals
from serving.errors import ApiError, Overloaded
from serving.protocol import (
    Classified,
    Deleted,
    Registered,
    TenantFormat,
    TenantInfo,
    Variant,
)

if TYPE_CHECKING:  # the gate's module imports this one
    from services.tokenizer.replica_wait import ReplicaWait

Model = TypeVar("Model", bound=BaseModel)


class RunnerUnavailable(Overloaded):
    def __init__(self, runner: str, why: str) -> None:
        super().__init__(503, 1, f"{runner} is unavailable ({why}); retry shortly")


class NoReplica(RunnerUnavailable):
    """The call never reached a replica: none is up (the proxy's ``no_replica`` answer), or no
    connection to the runner opens. Sending it again is safe; services/tokenizer/replica_wait.py
    waits for one."""


def _no_replica(body: dict[str, Any]) -> bool:
    # The proxy's own 503 when a runner service has no replica up (deploy/proxy/haproxy.cfg).
    return body.get("no_replica") is True


def _as(model: type[Model], result: Any) -> Model:
    if type(result) is model:
        return result
    # BentoML's own client answers with its copy of the model (a subclass) or a dict (JSON).
    data = result.model_dump() if isinstance(result, BaseModel) else result
    return model.model_validate(data)


def _body(text: str) -> dict[str, Any]:
    try:
        body = json.loads(text)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


async def _call(runner: str, send: Callable[[], Awaitable[Any]]) -> Any:
    # One retry on a fresh connection: for a keep-alive connection the runner closed as the call
    # went out (restart, idle timeout), the call never reached it. A call cut mid-way or timed out
    # may have been computed; computing an embedding or a classification twice costs the runner
    # the work, nothing else, and a registry call retried after a runner died mid-way at worst
    # publishes one more complete version.
    for attempt in (1, 2):
        try:
            return await send()
        except TimeoutError as exc:  # first: aiohttp's read timeout is a connection error too
            if attempt == 2:
                raise RunnerUnavailable(runner, type(exc).__name__) from exc
        except (Unreachable, aiohttp.ClientConnectorError) as exc:  # no connection opened
            if attempt == 2:
                raise NoReplica(runner, type(exc).__name__) from exc
        except (aiohttp.ClientConnectionError, ConnectionError) as exc:  # one dropped
            if attempt == 2:
                raise RunnerUnavailable(runner, type(exc).__name__) from exc
        except BentoMLException as exc:
            status, body = int(exc.error_code), _body(str(exc))
            reason = str(body.get("error", str(exc)[:200]))
            if body.get("detail"):  # a validation error: the fields and reasons, not the summary
                reason = f"{reason}: {body['detail']}"
            if status == 503 and _no_replica(body):
                raise NoReplica(runner, reason) from exc
            if status in (429, 503):
                retry_after = float(body.get("retry_after", 1))
                raise Overloaded(status, retry_after, f"{runner}: {reason}") from exc
            if 400 <= status < 500 or status == 507:  # the caller's mistake: pass it on
                raise ApiError(reason, status) from exc
            raise
    raise AssertionError("unreachable")


PICKLE = "application/vnd.bentoml+pickle"  # BentoML's media type between services


class HotCalls:
    """A runner's hot APIs (embed, classify), called as BentoML's client would call them: pickle in
    the graph, JSON by URL (the client's ``media_type``), BentoML's status-to-exception mapping,
    but on the lean hop (services/tokenizer/hop.py) where there is one. What it leaves out, per
    call: validating our own arguments with pydantic before sending them (the runner validates
    them), OpenTelemetry's header propagation (the hot routes are not traced), an async-iterator
    body, and validating the answer into a model again. Without a hop (an in-process runner, or a
    BentoML whose client it does not know), BentoML's own client makes the call.
    tests/unit/test_clients.py pins that the runner reads these calls and that the answers equal
    BentoML's client's."""

    def __init__(self, client: Any, mode: str = "auto") -> None:
        self.client = client
        self.mode = mode  # the tokenizer's lean_path setting
        self._hop: HopClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def post(
        self, api: str, body: dict[str, Any], headers: Mapping[str, str] | None = None
    ) -> Any:
        hop = self._hop_here()
        if hop is None:
            if headers:
                return await internals.call_with_headers(self.client, api, body, dict(headers))
            return await getattr(self.client, api)(**body)
        pickled = self.client.media_type == PICKLE
        data = pickle.dumps(body, protocol=5) if pickled else orjson.dumps(body)
        sent = {"content-type": self.client.media_type, **(headers or {})}
        reply = await hop.post(internals.endpoint_route(self.client, api), data, sent)
        if reply.status >= 400:  # as BentoML's client maps an error answer
            status = HTTPStatus(reply.status)
            error = BentoMLException.error_mapping.get(status, BentoMLException)
            raise error(reply.body.decode("utf-8", "replace"), error_code=status)
        return _decode(pickled, reply.body, reply.headers.get("buffer-lengths"))

    def _hop_here(self) -> HopClient | None:
        # One pool per event loop: connections belong to the loop that opened them.
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._hop, self._loop = hop_for(self.client, self.mode), loop
        return self._hop


def _decode(pickled: bool, raw: bytes, lengths: str | None) -> Any:
    if not pickled:
        return orjson.loads(raw)
    # BentoML's pickle body: the pickle, then its out-of-band buffers (the arrays' bytes).
    payload = internals.Payload((raw,), {"buffer-lengths": lengths} if lengths else {})
    return internals.PickleSerde().deserialize_value(payload)


def _field(answer: Any, name: str) -> Any:
    """A field of a runner's answer: a dict (JSON, the lean hop) or the model itself (BentoML's
    client in the graph)."""
    return answer[name] if isinstance(answer, dict) else getattr(answer, name)


def _budget(seconds: float) -> float:
    # Never zero or negative (the runner would refuse the call as invalid rather than as late): a
    # budget already spent still reaches the runner, which answers 503 at once.
    return max(seconds, 0.001)


def _embedded(answer: dict[str, Any]) -> Embedded:
    """EmbedResult's fields (serving.protocol), as the runner sends them."""
    return Embedded(
        vectors=np.asarray(_field(answer, "embeddings"), dtype=np.float32),
        queue_ms=float(_field(answer, "queue_ms")),
        inference_ms=float(_field(answer, "inference_ms")),
    )


# The model of every engine-runner call, in a header: the proxy in front of one container per model
# routes by it (deploy/proxy/haproxy.cfg); in the development graph nothing reads it.
MODEL_HEADER = "X-Bundle-Model"


class OnnxRunnerClient:
    """The ONNX runner, for one model on one of its backends (fp32: onnx, int8: onnx-int8)."""

    def __init__(self, proxy: Any, model: str, variant: Variant, mode: str = "auto") -> None:
        self.hot = HotCalls(proxy.to_async, mode)
        self.model, self.variant = model, variant
        self.headers = {MODEL_HEADER: model}

    async def embed(
        self, ids: list[list[int]], deadline_s: float, segments: list[int] | None = None
    ) -> Embedded:
        body: dict[str, Any] = {
            "ids": ids,
            "model": self.model,
            "variant": self.variant,
            "deadline_s": _budget(deadline_s),
        }
        if segments is not None:  # absent, not null (see TenantRunnerClient._for)
            body["segments"] = segments
        send = lambda: self.hot.post("embed", body, self.headers)  # noqa: E731
        return _embedded(await _call("onnx_runner", send))


class TFRunnerClient:
    """The TensorFlow runner, for one model."""

    def __init__(self, proxy: Any, model: str, mode: str = "auto") -> None:
        self.hot = HotCalls(proxy.to_async, mode)
        self.model = model
        self.headers = {MODEL_HEADER: model}

    async def embed(
        self, ids: list[list[int]], deadline_s: float, segments: list[int] | None = None
    ) -> Embedded:
        body: dict[str, Any] = {"ids": ids, "model": self.model, "deadline_s": _budget(deadline_s)}
        if segments is not None:
            body["segments"] = segments
        send = lambda: self.hot.post("embed", body, self.headers)  # noqa: E731
        return _embedded(await _call("tf_runner", send))


# The tenant of every tenant-runner call, in a header: the proxy in front of tenant-runner replicas
# routes by it (deploy/proxy/haproxy.cfg), so each tenant's model is loaded on one replica.
TENANT_HEADER = "X-Bundle-Tenant"


class TenantRunnerClient:
    """The multi-tenant runner: classification and the tenant registry."""

    name = "tenant_runner"

    def __init__(self, proxy: Any, mode: str = "auto", replicas: ReplicaWait | None = None) -> None:
        """``replicas``: where classify calls and a tenant's look-up (``show``, which a classify
        request may need first) wait while the runner has no replica up (None: refused). The
        registry's other calls (rare; writes, and the listing) are refused at once."""
        self.proxy = proxy.to_async
        self.hot = HotCalls(self.proxy, mode)
        self.replicas = replicas

    async def _held(self, send: Callable[[], Awaitable[Any]]) -> Any:
        # A call that may wait for a replica (see __init__).
        return await (send() if self.replicas is None else self.replicas.call(send))

    def _for(self, tenant: str, api: str, **kwargs: Any) -> Callable[[], Awaitable[Any]]:
        # The registry's calls, with BentoML's client and the tenant header
        # (tests/unit/test_clients.py pins that it arrives).
        # Absent, not None: BentoML's JSON client encodes an optional argument by the schema's
        # first type (an array), and None is not one.
        kwargs = {"tenant": tenant, **{k: v for k, v in kwargs.items() if v is not None}}
        headers = {TENANT_HEADER: tenant}
        return lambda: internals.call_with_headers(self.proxy, api, kwargs, headers)

    async def classify(
        self,
        tenant: str,
        ids: list[list[int]] | None,
        vectors: np.ndarray | None,
        encoder: str | None = None,
    ) -> Classified:
        """With the texts' SentencePiece ids (whole-model tenants), their vectors by ``encoder``
        (head tenants) or both, when the caller does not know which the tenant is."""
        body: dict[str, Any] = {"tenant": tenant}
        if ids is not None:  # absent, not null (see _for)
            body["ids"] = ids
        if vectors is not None:
            body["vectors"] = vectors.tolist()
            body["encoder"] = encoder
        headers = {TENANT_HEADER: tenant}
        send = lambda: _call(self.name, lambda: self.hot.post("classify", body, headers))  # noqa: E731
        return _as(Classified, await self._held(send))

    async def train(
        self,
        tenant: str,
        intents: list[str],
        format: TenantFormat,
        *,
        ids: list[list[int]] | None = None,
        vectors: np.ndarray | None = None,
        encoder: str | None = None,
    ) -> Registered:
        send = self._for(
            tenant, "train", intents=intents, format=format, ids=ids,
            vectors=None if vectors is None else vectors.tolist(), encoder=encoder,
        )  # fmt: skip
        return _as(Registered, await _call(self.name, send))

    async def upload(self, tenant: str, file: Path) -> Registered:
        return _as(Registered, await _call(self.name, self._for(tenant, "upload", file=file)))

    async def list_tenants(self) -> list[str]:
        return [str(name) for name in await _call(self.name, self.proxy.list_tenants)]

    async def show(self, tenant: str) -> TenantInfo:
        return _as(
            TenantInfo, await self._held(lambda: _call(self.name, self._for(tenant, "show")))
        )

    async def delete(self, tenant: str) -> Deleted:
        return _as(Deleted, await _call(self.name, self._for(tenant, "delete")))
