"""The Prometheus configuration in deploy/prometheus/: valid for Prometheus 2.42 (Debian's, what the
image runs), every service scraped, and the rules computing what they say on synthetic series."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from testkit.processes import ROOT

HERE = ROOT / "deploy" / "prometheus"
RULES = sorted((HERE / "rules").glob("*.yml"))


def promtool_path() -> Path:
    """Where `make tools` unpacks it (PROMTOOL, relative to the repository, overrides)."""
    return ROOT / os.environ.get("PROMTOOL", "build/tools/prometheus/usr/bin/promtool")


def promtool(*args: str, cwd: Path = HERE) -> str:
    path = promtool_path()
    assert path.exists(), f"{path} missing: `make tools` fetches it"
    proc = subprocess.run([str(path), *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def test_rule_files_pass_promtool_check_rules() -> None:
    out = promtool("check", "rules", *map(str, RULES))
    assert out.count("SUCCESS") == len(RULES) == 2, out


def test_the_rules_compute_what_they_say_and_the_alerts_fire() -> None:
    """rules_test.yml: rates without the probes, p50, batch efficiency, shed share, tenant hit rate;
    shedding, error-rate and target-down alerts with their summaries."""
    assert "SUCCESS" in promtool("test", "rules", "rules_test.yml")


def test_a_wrong_rule_fails_the_check(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text("groups: [{name: x, rules: [{record: a, expr: 'rate(b[5m]'}]}]\n")
    proc = subprocess.run(
        [str(promtool_path()), "check", "rules", str(broken)], capture_output=True, text=True
    )
    assert proc.returncode != 0


def test_the_config_is_valid_and_scrapes_every_service() -> None:
    config = yaml.safe_load((HERE / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    compose = yaml.safe_load((ROOT / "deploy" / "compose" / "docker-compose.yml").read_text())
    # Stateless services: every replica their name resolves to (compose and Swarm's dnsrr); the
    # ONNX runner's one service per model, every one of them, in one job.
    onnx_runners = [n for n in compose["services"] if n.startswith("onnx-runner")]
    for job, services in (("tokenizer", ["tokenizer"]), ("onnx-runner", onnx_runners),
                          ("tf-runner", ["tf-runner"])):  # fmt: skip
        assert set(services) <= set(compose["services"])
        assert jobs[job]["dns_sd_configs"] == [
            {"names": services, "type": "A", "port": 3000, "refresh_interval": "5s"}
        ]
    assert len(onnx_runners) == 3
    # Tenant runners: one service each, one job (BentoML labels their series tenant_runner).
    tenant_runners = sorted(n for n in compose["services"] if n.startswith("tenant-runner-"))
    assert jobs["tenant-runner"]["static_configs"][0]["targets"] == [
        f"{n}:3000" for n in tenant_runners
    ]
    assert jobs["proxy"]["static_configs"][0]["targets"] == ["proxy:8404"]  # HAProxy's exporter
    # The config names the rules where the image puts them; checked here against a copy that
    # points at the files in the tree.
    config["rule_files"] = [str(r) for r in RULES]
    checked = HERE.parent.parent / "build" / "prometheus-check.yml"
    checked.parent.mkdir(exist_ok=True)
    checked.write_text(yaml.safe_dump(config))
    out = promtool("check", "config", str(checked))
    assert "SUCCESS" in out and "16 rules found" in out and "3 rules found" in out, out
