"""Each lean-path choice of the serving path, pinned (loadtests/README.md has what each one saves)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from opentelemetry.util.http import ExcludeList

from loadtests.processes import ROOT

SERVICES = {
    "services.tokenizer.service:Tokenizer": (
        "BUNDLE_TOKENIZER_",
        ["/embed", "/similarity", "/tokenize", "/inference", "/classify", "/v1/embeddings"],
    ),
    "runners.onnx.service:OnnxRunner": (
        "BUNDLE_ONNX_",
        [
            "/embed",
            "/v1/models/minilm:predict",
            "/v1/models/minilm/versions/1:predict",
            "/v1/models/minilm-int8/labels/stable:predict",
        ],
    ),
    "runners.tf.service:TFRunner": ("BUNDLE_TF_", ["/embed", "/v1/models/minilm:predict"]),
    "runners.tenants.service:TenantRunner": ("BUNDLE_TENANTS_", ["/classify"]),
}


def service_config(target: str, env: dict[str, str]) -> dict:
    """A service's BentoML config as `bentoml serve` would build it (fresh process: settings are
    read at import)."""
    module, name = target.split(":")
    code = (
        f"import json; from {module} import {name} as s; print(json.dumps(s.config, default=str))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **env},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def excluded(config: dict, path: str) -> bool:
    patterns = config.get("tracing", {}).get("excluded_urls")
    return bool(patterns) and ExcludeList(patterns).url_disabled(f"http://127.0.0.1:3000{path}")


@pytest.mark.parametrize("target", SERVICES)
def test_hot_routes_are_not_traced_by_default(target: str) -> None:
    _, hot = SERVICES[target]
    config = service_config(target, {})
    for path in hot:
        assert excluded(config, path), (target, path)
    for path in ("/metrics", "/readyz", "/docs.json", f"{hot[0]}_other"):
        assert not excluded(config, path), (target, path)


@pytest.mark.parametrize("target", SERVICES)
def test_the_setting_turns_tracing_back_on(target: str) -> None:
    prefix, hot = SERVICES[target]
    config = service_config(target, {f"{prefix}TRACE_REQUESTS": "true"})
    assert not any(excluded(config, path) for path in hot), config.get("tracing")


@pytest.mark.parametrize("target", SERVICES)
def test_every_service_puts_the_lean_path_in_front(target: str) -> None:
    """Each service's workers answer its untraced routes on the lean path (serving/hot_path.py,
    whose own tests pin that it answers as BentoML does)."""
    module, name = target.split(":")
    code = f"from {module} import {name} as s; print(type(s).__name__)"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "HotPathService"
