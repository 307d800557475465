"""The tenant name rule, checked wherever a name arrives (public service, runner, store, CLI), and
the limits of a tenant's labels (the public API's and the store's manifest's).

A name becomes a directory in the tenant store, so the rule keeps it from escaping it: no '/',
no '..', no leading dot, no upper case (two names that differ only by case would share a
directory on case-insensitive filesystems).
"""

from __future__ import annotations

import re

from serving.errors import ApiError

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
MAX_LABELS = 1000  # intents a tenant model may have
MAX_LABEL_CHARS = 100  # characters of one intent


class InvalidTenantName(ApiError):
    status = 422


def check_name(name: str) -> str:
    """Validate a tenant name without touching the filesystem; returns it."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        shown = name[:40] + "…" if isinstance(name, str) and len(name) > 40 else name
        raise InvalidTenantName(
            f"invalid tenant name {shown!r}: use 1-63 lowercase letters, digits, '-' or '_', starting with a letter or digit"
        )
    return name
