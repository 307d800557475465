"""Each service's start in parts (serving/startup.py): the record it logs and `make cold-start`
reads, and a heads-only tenant runner that starts without TensorFlow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from serving.startup import MARK, Startup, parse
from testkit.processes import ROOT


def test_a_start_is_logged_in_parts_and_read_back(caplog: pytest.LogCaptureFixture) -> None:
    startup = Startup("probe")
    assert startup.parts["import_s"] > 0  # this process started before the test
    with startup.part("load"):
        time.sleep(0.01)
    with startup.part("load"):  # a part timed twice adds up
        time.sleep(0.01)
    with caplog.at_level("INFO", logger="bento_bundle.startup"):
        record = startup.done()
    assert record["load_s"] >= 0.02
    # each figure is rounded to the millisecond on its own: their sum may pass the total by that
    assert record["total_s"] >= record["import_s"] + record["load_s"] - 0.002
    assert record["ready_at"] - record["started_at"] == pytest.approx(record["total_s"], abs=0.01)
    # As BentoML's log format writes it: a prefix, and the request's trace after the record.
    line = f"2026-11-29T04:00:00+0000 [INFO] [service:probe:1] {caplog.records[-1].getMessage()}"
    log = f"other line\n{line} (trace=ab12,span=cd34,sampled=0)\n{MARK} {{cut"
    assert parse(log) == [record]


def started(formats: str | None, store: Path) -> dict[str, Any]:
    """A tenant runner built in a fresh process (settings are read at import), with
    BUNDLE_TENANTS_FORMATS=``formats`` (None: the default): which runtimes its start loaded, and
    how it refuses an ONNX tenant (None: served)."""
    code = """
import json, sys
from runners.tenants.service import TenantRunner, served
from serving.errors import ApiError
TenantRunner()
loaded = {"tensorflow": "tensorflow" in sys.modules, "onnxruntime": "onnxruntime" in sys.modules}
refused = []
for what in ("format", "tenant 'acme'"):  # /tenants/train's check; /classify's, of a stored one
    try:
        served("onnx", what)
    except ApiError as exc:
        refused.append([exc.status, exc.message])
print(json.dumps({**loaded, "onnx_refused": refused or None}))
"""
    env = {**os.environ, "BUNDLE_TENANTS_STORE": str(store)}
    env.pop("BUNDLE_TENANTS_FORMATS", None)
    if formats is not None:
        env["BUNDLE_TENANTS_FORMATS"] = formats
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_process_s_start_is_after_it_was_launched_and_before_its_first_line() -> None:
    """The start is the kernel's, exact to its tick: never before the parent launched the process
    (psutil's create time alone was early by the boot time's fraction of a second, so the import
    part was long by as much and the worker's start early) and never after the child's first line."""
    child = "import time; first = time.time(); from serving.startup import process_started; print(first, process_started())"
    launched = time.time()
    out = subprocess.run(
        [sys.executable, "-c", child], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    first, started = map(float, out.split())
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert launched - tick <= started <= first, (launched, started, first)


def test_a_heads_only_tenant_runner_starts_without_either_runtime(tmp_path: Path) -> None:
    heads_only = started("[]", tmp_path)
    assert (heads_only["tensorflow"], heads_only["onnxruntime"]) == (False, False)
    (training, training_says), (stored, stored_says) = heads_only["onnx_refused"]
    assert training == 400 and "BUNDLE_TENANTS_FORMATS" in training_says, training_says
    assert stored == 409 and "tenant 'acme'" in stored_says, stored_says
    onnx_only = started('["onnx"]', tmp_path)
    assert (onnx_only["tensorflow"], onnx_only["onnxruntime"], onnx_only["onnx_refused"]) == (
        False,
        True,
        None,
    )
    default = started(None, tmp_path)
    assert (default["tensorflow"], default["onnxruntime"], default["onnx_refused"]) == (
        True,
        True,
        None,
    )


def test_the_tokenizer_carries_and_loads_neither_runtime() -> None:
    """Its bento lists neither ONNX Runtime nor TensorFlow, and with its runners reached by URL (as
    in its container) importing it loads neither."""
    packages = yaml.safe_load((ROOT / "services/tokenizer/bentofile.yaml").read_text())["python"]
    names = {p.split("=")[0].split("[")[0].lower() for p in packages["packages"]}
    assert "tokenizers" in names and not names & {"onnxruntime", "tensorflow", "tensorflow-cpu"}
    urls = {f"BUNDLE_TOKENIZER_{r}_URL": "http://127.0.0.1:9" for r in ("ONNX", "TF", "TENANT")}
    code = """
import json, sys
import services.tokenizer.service
print(json.dumps(sorted(m for m in ("onnxruntime", "tensorflow") if m in sys.modules)))
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **urls}, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
