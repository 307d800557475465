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

from loadtests.processes import ROOT

DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose" / "docker-compose.yml"
KUSTOMIZATIONS = ["base", "overlays/canary", "overlays/blue-green", "overlays/blue-green-switched"]
YATAI_SCHEMA = ROOT.parent / "shared" / "schemas" / "yatai-bentodeployment-v2alpha1.schema.json"
YATAI = sorted((DEPLOY / "yatai").glob("*.yaml"))
BENTOS = {"tokenizer", "onnx-runner", "tf-runner", "tenant-runner"}


def tool(name: str) -> str:
    path = shutil.which(name)
    assert path, (
        f"{name} is not installed: `make tools` installs docker-compose and names what else"
    )
    return path


# --- docker-compose ---------------------------------------------------------------------------


def compose_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("docker-compose"), "-f", str(path), "config"], capture_output=True, text=True
    )


def test_compose_file_passes_docker_compose_config() -> None:
    proc = compose_config(COMPOSE)
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    # A one-shot chown of the volume, and Prometheus.
    assert set(services) == BENTOS | {"tenant-store-init", "prometheus"}
    published = {name for name, s in services.items() if s.get("ports")}
    assert published == {"tokenizer", "prometheus"}  # the runners speak pickle: never published
    for name in published:  # loopback unless asked
        assert str(services[name]["ports"][0]).startswith("127.0.0.1:"), name
    for name, service in ((n, services[n]) for n in BENTOS):
        assert "readyz" in " ".join(service["healthcheck"]["test"]), name
        assert service["restart"] == "unless-stopped", name
        assert service.get("mem_limit") and service.get("cpus"), name
    for runner in BENTOS - {"tokenizer"}:
        assert services["tokenizer"]["depends_on"][runner]["condition"] == "service_healthy"
        assert services[runner]["networks"] == {"internal": None}
    assert services["tenant-runner"]["volumes"], "tenant models must survive restarts"


def test_a_broken_compose_file_fails_docker_compose_config(tmp_path: Path) -> None:
    spec = yaml.safe_load(COMPOSE.read_text())
    spec["services"]["tokenizer"]["depends_on"]["onnx-runner"] = {"condition": "whenever"}
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(yaml.safe_dump(spec))
    proc = compose_config(broken)
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
        assert not k8s_errors(resource), (name, k8s_errors(resource))
    kinds = {r["kind"] for r in resources}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"} <= kinds


def test_the_cli_validator_agrees(tmp_path: Path) -> None:
    # The command deploy/README.md tells users to run, on the rendered base.
    rendered = tmp_path / "base.yaml"
    rendered.write_text(yaml.safe_dump_all(render("base")))
    cli = Path(sys.executable).parent / "kubernetes-validate"
    proc = subprocess.run([str(cli), "--strict", "--quiet", str(rendered)], capture_output=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_pod_is_annotated_for_prometheus(kustomization: str) -> None:
    deployments = [r for r in render(kustomization) if r["kind"] == "Deployment"]
    assert deployments
    for deployment in deployments:
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": "3000",
            "prometheus.io/path": "/metrics",
        }, deployment["metadata"]["name"]


def test_every_deployment_has_probes_resources_and_a_budget() -> None:
    resources = render("base")
    deployments = [r for r in resources if r["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == BENTOS
    for deployment in deployments:
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
            assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
            assert container["resources"]["requests"] and container["resources"]["limits"]
    hpa_targets = {
        r["spec"]["scaleTargetRef"]["name"]
        for r in resources
        if r["kind"] == "HorizontalPodAutoscaler"
    }
    assert {"tokenizer", "onnx-runner", "tf-runner"} <= hpa_targets
    pdbs = [r for r in resources if r["kind"] == "PodDisruptionBudget"]
    assert pdbs


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
