"""Calls to the runners: backend routing, a retry on dead connections, overload passed through."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import numpy as np
from bentoml.exceptions import BentoMLException

from runners.batching import Overloaded
from runners.batching.admission import Admission
from runners.batching.metrics import Recorder
from runners.errors import ApiError
from services.tokenizer.coalesce import Coalescer, Embedded
from services.tokenizer.settings import Backend, TokenizerSettings


class RunnerUnavailable(Overloaded):
    def __init__(self, runner: str, why: str) -> None:
        super().__init__(503, 1, f"{runner} is unavailable ({why}); retry shortly")


async def _call(runner: str, send: Callable[[], Awaitable[Any]]) -> Any:
    # A keep-alive connection the runner has just closed (restart, idle timeout) fails at once;
    # inference is idempotent, so one retry on a fresh connection is safe.
    for attempt in (1, 2):
        try:
            return await send()
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            if attempt == 2:
                raise RunnerUnavailable(runner, type(exc).__name__) from exc
        except BentoMLException as exc:
            status = int(exc.error_code)
            if status in (429, 503):
                raise Overloaded(
                    status, _retry_after(str(exc)), f"{runner}: {_reason(str(exc))}"
                ) from exc
            if 400 <= status < 500 or status == 507:  # the caller's mistake: pass it on
                raise ApiError(_reason(str(exc)), status) from exc
            raise
    raise AssertionError("unreachable")


def _body(text: str) -> dict[str, Any]:
    try:
        body = json.loads(text)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _retry_after(text: str) -> float:
    return float(_body(text).get("retry_after", 1))


def _reason(text: str) -> str:
    return str(_body(text).get("error", text[:200]))


def _budget(seconds: float) -> float:
    # Never zero or negative (the runner would refuse the call as invalid rather than as late): a
    # budget already spent still reaches the runner, which answers 503 at once.
    return max(seconds, 0.001)


def _field(result: Any, name: str) -> Any:
    # Typed proxies (same graph, pickle) return the model; URL proxies (JSON) return a dict.
    return result[name] if isinstance(result, dict) else getattr(result, name)


def _embedded(result: Any) -> Embedded:
    return Embedded(
        vectors=np.asarray(_field(result, "embeddings"), dtype=np.float32),
        queue_ms=float(_field(result, "queue_ms")),
        inference_ms=float(_field(result, "inference_ms")),
    )


class Runners:
    """A coalescer per backend in front of the embedding runners; calls to the tenant runner."""

    def __init__(self, onnx: Any, tf: Any, tenants: Any, settings: TokenizerSettings) -> None:
        self.tenants = tenants

        async def onnx_call(variant: str, ids: list[list[int]], deadline_s: float) -> Embedded:
            return _embedded(
                await _call(
                    "onnx_runner",
                    lambda: onnx.to_async.embed(
                        ids=ids, variant=variant, deadline_s=_budget(deadline_s)
                    ),
                )
            )

        async def tf_call(ids: list[list[int]], deadline_s: float) -> Embedded:
            return _embedded(
                await _call(
                    "tf_runner", lambda: tf.to_async.embed(ids=ids, deadline_s=_budget(deadline_s))
                )
            )

        def coalescer(backend: Backend, send) -> Coalescer:
            admission = Admission(
                settings.max_waiting_tokens,
                settings.deadline_s,
                on_shed=Recorder("tokenizer", backend).shed,
            )
            return Coalescer(send, max_inflight=settings.runner_inflight, admission=admission)

        self.backends: dict[Backend, Coalescer] = {
            "onnx": coalescer("onnx", lambda ids, left: onnx_call("fp32", ids, left)),
            "onnx-int8": coalescer("onnx-int8", lambda ids, left: onnx_call("int8", ids, left)),
            "tf": coalescer("tf", tf_call),
        }

    async def embed(self, backend: Backend, ids: list[list[int]]) -> Embedded:
        return await self.backends[backend].embed(ids)

    async def tenant(self, endpoint: str, **kwargs: Any) -> Any:
        """A tenant runner call (classify or a registry operation), answered as plain data."""
        call = getattr(self.tenants.to_async, endpoint)
        result = await _call("tenant_runner", lambda: call(**kwargs))
        return result.model_dump() if hasattr(result, "model_dump") else result
