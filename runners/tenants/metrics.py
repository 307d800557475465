"""Prometheus metrics of the tenant cache (per runner, never per tenant: thousands of labels would
swamp Prometheus)."""

from __future__ import annotations

import bentoml

from runners.tenants.cache import CacheStats

LOADED = bentoml.metrics.Gauge(
    name="bundle_tenant_models_loaded",
    documentation="Tenant models in memory",
    multiprocess_mode="livesum",
)
BYTES = bentoml.metrics.Gauge(
    name="bundle_tenant_bytes_in_use",
    documentation="Bytes of loaded tenant models",
    multiprocess_mode="livesum",
)
BUDGET = bentoml.metrics.Gauge(
    name="bundle_tenant_budget_bytes",
    documentation="Memory budget for tenant models",
    multiprocess_mode="livesum",
)
HITS = bentoml.metrics.Counter(
    name="bundle_tenant_cache_hits", documentation="Requests whose model was loaded"
)
MISSES = bentoml.metrics.Counter(
    name="bundle_tenant_cache_misses", documentation="Requests that waited for a load"
)
EVICTIONS = bentoml.metrics.Counter(
    name="bundle_tenant_evictions", documentation="Models evicted to stay under budget"
)
HEADS = bentoml.metrics.Gauge(
    name="bundle_tenant_heads_resident",
    documentation="Head tenants in memory (all of them: heads are never evicted)",
    multiprocess_mode="livesum",
)
HEAD_BYTES = bentoml.metrics.Gauge(
    name="bundle_tenant_head_bytes",
    documentation="Bytes of the resident heads' weights",
    multiprocess_mode="livesum",
)
LOAD_SECONDS = bentoml.metrics.Histogram(
    name="bundle_tenant_load_seconds",
    documentation="Time to load a tenant model",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)


class Exporter:
    """Copies CacheStats into the metrics; counters move by what changed since the last call."""

    def __init__(self) -> None:
        self.last = CacheStats()

    def __call__(self, stats: CacheStats) -> None:
        LOADED.set(stats.loaded)
        BYTES.set(stats.bytes)
        BUDGET.set(stats.budget)
        for counter, name in ((HITS, "hits"), (MISSES, "misses"), (EVICTIONS, "evictions")):
            if delta := getattr(stats, name) - getattr(self.last, name):
                counter.inc(delta)
        self.last = CacheStats(**vars(stats))

    def heads(self, count: int, nbytes: int) -> None:
        HEADS.set(count)
        HEAD_BYTES.set(nbytes)
