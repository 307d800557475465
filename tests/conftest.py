"""Test tiers by folder: unit (fake engines), integration (real models in-process), e2e (real servers).

Each test is marked with its folder's tier, so ``pytest -m unit`` runs the fast ones alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TIERS = {"unit", "integration", "e2e", "containers"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
