"""The model of HAProxy's consistent hashing with bounded load (testkit/haproxy_ring.py), and the
replica simulation built on it (loadtests/replicas.py)."""

from __future__ import annotations

import bisect
import random
from collections import Counter

import pytest

from testkit.haproxy_ring import Ring, full_hash, key_hash, sdbm

KEYS = [f"tenant-{i:05d}" for i in range(10_000)]


def test_the_hashes_are_32_bit_and_spread() -> None:
    assert sdbm(b"") == 0 and sdbm(b"a") == 97  # c + (0 << 6) + (0 << 16) - 0
    hashes = {full_hash(sdbm(k.encode())) for k in KEYS}
    assert len(hashes) == len(KEYS) and all(0 <= h < 2**32 for h in hashes)


@pytest.mark.parametrize("r", range(1, 8))
def test_adding_a_replica_moves_about_one_in_r_plus_one_keys(r: int) -> None:
    before, after = Ring(range(1, r + 1), weight=16), Ring(range(1, r + 2), weight=16)
    moved = [k for k in KEYS if before.server(k) != after.server(k)]
    assert len(moved) / len(KEYS) <= 1 / (r + 1) + 0.03
    assert {after.server(k) for k in moved} == {r + 1}  # only to the new replica


def test_losing_a_replica_moves_only_its_keys_and_spreads_them() -> None:
    before, after = Ring([1, 2, 3, 4], weight=16), Ring([1, 2, 4], weight=16)
    moved = [k for k in KEYS if before.server(k) != after.server(k)]
    assert moved and all(before.server(k) == 3 for k in moved)
    assert {after.server(k) for k in moved} == {1, 2, 4}
    back = Ring([1, 2, 3, 4], weight=16)  # the replica back: its keys return to it
    assert all(back.server(k) == before.server(k) for k in KEYS)


def test_no_replica_takes_more_than_its_bound_and_a_hot_tenant_spills() -> None:
    """A closed loop of 64 requests in flight, 60 % of them for one tenant: plain consistent
    hashing puts all of those on one replica; bounded load (factor 150) never lets a replica
    exceed its slots and sends the excess to others."""
    ring, rng = Ring([1, 2, 3, 4], weight=16), random.Random(3)
    in_flight: Counter[int] = Counter()
    window: list[int] = []
    hot_went: Counter[int] = Counter()
    for _ in range(5_000):
        key = "tenant-hot" if rng.random() < 0.6 else rng.choice(KEYS)
        replica = ring.bounded(key, in_flight, factor=150)
        assert in_flight[replica] < ring.slots(replica, in_flight, factor=150)
        if key == "tenant-hot":
            hot_went[replica] += 1
        window.append(replica)
        in_flight[replica] += 1
        if len(window) > 64:
            in_flight[window.pop(0)] -= 1
        assert max(in_flight.values()) <= -(-64 * 150 // 100 // 4) + 1  # ceil(1.5 x average) + 1
    assert len(hot_went) >= 2 and hot_went.most_common(1)[0][0] == ring.server("tenant-hot")


def test_a_key_goes_to_the_closest_point_not_the_next_one() -> None:
    """lb_chash.c picks the nearer of the points around the hash (ties to the one before): keys
    whose next point belongs to another server than the nearer one must follow the nearer."""
    ring = Ring([1, 2, 3], weight=1)  # HAProxy's default weight: 16 points a server
    differs = 0
    for key in KEYS:
        h = key_hash(key)
        nxt = bisect.bisect_left(ring.keys, h) % len(ring.keys)
        prev = (nxt - 1) % len(ring.keys)
        nearer = prev if (h - ring.keys[prev]) % 2**32 <= (ring.keys[nxt] - h) % 2**32 else nxt
        assert ring.server(key) == ring.points[nearer][1]
        differs += ring.points[nearer][1] != ring.points[nxt][1]
    assert differs > 1000  # the rule matters for many keys


def test_slots_always_leave_a_replica_eligible() -> None:
    ring = Ring([1, 2, 3], weight=16)
    for served in range(0, 200, 7):
        in_flight = {1: served, 2: served // 2, 3: 0}
        total = sum(ring.slots(s, in_flight, 125) for s in (1, 2, 3))
        assert total >= sum(in_flight.values()) + 1
