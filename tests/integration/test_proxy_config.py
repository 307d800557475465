"""The proxy's two configs (compose/Swarm and Kubernetes) pass HAProxy's own check, route tenants
by the same rule, and name exactly the tenant-runner replicas each deployment has.

HAProxy is Debian's package unpacked by `make tools` (HAPROXY_ROOT), run here only with ``-c``."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import yaml

from testkit.processes import ROOT

COMPOSE_CFG = ROOT / "deploy" / "proxy" / "haproxy.cfg"
K8S_CFG = ROOT / "deploy" / "k8s" / "base" / "proxy" / "haproxy.cfg"
COMPOSE = ROOT / "deploy" / "compose" / "docker-compose.yml"
K8S_TENANTS = ROOT / "deploy" / "k8s" / "base" / "tenant-runner.yaml"
# The directives that decide where a tenant goes (testkit/haproxy_ring.py models them).
RULE = ["balance hdr(X-Bundle-Tenant)", "hash-type consistent", "hash-balance-factor 150"]


def haproxy() -> list[str]:
    root = ROOT / os.environ.get("HAPROXY_ROOT", "build/tools/haproxy")
    binary = root / "usr" / "sbin" / "haproxy"
    assert binary.exists(), f"{binary} missing: `make tools` fetches it"
    # The configs' server names (compose services, pods) resolve nowhere here: the resolver's
    # shortest timeout, not its default 5 s, for each check that looks them up.
    libs = root / "usr" / "lib" / "x86_64-linux-gnu"
    return ["env", f"LD_LIBRARY_PATH={libs}", "RES_OPTIONS=timeout:1 attempts:1", str(binary)]


def check(path: Path, *env: str) -> subprocess.CompletedProcess[str]:
    """HAProxy's check of a config; ``env``: NAME=value pairs its ``.if`` blocks may test."""
    argv = [*haproxy()[:1], *env, *haproxy()[1:], "-c", "-f", str(path)]
    return subprocess.run(argv, capture_output=True, text=True)


def section(cfg: str, name: str) -> list[str]:
    """The lines of one section (``backend tenant-runners``), comments, blanks and conditional
    blocks' markers (``.if``) dropped."""
    lines, inside = [], False
    for raw in cfg.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line or line.startswith("."):
            continue
        if not raw.startswith(" "):
            inside = line == name
        elif inside:
            lines.append(line.strip())
    return lines


def servers(cfg: str) -> list[tuple[str, str, int, int]]:
    """(name, address, id, weight) of each tenant-runner server."""
    found = []
    for line in section(cfg, "backend tenant-runners"):
        if m := re.fullmatch(r"server (\S+) (\S+) id (\d+) weight (\d+)", line):
            found.append((m[1], m[2], int(m[3]), int(m[4])))
    return found


