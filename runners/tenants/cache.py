"""Loaded tenant models under a byte budget: least recently used evicted, one load per model.

Keys are (tenant, version): a new version is a new entry (and evicts its tenant's older ones),
while requests already holding the old entry finish on it.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from runners.tenants.loader import LoadedModel
from serving.errors import ApiError

Key = tuple[str, str]


@dataclass
class CacheStats:
    loaded: int = 0
    bytes: int = 0
    budget: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    loads: int = 0
    load_seconds: float = 0.0


class ModelCache:
    def __init__(
        self,
        budget_bytes: int,
        load: Callable[[str, str], Awaitable[LoadedModel]],
        on_evict: Callable[[LoadedModel], None] = lambda _: None,
        on_load: Callable[[float], None] = lambda _: None,
    ) -> None:
        self.load = load
        self.on_evict = on_evict
        self.on_load = on_load
        self.stats = CacheStats(budget=budget_bytes)
        self._entries: collections.OrderedDict[Key, LoadedModel] = collections.OrderedDict()
        self._loading: dict[Key, asyncio.Future[LoadedModel]] = {}

    async def get(self, tenant: str, version: str) -> LoadedModel:
        key = (tenant, version)
        if key in self._entries:
            self._entries.move_to_end(key)
            self.stats.hits += 1
            return self._entries[key]
        self.stats.misses += 1
        if key not in self._loading:  # the first request loads; the others await the same future
            self._loading[key] = asyncio.ensure_future(self._load(key))
        return await asyncio.shield(self._loading[key])

    async def _load(self, key: Key) -> LoadedModel:
        try:
            model = await self.load(*key)
        finally:
            del self._loading[key]
        self.stats.loads += 1
        self.stats.load_seconds += model.load_seconds
        self.on_load(model.load_seconds)
        self._insert(key, model)
        return model

    def _insert(self, key: Key, model: LoadedModel) -> None:
        if model.nbytes > self.stats.budget:
            raise ApiError(
                f"tenant {key[0]!r}'s model ({model.nbytes} bytes) is larger than the memory budget ({self.stats.budget} bytes)",
                507,
            )
        for stale in [k for k in self._entries if k[0] == key[0]]:  # older versions of this tenant
            self._evict(stale)
        while self._entries and self.stats.bytes + model.nbytes > self.stats.budget:
            self._evict(next(iter(self._entries)))
        self._entries[key] = model
        self.stats.bytes += model.nbytes
        self.stats.loaded = len(self._entries)

    def _evict(self, key: Key) -> None:
        model = self._entries.pop(key)
        self.stats.bytes -= model.nbytes
        self.stats.evictions += 1
        self.stats.loaded = len(self._entries)
        self.on_evict(model)

    def drop(self, tenant: str) -> None:
        for key in [k for k in self._entries if k[0] == tenant]:
            self._evict(key)
