"""deploy/ is checked offline: compose by docker-compose, Kubernetes by its own schemas (strict), the
Yatai resources by the CRD schema with unknown properties rejected. Each validator is also shown a
broken manifest, so a check that cannot fail would be caught here."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from testkit.processes import ROOT

DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose" / "docker-compose.yml"
KUSTOMIZATIONS = [
    "base",
    "overlays/canary",
    "overlays/blue-green",
    "overlays/blue-green-switched",
    "overlays/scale-to-zero",
]
YATAI_SCHEMA = ROOT.parent / "shared" / "schemas" / "yatai-bentodeployment-v2alpha1.schema.json"
YATAI = sorted((DEPLOY / "yatai").glob("*.yaml"))
KEDA_SCHEMA = ROOT.parent / "shared" / "schemas" / "keda-httpscaledobject-v1alpha1.schema.json"
BENTOS = {"tokenizer", "onnx-runner", "tf-runner", "tenant-runner"}


def tool(name: str) -> str:
    path = shutil.which(name)
    assert path, (
        f"{name} is not installed: `make tools` installs docker-compose and names what else"
    )
    return path


# --- docker-compose ---------------------------------------------------------------------------


OVERRIDE = COMPOSE.with_name("docker-compose.override.yml")
TENANT_RUNNERS = {"tenant-runner-1", "tenant-runner-2", "tenant-runner-3"}
# One ONNX runner service per model of the default catalogue (MiniLM's keeps the plain name).
ONNX_RUNNERS = {"onnx-runner", "onnx-runner-intent-classifier", "onnx-runner-intent-reranker"}
RUNNERS = ONNX_RUNNERS | {"tf-runner"} | TENANT_RUNNERS


def compose_config(*paths: Path) -> subprocess.CompletedProcess[str]:
    files = [arg for path in paths for arg in ("-f", str(path))]
    return subprocess.run(
        [tool("docker-compose"), *files, "config"], capture_output=True, text=True
    )


def test_compose_file_passes_docker_compose_config() -> None:
    """As docker-compose runs it (with its override: published ports, start order)."""
    proc = compose_config(COMPOSE, OVERRIDE)
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    assert set(services) == {"proxy", "tokenizer", "prometheus"} | RUNNERS
    published = {name for name, s in services.items() if s.get("ports")}
    assert published == {"proxy", "prometheus"}  # the runners speak pickle: never published
    for name in published:  # loopback unless asked
        assert str(services[name]["ports"][0]).startswith("127.0.0.1:"), name
    # Runners: ready. The tokenizer and the proxy: alive only (Swarm replaces unhealthy containers,
    # and a runner outage must not restart them).
    assert "/livez" in " ".join(services["tokenizer"]["healthcheck"]["test"])
    assert "8405/livez" in " ".join(services["proxy"]["healthcheck"]["test"])
    for name in RUNNERS | {"tokenizer"}:
        service = services[name]
        if name != "tokenizer":
            assert "readyz" in " ".join(service["healthcheck"]["test"]), name
        assert service["restart"] == "unless-stopped", name
        assert service["deploy"]["resources"]["limits"]["memory"], name
        # Swarm: the proxy resolves replicas itself (virtual IPs do not route everywhere).
        assert service["deploy"]["endpoint_mode"] == "dnsrr", name
        assert service["deploy"]["update_config"]["order"] == "start-first", name
    for name in RUNNERS:
        assert set(services[name]["networks"]) == {"internal"}, name
    assert services["tokenizer"]["depends_on"] == {
        "proxy": {"condition": "service_started"},
        **{runner: {"condition": "service_healthy"} for runner in RUNNERS},
    }
    tokenizer_env = services["tokenizer"]["environment"]
    assert {tokenizer_env[f"BUNDLE_TOKENIZER_{k}_URL"] for k in ("ONNX", "TF", "TENANT")} == {
        "http://proxy:3001", "http://proxy:3002", "http://proxy:3003"
    }  # fmt: skip
    for name in TENANT_RUNNERS:  # one store: each replica loads only its own tenants from it
        assert str(services[name]["volumes"][0]).startswith("tenants:"), name
    assert services["tokenizer"]["deploy"]["replicas"] == 2


def test_the_compose_file_alone_is_what_swarm_deploys() -> None:
    """`docker stack deploy -c docker-compose.yml` takes the file without the override: nothing in
    it Swarm refuses (published ports, depends_on conditions) and a version it reads."""
    spec = yaml.safe_load(COMPOSE.read_text())
    assert spec["version"] == "3.8"
    for name, service in spec["services"].items():
        assert "ports" not in service and "depends_on" not in service, name
    assert spec["networks"]["internal"]["attachable"] is True  # the swarm test's client joins it
    swarm_ports = yaml.safe_load(COMPOSE.with_name("swarm-ports.yml").read_text())
    assert swarm_ports["version"] == spec["version"]  # Swarm refuses to merge different versions
    assert set(swarm_ports["services"]) == {"proxy", "prometheus"}
    for service in swarm_ports["services"].values():  # dnsrr services publish in host mode only
        assert [port["mode"] for port in service["ports"]] == ["host"]


def test_a_broken_compose_file_fails_docker_compose_config(tmp_path: Path) -> None:
    spec = yaml.safe_load(OVERRIDE.read_text())
    spec["services"]["tokenizer"]["depends_on"]["onnx-runner"] = {"condition": "whenever"}
    broken = tmp_path / "docker-compose.override.yml"
    broken.write_text(yaml.safe_dump(spec))
    proc = compose_config(COMPOSE, broken)
    assert proc.returncode != 0 and "condition" in proc.stderr


# --- Kubernetes -------------------------------------------------------------------------------


def render(kustomization: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [tool("kubectl"), "kustomize", str(DEPLOY / "k8s" / kustomization)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def k8s_errors(resource: dict[str, Any]) -> list[str]:
    try:
        kubernetes_validate.validate(resource, kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [str(exc.message)]
    return []


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_kustomizations_render_and_pass_strict_validation(kustomization: str) -> None:
    resources = render(kustomization)
    for resource in resources:
        name = f"{resource['kind']}/{resource['metadata']['name']}"
        # KEDA's resources against the CRD's own schema; Kubernetes' against its schemas
        errors = keda_errors if resource["apiVersion"].startswith("http.keda.sh/") else k8s_errors
        assert not errors(resource), (name, errors(resource))
    kinds = {r["kind"] for r in resources}
    assert {"Deployment", "StatefulSet", "Service", "HorizontalPodAutoscaler",
            "PodDisruptionBudget", "ConfigMap", "NetworkPolicy"} <= kinds  # fmt: skip


def test_the_cli_validator_agrees(tmp_path: Path) -> None:
    # The command deploy/README.md tells users to run, on the rendered base.
    rendered = tmp_path / "base.yaml"
    rendered.write_text(yaml.safe_dump_all(render("base")))
    cli = Path(sys.executable).parent / "kubernetes-validate"
    proc = subprocess.run([str(cli), "--strict", "--quiet", str(rendered)], capture_output=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def workloads(resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in resources if r["kind"] in ("Deployment", "StatefulSet")]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_pod_is_annotated_for_prometheus(kustomization: str) -> None:
    found = workloads(render(kustomization))
    assert found
    for workload in found:
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        port = "8404" if workload["metadata"]["name"] == "proxy" else "3000"  # HAProxy's exporter
        assert annotations == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": port,
            "prometheus.io/path": "/metrics",
        }, workload["metadata"]["name"]


def test_every_workload_has_probes_resources_and_a_budget() -> None:
    resources = render("base")
    found = {w["metadata"]["name"]: w for w in workloads(resources)}
    assert set(found) == BENTOS | {"proxy"}
    assert found["tenant-runner"]["kind"] == "StatefulSet"
    for name, workload in found.items():
        for container in workload["spec"]["template"]["spec"]["containers"]:
            ready = "/livez" if name == "proxy" else "/readyz"
            assert container["readinessProbe"]["httpGet"]["path"] == ready, name
            assert container["livenessProbe"], name
            assert container["resources"]["requests"] and container["resources"]["limits"]
    hpas = {
        r["spec"]["scaleTargetRef"]["name"]: r
        for r in resources
        if r["kind"] == "HorizontalPodAutoscaler"
    }
    assert {"tokenizer", "onnx-runner", "tf-runner", "tenant-runner"} <= set(hpas)
    assert {r["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
            for r in resources if r["kind"] == "PodDisruptionBudget"} == BENTOS | {"proxy"}  # fmt: skip
    # The runners scale on queue depth, the metric prometheus-adapter serves (deploy/k8s/monitoring).
    adapter = yaml.safe_load(
        (DEPLOY / "k8s" / "monitoring" / "prometheus-adapter-values.yaml").read_text()
    )
    served = {rule["name"]["as"] for rule in adapter["rules"]["custom"]}
    for runner in ("onnx-runner", "tf-runner", "tenant-runner"):
        pods = [
            m["pods"]["metric"]["name"]
            for m in hpas[runner]["spec"]["metrics"]
            if m["type"] == "Pods"
        ]
        assert pods == ["bundle_queued_tokens"] and set(pods) <= served, runner
    metrics = (ROOT / "serving" / "batching" / "metrics.py").read_text()
    assert 'name="bundle_queued_tokens"' in metrics  # the gauge the runners export


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_tokenizer_reaches_the_runners_through_the_proxy(kustomization: str) -> None:
    """Stable, canary and green alike: the NetworkPolicy lets only the proxy reach a runner."""
    found = [
        w for w in workloads(render(kustomization)) if w["metadata"]["name"].startswith("tokenizer")
    ]
    assert found
    for tokenizer in found:
        env = {
            e["name"]: e["value"]
            for e in tokenizer["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert [env[f"BUNDLE_TOKENIZER_{k}_URL"] for k in ("ONNX", "TF", "TENANT")] == [
            "http://proxy:3001", "http://proxy:3002", "http://proxy:3003"
        ], tokenizer["metadata"]["name"]  # fmt: skip


def test_the_runners_are_reached_through_the_proxy_only() -> None:
    resources = render("base")
    services = {r["metadata"]["name"]: r for r in resources if r["kind"] == "Service"}
    for runner in ("onnx-runner", "tf-runner", "tenant-runner"):  # headless: the proxy sees pods
        assert services[runner]["spec"]["clusterIP"] == "None", runner
    policy = next(r for r in resources if r["metadata"]["name"] == "runners-from-proxy-only")
    sources = [
        peer.get("podSelector", {}).get("matchLabels")
        for peer in policy["spec"]["ingress"][0]["from"]
    ]
    assert sources[0] == {"app.kubernetes.io/name": "proxy"}
    proxy = next(w for w in workloads(resources) if w["metadata"]["name"] == "proxy")
    config = next(
        r
        for r in resources
        if r["kind"] == "ConfigMap" and r["metadata"]["name"].startswith("proxy-config")
    )
    volume = proxy["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
    assert volume == config["metadata"]["name"]  # kustomize's hashed name, so a change rolls pods
    assert (
        config["data"]["haproxy.cfg"]
        == (DEPLOY / "k8s" / "base" / "proxy" / "haproxy.cfg").read_text()
    )


def test_canary_and_blue_green_route_as_documented() -> None:
    def tokenizer_service(resources):
        return next(
            r for r in resources if r["kind"] == "Service" and r["metadata"]["name"] == "tokenizer"
        )

    def selected(resources) -> set[str]:
        selector = tokenizer_service(resources)["spec"]["selector"]
        return {
            r["metadata"]["name"]
            for r in resources
            if r["kind"] == "Deployment"
            and selector.items() <= r["spec"]["template"]["metadata"]["labels"].items()
        }

    assert selected(render("overlays/canary")) == {"tokenizer", "tokenizer-canary"}
    assert selected(render("overlays/blue-green")) == {"tokenizer"}  # green runs, unrouted
    assert selected(render("overlays/blue-green-switched")) == {"tokenizer-green"}


@pytest.mark.parametrize(
    "breakage",
    ["unknown field", "wrong type", "missing required"],
)
def test_a_broken_manifest_fails_strict_validation(breakage: str) -> None:
    deployment = copy.deepcopy(next(r for r in render("base") if r["kind"] == "Deployment"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    if breakage == "unknown field":
        container["readinessProbe"]["httpGett"] = container["readinessProbe"].pop("httpGet")
    elif breakage == "wrong type":
        deployment["spec"]["replicas"] = "two"
    else:
        del container["image"], container["name"]
    assert k8s_errors(deployment)


# --- Yatai ------------------------------------------------------------------------------------


def strict(schema: Any) -> Any:
    """The CRD schema with unknown properties rejected: every object that lists its properties
    and says nothing of others gets ``additionalProperties: false``."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


