"""`make profile`, briefly, on the session's graph (tests/conftest.py: it runs first of the
modules that share it, before any other load): py-spy samples both workers under chat load, the
samples land in categories that name the real work, and /proc's CPU is split among them whole."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from loadtests import profile
from testkit.processes import ROOT, Server

RECORDED = ROOT / "loadtests" / "results"
USERS = 16


def test_a_short_profile_attributes_each_workers_cpu(
    tmp_path: Path, graph_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = {p: p.read_bytes() for p in RECORDED.rglob("*") if p.is_file()}
    monkeypatch.setattr(profile, "OUT", tmp_path)  # py-spy's raw stacks
    argv = ["--seconds", "8", "--users", str(USERS), "--out", str(tmp_path / "p.json")]
    assert profile.main(argv, server=graph_server) == 0
    after = {p: p.read_bytes() for p in RECORDED.rglob("*") if p.is_file()}
    assert after == before  # shorter than a full run: not recorded
    run = json.loads((tmp_path / "p.json").read_text())["profile"]
    assert run["requests"] > 0 and run["failed"] == 0
    tokenizer, runner = run["processes"]["tokenizer"], run["processes"]["onnx_runner"]
    assert tokenizer["main"].get("HTTP (uvicorn)", 0) > 0
    assert tokenizer["main"].get("tokenizing (tokenizers, Rust)", 0) > 0
    assert runner["other_threads"].get("engine (ONNX Runtime)", 0) > 0
    for name, p in run["processes"].items():
        assert p["samples"]["main"] > 0, (name, p)
        for kind in ("main", "other_threads"):  # /proc's CPU, every ms of it in a category
            assert math.isclose(
                sum(p[kind].values()), p["from_proc"][f"{kind}_ms"], abs_tol=1e-3
            ), (name, p)
    # the rules name nearly all of it
    for name, p in run["processes"].items():
        assert p["main"].get("other", 0) < 0.1 * p["from_proc"]["main_ms"], (name, p)
    # the engine is most of the runner's other threads (the lanes run it)
    engine = runner["other_threads"]["engine (ONNX Runtime)"]
    assert engine > 0.5 * runner["from_proc"]["other_threads_ms"], runner