def test_both_configs_pass_haproxys_check() -> None:
    for path in (COMPOSE_CFG, K8S_CFG):
        proc = check(path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Configuration file is valid" in proc.stdout + proc.stderr


def test_the_kubernetes_config_sends_runner_calls_to_kedas_interceptor_when_told() -> None:
    """deploy/k8s/overlays/scale-to-zero sets BUNDLE_PROXY_KEDA_INTERCEPTOR on the proxy: each
    embedding runner's backend then has the interceptor as its one server, unchecked (a health
    check through it would keep a replica up), and names the runner in Host for it to route."""
    interceptor = "BUNDLE_PROXY_KEDA_INTERCEPTOR=keda-add-ons-http-interceptor-proxy.keda:8080"
    proc = check(K8S_CFG, interceptor)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for kind in ("onnx", "tf"):
        through = resolved(K8S_CFG.read_text(), f"backend {kind}-runners", interceptor)
        assert [line for line in through if line.startswith("server")] == [
            'server keda-interceptor "${BUNDLE_PROXY_KEDA_INTERCEPTOR}" no-check'
        ]
        assert f"http-request set-header Host {kind}-runner" in through
        assert not any(line.startswith("option httpchk") for line in through)
        direct = resolved(K8S_CFG.read_text(), f"backend {kind}-runners")
        assert [line.split()[0] for line in direct if line.startswith("server")] == [
            "server-template"
        ]
        assert "option httpchk GET /readyz" in direct


def resolved(cfg: str, name: str, *env: str) -> list[str]:
    """A section's lines as HAProxy reads them: ``.if defined(NAME)`` blocks kept or dropped by
    whether ``env`` defines NAME (the only condition the configs use)."""
    defined = {pair.split("=", 1)[0] for pair in env}
    lines, inside, keep = [], False, [True]
    for raw in cfg.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line:
            continue
        if m := re.fullmatch(r"\.if defined\((\w+)\)", line):
            keep.append(m[1] in defined)
        elif line == ".else":
            keep[-1] = not keep[-1]
        elif line == ".endif":
            keep.pop()
        elif not raw.startswith(" "):
            inside = line == name
        elif inside and all(keep):
            lines.append(line.strip())
    return lines


def test_a_broken_config_fails_the_check(tmp_path: Path) -> None:
    broken = tmp_path / "haproxy.cfg"
    broken.write_text(COMPOSE_CFG.read_text().replace("hash-type consistent", "hash-type ring"))
    assert check(broken).returncode != 0


def test_tenants_are_routed_by_the_same_rule_on_compose_and_kubernetes() -> None:
    for cfg in (COMPOSE_CFG.read_text(), K8S_CFG.read_text()):
        backend = section(cfg, "backend tenant-runners")
        assert [
            line
            for line in backend
            if line.split()[0] in {"balance", "hash-type", "hash-balance-factor"}
        ] == RULE
        # Every server weight 16 (the model's ring), ids 1..N in order: a replica's place on the ring.
        found = servers(cfg)
        assert [s[3] for s in found] == [16] * len(found)
        assert [s[2] for s in found] == list(range(1, len(found) + 1))


def test_compose_servers_are_the_compose_tenant_runners() -> None:
    spec = yaml.safe_load(COMPOSE.read_text())
    runners = sorted(name for name in spec["services"] if name.startswith("tenant-runner-"))
    assert [(name, address) for name, address, *_ in servers(COMPOSE_CFG.read_text())] == [
        (name, f"{name}:3000") for name in runners
    ]


def test_each_onnx_model_has_its_own_compose_service_and_proxy_backend() -> None:
    """One container per model: every ONNX model of the default catalogue is served by exactly one
    compose service (the same image, BUNDLE_ONNX_MODELS naming it), and a call naming the model
    (X-Bundle-Model) reaches that service: the default embed model's through the default backend,
    every other one's through the backend named for it."""
    from serving import catalogue

    models = [
        m
        for m in catalogue.load(catalogue.DEFAULT).models
        if {"onnx", "onnx-int8"} & set(m.backends)
    ]
    default = catalogue.load(catalogue.DEFAULT).default("embed")
    assert default is not None and len(models) > 1
    spec = yaml.safe_load(COMPOSE.read_text())["services"]
    image = spec["onnx-runner"]["image"]
    served = {
        name: service["environment"]["BUNDLE_ONNX_MODELS"]
        for name, service in spec.items()
        if service.get("image") == image
    }
    assert sorted(served.values()) == sorted(m.name for m in models)  # each model once, alone
    cfg = COMPOSE_CFG.read_text()
    frontend = section(cfg, "frontend onnx-runner")
    assert "use_backend onnx-runners-%[req.hdr(X-Bundle-Model),lower]" in frontend
    assert "default_backend onnx-runners" in frontend
    for name, model in served.items():
        backend = "onnx-runners" if model == default.name else f"onnx-runners-{model.lower()}"
        templates = [line.split() for line in section(cfg, f"backend {backend}")
                     if line.startswith("server-template")]  # fmt: skip
        assert [(t[1], t[3]) for t in templates] == [(name, f"{name}:3000")], backend
        assert f"nbsrv({backend}) lt 1" in " ".join(section(cfg, "frontend admin"))


def test_kubernetes_servers_are_the_statefulsets_pods_up_to_the_hpas_maximum() -> None:
    docs = {doc["kind"]: doc for doc in yaml.safe_load_all(K8S_TENANTS.read_text())}
    most = docs["HorizontalPodAutoscaler"]["spec"]["maxReplicas"]
    service = docs["StatefulSet"]["spec"]["serviceName"]
    assert docs["Service"]["spec"]["clusterIP"] == "None"  # headless: a DNS name per pod
    expected = [
        (f"tenant-runner-{i}", f"tenant-runner-{i}.{service}.bento-bundle.svc.cluster.local:3000")
        for i in range(most)
    ]
    assert [(name, address) for name, address, *_ in servers(K8S_CFG.read_text())] == expected