def yatai_validator() -> jsonschema.Validator:
    schema = strict(json.loads(YATAI_SCHEMA.read_text()))
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


def yatai_errors(resource: dict[str, Any]) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in yatai_validator().iter_errors(resource)
    ]


def test_there_is_a_bento_deployment_per_bento() -> None:
    resources = [yaml.safe_load(path.read_text()) for path in YATAI]
    assert {r["spec"]["bento"] for r in resources} == BENTOS
    for resource in resources:
        assert resource["apiVersion"] == "serving.yatai.ai/v2alpha1"
        assert resource["kind"] == "BentoDeployment"


@pytest.mark.parametrize("path", YATAI, ids=lambda p: p.stem)
def test_yatai_resources_pass_the_crd_schema_strictly(path: Path) -> None:
    assert not yatai_errors(yaml.safe_load(path.read_text()))


@pytest.mark.parametrize("breakage", ["unknown field", "wrong type"])
def test_a_broken_bento_deployment_fails_the_schema(breakage: str) -> None:
    resource = yaml.safe_load(YATAI[0].read_text())
    if breakage == "unknown field":
        resource["spec"]["replicas"] = 3  # not a v2alpha1 field: autoscaling.minReplicas is
    else:
        resource["spec"]["autoscaling"]["maxReplicas"] = "ten"
    assert yatai_errors(resource)


