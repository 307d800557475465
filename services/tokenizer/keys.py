"""Per-tenant API keys on the public service (off in development, on in production).

A keys file maps each tenant to the SHA-256 of its key, plus ``"*"`` for an operator key that may
act on any tenant and list them. Only hashes are stored; keys travel as ``Authorization: Bearer``
and are never logged nor echoed in an error. The file is re-read when it changes, so issuing or
revoking a key needs no restart:

    python -m services.tokenizer.keys issue TENANT --file keys.json     # prints the new key once
    python -m services.tokenizer.keys revoke TENANT --file keys.json
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import secrets
import sys
from pathlib import Path

from serving.errors import ApiError

OPERATOR = "*"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class TenantKeys:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._hashes: dict[str, str] = {}
        self._stamp: tuple[int, int] | None = None

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def _load(self) -> dict[str, str]:
        assert self.path is not None
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return {}  # keys on and no keys issued yet: nothing is allowed
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            self._hashes = {str(k): str(v) for k, v in json.loads(self.path.read_text()).items()}
            self._stamp = stamp
        return self._hashes

    def require(self, tenant: str | None, authorization: str | None) -> None:
        """Allow the request, or raise 401 (no key) / 403 (a key, not this tenant's).

        ``tenant`` None: an operation on no single tenant (listing), for the operator key only."""
        if not self.enabled:
            return
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError("an API key is required: send 'Authorization: Bearer <key>'", 401)
        offered = digest(key.strip())
        hashes = self._load()
        # compare_digest on every candidate: the time taken does not tell which part matched.
        operator = hmac.compare_digest(offered, hashes.get(OPERATOR, ""))
        own = tenant is not None and hmac.compare_digest(offered, hashes.get(tenant, ""))
        if not (operator or own):
            target = f"tenant '{tenant}'" if tenant else "this operation"
            raise ApiError(f"the API key given is not valid for {target}", 403)


def _write(path: Path, hashes: dict[str, str]) -> None:
    # Atomic: the service never reads a half-written file.
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    staged.write_text(json.dumps(hashes, indent=2, sort_keys=True))
    os.chmod(staged, 0o600)
    os.replace(staged, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.tokenizer.keys", description=__doc__.splitlines()[0]
    )
    parser.add_argument("command", choices=["issue", "revoke"])
    parser.add_argument("tenant", help=f"a tenant name, or '{OPERATOR}' for the operator key")
    parser.add_argument(
        "--file", type=Path, required=True, help="BUNDLE_TOKENIZER_TENANT_KEYS_FILE"
    )
    args = parser.parse_args(argv)
    if args.tenant != OPERATOR:
        from serving.tenant_names import check_name

        try:
            check_name(args.tenant)
        except ApiError as exc:
            parser.error(exc.message)
    hashes = json.loads(args.file.read_text()) if args.file.exists() else {}
    if args.command == "issue":
        key = secrets.token_urlsafe(32)
        hashes[args.tenant] = digest(key)
        _write(args.file, hashes)
        print(key)  # shown once; only its hash is kept
    else:
        if hashes.pop(args.tenant, None) is None:
            parser.error(f"no key for '{args.tenant}'")
        _write(args.file, hashes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
