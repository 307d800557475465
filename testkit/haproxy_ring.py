"""HAProxy's consistent hashing with bounded load, modelled from its source, to simulate routing.

The proxy in front of the tenant-runner replicas (deploy/proxy/haproxy.cfg) hashes the tenant with
``hash-type consistent`` and ``hash-balance-factor 150``, ``weight 16`` on every server; this is
that rule as HAProxy's source has it (src/lb_chash.c, src/hash.c, backend.c; the same logic from
2.2 to 2.6). Checked against a running HAProxy 2.6: tests/integration/test_proxy_routing.py (every
key's server, a server added, a hot key's concurrent spread) and the container test (15 tenants on
the compose stack's replicas, then one replica stopped).
- the key is hashed with sdbm, then Bob Jenkins' ``full_hash`` (the "avalanche" modifier, on by
  default with ``hash-type consistent``);
- each server of weight w puts 16·w points on a 32-bit ring, point n at
  ``full_hash(puid * 4096 + n)`` (puid: the server's id, its position in the backend from 1);
- a key goes to the server of the *closest* point (ties to the one before it);
- with a balance factor f, a server is eligible while its requests in flight are below its share
  of ``ceil((in_flight + 1) * f / 100)``; an ineligible one passes the key clockwise, point by
  point, to the next eligible server;
- a server that goes down takes its points off the ring: only its keys move.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

MASK = 0xFFFFFFFF
POINTS_PER_WEIGHT = 16  # BE_WEIGHT_SCALE
KEY_RANGE = 4096  # SRV_EWGHT_RANGE


def sdbm(key: bytes) -> int:
    h = 0
    for c in key:
        h = (c + (h << 6) + (h << 16) - h) & MASK
    return h


def full_hash(a: int) -> int:
    """Bob Jenkins' 32-bit integer hash, as HAProxy's __full_hash."""
    a &= MASK
    a = ((a + 0x7ED55D16) + (a << 12)) & MASK
    a = ((a ^ 0xC761C23C) ^ (a >> 19)) & MASK
    a = ((a + 0x165667B1) + (a << 5)) & MASK
    a = ((a + 0xD3A2646C) ^ (a << 9)) & MASK
    a = ((a + 0xFD7046C5) + (a << 3)) & MASK
    a = ((a ^ 0xB55A4F09) ^ (a >> 16)) & MASK
    return (a * 3221225473) & MASK


def key_hash(key: str) -> int:
    return full_hash(sdbm(key.encode()))


class Ring:
    """The servers that are up, each ``weight`` × 16 points on the ring."""

    def __init__(self, servers: Sequence[int], weight: int = 1) -> None:
        """``servers``: their ids (puid, 1-based as HAProxy numbers them)."""
        self.weight = weight
        self.points: list[tuple[int, int]] = sorted(
            (full_hash(puid * KEY_RANGE + n), puid)
            for puid in servers
            for n in range(POINTS_PER_WEIGHT * weight)
        )
        self.keys = [k for k, _ in self.points]
        self.servers = sorted(set(servers))

    def closest(self, h: int) -> int:
        """Index of the point a hash lands on: the closest, before it on a tie (lb_chash.c)."""
        count = len(self.points)
        nxt = bisect.bisect_left(self.keys, h) % count
        prev = (nxt - 1) % count
        dp = (h - self.keys[prev]) & MASK
        dn = (self.keys[nxt] - h) & MASK
        return prev if dp <= dn else nxt

    def server(self, key: str) -> int:
        """Plain consistent hashing: the key's server, whatever the load."""
        return self.points[self.closest(key_hash(key))][1]

    def bounded(self, key: str, in_flight: dict[int, int], factor: int) -> int:
        """The key's server under ``hash-balance-factor factor`` (chash_get_server_hash): from its
        point, clockwise, the first server whose requests in flight are below its slots."""
        index = self.closest(key_hash(key))
        for _ in range(2 * len(self.points)):  # HAProxy gives up after two turns
            puid = self.points[index][1]
            if in_flight.get(puid, 0) < self.slots(puid, in_flight, factor):
                return puid
            index = (index + 1) % len(self.points)
        return self.points[index][1]

    def slots(self, puid: int, in_flight: dict[int, int], factor: int) -> int:
        """chash_server_is_eligible: this server's share of ceil((served + 1) * factor / 100)."""
        served = sum(in_flight.get(s, 0) for s in self.servers)
        total = ((served + 1) * factor + 99) // 100
        weight = POINTS_PER_WEIGHT * self.weight  # eweight, the same for every server here
        tot_weight = weight * len(self.servers)
        per_weight, remainder = divmod(total, tot_weight)
        cumulative = weight * self.servers.index(puid)
        share = weight * per_weight + (
            (cumulative + weight) * remainder // tot_weight - cumulative * remainder // tot_weight
        )
        return max(share, 1)