# --- KEDA (overlays/scale-to-zero) ----------------------------------------------------------


def keda_errors(resource: dict[str, Any]) -> list[str]:
    schema = strict(json.loads(KEDA_SCHEMA.read_text()))
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(resource)
    ]


def test_scale_to_zero_hands_each_embedding_runner_to_keda() -> None:
    """Each embedding runner Deployment is the target of one HTTPScaledObject from zero replicas,
    and of no CPU autoscaler; its Service and port exist; the proxy sets the Host the object
    routes on, and its runner calls go through KEDA's interceptor."""
    resources = render("overlays/scale-to-zero")
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for r in resources:
        by_kind.setdefault(r["kind"], {})[r["metadata"]["name"]] = r
    scaled = by_kind["HTTPScaledObject"]
    assert set(scaled) == {"onnx-runner", "tf-runner"}
    autoscaled = {
        h["spec"]["scaleTargetRef"]["name"] for h in by_kind["HorizontalPodAutoscaler"].values()
    }
    assert not autoscaled & set(scaled)
    assert {"tokenizer", "tenant-runner"} <= autoscaled  # the rest keep theirs
    config = next(iter(by_kind["ConfigMap"].values()))["data"]["haproxy.cfg"]
    for name, resource in scaled.items():
        spec, target = resource["spec"], resource["spec"]["scaleTargetRef"]
        assert not keda_errors(resource)
        assert spec["replicas"]["min"] == 0 and spec["hosts"] == [name]
        assert (target["kind"], target["name"]) == ("Deployment", name) and name in by_kind[
            "Deployment"
        ]
        # The CRD's own rule (CEL, which the JSON schema cannot state): a port or a port name.
        assert ("port" in target) != ("portName" in target)
        ports = [p["port"] for p in by_kind["Service"][target["service"]]["spec"]["ports"]]
        assert target["port"] in ports
        assert f"http-request set-header Host {name}" in config
    proxy = by_kind["Deployment"]["proxy"]["spec"]["template"]["spec"]["containers"][0]
    assert [e["name"] for e in proxy["env"]] == ["BUNDLE_PROXY_KEDA_INTERCEPTOR"]
    # The tokenizer's readiness does not probe the runners (a probe through the interceptor is
    # traffic: it would keep each runner up, and a runner at zero would leave no tokenizer ready
    # to take the request that scales it up); a request outlasts the interceptor's longest hold.
    tokenizer = by_kind["Deployment"]["tokenizer"]["spec"]["template"]["spec"]["containers"][0]
    assert tokenizer["readinessProbe"]["httpGet"]["path"] == "/livez"
    env = {e["name"]: e["value"] for e in tokenizer["env"]}
    hold = max(
        float(r["spec"]["timeouts"][k].rstrip("s"))
        for r in scaled.values()
        for k in ("conditionWait", "responseHeader")
    )
    assert float(env["BUNDLE_TOKENIZER_TIMEOUT_S"]) > hold + 10  # + the request's deadline
    # KEDA's interceptor, in its own namespace, may reach the runners it forwards to.
    policy = by_kind["NetworkPolicy"]["runners-from-keda-interceptor"]["spec"]
    assert policy["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "keda"
    }


@pytest.mark.parametrize("breakage", ["unknown field", "wrong type", "missing required"])
def test_a_broken_http_scaled_object_fails_the_schema(breakage: str) -> None:
    resource = copy.deepcopy(
        next(r for r in render("overlays/scale-to-zero") if r["kind"] == "HTTPScaledObject")
    )
    if breakage == "unknown field":
        resource["spec"]["minReplicaCount"] = 0  # a ScaledObject's field, not this CRD's
    elif breakage == "wrong type":
        resource["spec"]["replicas"]["min"] = "zero"
    else:
        del resource["spec"]["scaleTargetRef"]["service"]
    assert keda_errors(resource)
