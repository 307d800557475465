"""The tenant cache with a fake loader: LRU under a byte budget, one load per model."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from runners.settings import RunnerSettings
from runners.tenants.cache import ModelCache
from runners.tenants.loader import LoadedModel
from serving.batching import Batcher
from serving.errors import ApiError

MB = 1 << 20


class FakeLoader:
    def __init__(self, sizes: dict[str, int] | None = None, delay_s: float = 0.0) -> None:
        self.loads: list[tuple[str, str]] = []
        self.sizes = sizes or {}
        self.delay_s = delay_s

    async def __call__(self, tenant: str, version: str) -> LoadedModel:
        self.loads.append((tenant, version))
        await asyncio.sleep(self.delay_s)
        return LoadedModel(
            tenant, version, ["a", "b"], engine=None, nbytes=self.sizes.get(tenant, 2 * MB)
        )


def test_lru_evicts_the_least_recently_used_and_stays_under_budget() -> None:
    loader = FakeLoader()
    evicted: list[str] = []

    async def main():
        cache = ModelCache(
            7 * MB, loader, on_evict=lambda m: evicted.append(m.tenant)
        )  # fits 3 of 2 MB
        for name in ("a", "b", "c"):
            await cache.get(name, "v1")
            assert cache.stats.bytes <= cache.stats.budget
        await cache.get("a", "v1")  # a is now the most recent; b the least
        await cache.get("d", "v1")
        assert cache.stats.bytes <= cache.stats.budget
        return cache

    cache = asyncio.run(main())
    assert evicted == ["b"]
    assert cache.stats.loaded == 3 and cache.stats.bytes == 6 * MB
    assert (cache.stats.hits, cache.stats.misses, cache.stats.evictions) == (1, 4, 1)


def test_bytes_never_exceed_the_budget_with_mixed_sizes() -> None:
    sizes = {f"t{i}": (i % 5 + 1) * MB for i in range(40)}
    loader = FakeLoader(sizes)

    async def main():
        cache = ModelCache(9 * MB, loader)
        for i in [0, 5, 3, 9, 12, 3, 0, 17, 22, 39, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0]:
            await cache.get(f"t{i}", "v")
            assert 0 < cache.stats.bytes <= cache.stats.budget

    asyncio.run(main())


def test_fifty_concurrent_first_requests_load_once() -> None:
    loader = FakeLoader(delay_s=0.05)

    async def main():
        cache = ModelCache(100 * MB, loader)
        models = await asyncio.gather(*(cache.get("acme", "v1") for _ in range(50)))
        return models, cache

    models, cache = asyncio.run(main())
    assert loader.loads == [("acme", "v1")]
    assert all(m is models[0] for m in models)
    assert cache.stats.loads == 1


def test_a_new_version_replaces_the_old_one_in_memory() -> None:
    loader = FakeLoader()

    async def main():
        cache = ModelCache(100 * MB, loader)
        old = await cache.get("acme", "v1")
        new = await cache.get("acme", "v2")
        return old, new, cache

    old, new, cache = asyncio.run(main())
    assert (old.version, new.version) == ("v1", "v2")
    assert cache.stats.loaded == 1 and cache.stats.evictions == 1


def test_a_model_larger_than_the_budget_is_refused() -> None:
    async def main():
        cache = ModelCache(1 * MB, FakeLoader({"big": 5 * MB}))
        await cache.get("big", "v1")

    with pytest.raises(ApiError) as info:
        asyncio.run(main())
    assert info.value.status == 507


def test_a_failed_load_is_retried_by_the_next_request() -> None:
    calls = {"n": 0}

    async def flaky(tenant: str, version: str) -> LoadedModel:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("disk hiccup")
        return LoadedModel(tenant, version, ["a", "b"], None, MB)

    async def main():
        cache = ModelCache(10 * MB, flaky)
        with pytest.raises(OSError):
            await cache.get("acme", "v1")
        return await cache.get("acme", "v1")

    assert asyncio.run(main()).version == "v1"


def test_a_request_running_on_the_old_version_finishes_on_it_when_a_new_one_loads() -> None:
    """What the runner does on /classify (runners/tenants/service.py): take the model for the current
    version from the cache, submit to its batcher. A new version arriving meanwhile evicts the old
    entry, and the request already submitted is still answered by the old model."""
    policy = RunnerSettings().policy
    computing = threading.Event()

    def engine_of(version: str):
        def engine(feeds):  # answers with the version that computed it; v1 slowly
            if version == "v1":
                computing.set()
                time.sleep(0.3)
            return np.full((len(feeds["input_ids"]), 1), float(version[1:]), dtype=np.float32)

        return engine

    async def load(tenant: str, version: str) -> LoadedModel:
        model = LoadedModel(tenant, version, ["a", "b"], engine=engine_of(version), nbytes=MB)
        model.batcher = Batcher(model.engine, policy)
        return model

    async def main():
        cache = ModelCache(100 * MB, load, on_evict=lambda m: m.batcher.close_when_idle())
        old = await cache.get("acme", "v1")
        running = asyncio.create_task(old.batcher.submit([[5, 6]]))
        await asyncio.to_thread(computing.wait, 5)  # the old model is computing this request
        new = await cache.get("acme", "v2")  # the upload's version, loaded by the next request
        after, _ = await new.batcher.submit([[5, 6]])
        before, _ = await running
        await asyncio.sleep(0.05)
        return before, after, old, cache

    before, after, old, cache = asyncio.run(main())
    assert before.tolist() == [[1.0]] and after.tolist() == [[2.0]]
    assert cache.stats.evictions == 1 and cache.stats.loaded == 1  # v1 left the cache …
    assert old.batcher._task.done()  # … and its batcher stopped once its last request was served
