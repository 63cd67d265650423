"""The manifests on day two, rendered by ``kubectl kustomize``: a changed Secret rolls the pods that
read it; gateways wait for vLLM instead of crash-looping; the HPA alone owns the gateway count, on a
metric every cluster has; every part has a PDB that lets a drain evict unhealthy pods; the parts spread
over zones and hosts; vLLM is GPU-ready; the Prometheus Operator's PodMonitors are an optional
component (the base needs no CRD) that the NetworkPolicy lets scrape; the image carries OpenTelemetry.
Nothing here talks to a cluster: Kubernetes cannot run on this machine."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.deploy.manifests import (
    BASE,
    COMPONENTS,
    KUSTOMIZATIONS,
    ROOT,
    Resource,
    container,
    env_values,
    kubectl,
    named,
    one,
    render,
    render_overlay,
    secret_values,
    selects,
    workloads,
)
from tests.deploy.test_manifests import schema_errors, serve_env_names

pytestmark = pytest.mark.skipif(kubectl() is None, reason="kubectl is not on PATH: nothing is rendered")

MINE = """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../production
secretGenerator:
  - name: mmgate-secrets
    behavior: replace
    files: [api-keys.json=secrets/api-keys.json]
    envs: [secrets/mmgate.env]
"""
SECRET_FILES = {
    "secrets/api-keys.json": '{"sk-real-key-0123456789": "team-a"}',
    "secrets/mmgate.env": "tenant-secret=0123456789abcdef0123456789abcdef\nredis-password=redis-pass-1\n"
                          "routing-sync-secret=0123456789abcdef0123456789abcdef01\nadmin-key=admin-key-1\n",
}
MONITORING = "monitoring.coreos.com"
# The stateful parts and the gateways (whose readiness follows vLLM's health).
DISRUPTABLE = [("Deployment", "mmgate-gateway"), ("StatefulSet", "vllm"), ("StatefulSet", "redis")]
ZONE, HOST = "topology.kubernetes.io/zone", "kubernetes.io/hostname"


@pytest.fixture(scope="module", params=KUSTOMIZATIONS, ids=lambda p: p.relative_to(BASE.parent).as_posix())
def rendered(request: pytest.FixtureRequest) -> list[Resource]:
    return render(request.param)


def secret_refs(workload: Resource) -> set[str]:
    """The Secret names a workload's pods read (env, envFrom, volumes)."""
    spec = workload["spec"]["template"]["spec"]
    names = {v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
    for cont in spec["containers"]:
        names |= {i["valueFrom"]["secretKeyRef"]["name"] for i in cont.get("env", [])
                  if "secretKeyRef" in i.get("valueFrom", {})}
        names |= {e["secretRef"]["name"] for e in cont.get("envFrom", []) if "secretRef" in e}
    return names


def test_a_replaced_secret_rolls_the_pods_that_read_it(tmp_path: Path) -> None:
    """An overlay's secretGenerator with ``behavior: replace`` (docs/DEPLOY.md) yields a Secret whose
    name carries its content's hash, and every pod that reads it names that Secret: a change to a
    value changes the pod templates, so the gateways, Redis and the Job roll."""
    first = render_overlay(tmp_path, MINE, SECRET_FILES)
    secret = named(first, "Secret", "mmgate-secrets")
    name = secret["metadata"]["name"]
    assert re.fullmatch(r"mmgate-secrets-[a-z0-9]{10}", name), name
    assert secret_values(secret)["admin-key"] == "admin-key-1"
    readers = [w for w in workloads(first) if any(n.startswith("mmgate-secrets") for n in secret_refs(w))]
    assert {w["metadata"]["name"] for w in readers} >= {"mmgate-gateway", "redis", "redis-cluster-create"}
    assert all({n for n in secret_refs(w) if n.startswith("mmgate-secrets")} == {name} for w in readers)
    changed = {**SECRET_FILES, "secrets/mmgate.env": SECRET_FILES["secrets/mmgate.env"].replace("admin-key-1", "k2")}
    second = render_overlay(tmp_path, MINE, changed)
    renamed = named(second, "Secret", "mmgate-secrets")["metadata"]["name"]
    assert renamed != name
    gateway = one(second, "Deployment", "mmgate-gateway")
    assert renamed in secret_refs(gateway)
    assert gateway["spec"]["template"] != one(first, "Deployment", "mmgate-gateway")["spec"]["template"]


def test_gateways_wait_for_a_backend_without_limit(rendered: list[Resource]) -> None:
    """With vLLM discovered and none ready, a gateway stays up (alive, not ready): the wait is a
    setting of `mmgate serve`, set to no limit; the probes that keep the pod ask /load, which a
    waiting gateway answers."""
    gateway = container(one(rendered, "Deployment", "mmgate-gateway"), "gateway")
    env = env_values(gateway)
    assert "MMGATE_BACKEND_DNS" in env
    assert "MMGATE_BACKEND_DNS_START_TIMEOUT" in serve_env_names()
    assert float(env["MMGATE_BACKEND_DNS_START_TIMEOUT"]) == 0
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/load"
    assert gateway["startupProbe"]["httpGet"]["path"] == "/load"
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/health"


def test_the_hpa_alone_owns_the_gateway_count_on_cpu(rendered: list[Resource]) -> None:
    """No replica count beside the HPA (every apply would reset the scale to it), and only metrics
    every cluster serves (a metric the HPA cannot read keeps it from ever scaling down)."""
    deployment = one(rendered, "Deployment", "mmgate-gateway")
    assert "replicas" not in deployment["spec"]
    hpa = one(rendered, "HorizontalPodAutoscaler", "mmgate-gateway")
    assert [(m["type"], m["resource"]["name"]) for m in hpa["spec"]["metrics"]] == [("Resource", "cpu")]
    pod_requests = container(deployment, "gateway")["resources"]["requests"]
    assert "cpu" in pod_requests  # utilisation is measured against the request


def test_the_requests_in_flight_component_adds_the_pods_metric(tmp_path: Path) -> None:
    mine = "resources: [../production]\ncomponents: [../../components/requests-in-flight-autoscaling]\n"
    hpa = one(render_overlay(tmp_path, mine), "HorizontalPodAutoscaler", "mmgate-gateway")
    kinds = [m["type"] for m in hpa["spec"]["metrics"]]
    assert kinds == ["Resource", "Pods"]
    assert hpa["spec"]["metrics"][1]["pods"]["metric"]["name"] == "mmgate_requests_in_flight"
    assert schema_errors([hpa]) == []


@pytest.mark.parametrize(("kind", "name"), DISRUPTABLE)
def test_every_part_has_a_pdb_that_lets_unhealthy_pods_go(rendered: list[Resource], kind: str, name: str) -> None:
    """One PDB per part, at most one pod down, and unhealthy pods always evictable: a gateway is
    unready whenever vLLM is, so without AlwaysAllow a vLLM outage would block every node drain."""
    labels = one(rendered, kind, name)["spec"]["template"]["metadata"]["labels"]
    pdbs = [p for p in rendered if p["kind"] == "PodDisruptionBudget"
            and selects(p["spec"]["selector"]["matchLabels"], labels)]
    assert len(pdbs) == 1, f"{kind}/{name}: {len(pdbs)} PDBs"
    assert pdbs[0]["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdbs[0]["spec"].get("maxUnavailable") == 1


@pytest.mark.parametrize(("kind", "name"), DISRUPTABLE)
def test_every_part_spreads_over_zones_and_hosts(rendered: list[Resource], kind: str, name: str) -> None:
    workload = one(rendered, kind, name)
    spec = workload["spec"]["template"]["spec"]
    labels = workload["spec"]["template"]["metadata"]["labels"]
    spread = {c["topologyKey"] for c in spec.get("topologySpreadConstraints", [])
              if selects(c["labelSelector"]["matchLabels"], labels)}
    anti = {t["podAffinityTerm"]["topologyKey"]
            for t in spec.get("affinity", {}).get("podAntiAffinity", {}).get(
                "preferredDuringSchedulingIgnoredDuringExecution", [])
            if selects(t["podAffinityTerm"]["labelSelector"]["matchLabels"], labels)}
    assert ZONE in spread, f"{name} does not spread over zones"
    assert HOST in spread | anti, f"{name} does not spread over hosts"


def test_vllm_is_gpu_ready(rendered: list[Resource]) -> None:
    """GPU nodes only (node selector, the GPU taint tolerated), one GPU each, a Hugging Face token
    from a Secret that exists, and a PDB (test_every_part_has_a_pdb_that_lets_unhealthy_pods_go)."""
    vllm = one(rendered, "StatefulSet", "vllm")
    spec = vllm["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t["key"] == "nvidia.com/gpu" and t["operator"] == "Exists" for t in spec["tolerations"])
    cont = container(vllm, "vllm")
    assert cont["resources"]["limits"]["nvidia.com/gpu"] == "1"
    token = next(i for i in cont["env"] if i["name"] == "HF_TOKEN")["valueFrom"]["secretKeyRef"]
    secret = one(rendered, "Secret", token["name"])
    assert token["key"] in secret_values(secret)
    assert re.fullmatch(r"vllm-secrets-[a-z0-9]{10}", token["name"])


def test_vllm_and_gateway_pods_are_scraped(rendered: list[Resource]) -> None:
    """Both carry the prometheus.io annotations, and vLLM's NetworkPolicy admits Prometheus on the
    metrics port beside the gateways."""
    for kind, name in (("Deployment", "mmgate-gateway"), ("StatefulSet", "vllm")):
        annotations = one(rendered, kind, name)["spec"]["template"]["metadata"].get("annotations", {})
        assert annotations.get("prometheus.io/scrape") == "true", name
        assert annotations["prometheus.io/path"] == "/metrics"
    vllm_labels = one(rendered, "StatefulSet", "vllm")["spec"]["template"]["metadata"]["labels"]
    policies = [p for p in rendered if p["kind"] == "NetworkPolicy"
                and selects(p["spec"]["podSelector"]["matchLabels"], vllm_labels)]
    peers = [(peer, rule.get("ports", [])) for p in policies for rule in p["spec"]["ingress"] for peer in rule["from"]]
    prometheus = [(peer, ports) for peer, ports in peers
                  if peer.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/name") == "prometheus"]
    assert prometheus, "no rule admits Prometheus to vLLM"
    assert all("namespaceSelector" in peer for peer, _ in prometheus)  # Prometheus runs in its own namespace
    assert any(port["port"] == 8000 for _, ports in prometheus for port in ports)


def test_the_base_needs_no_crd(rendered: list[Resource]) -> None:
    assert [r["kind"] for r in rendered if r["apiVersion"].startswith(MONITORING)] == []
    assert schema_errors(rendered) == []


def test_the_prometheus_operator_component_monitors_gateways_and_vllm(tmp_path: Path) -> None:
    """PodMonitors for both, each matching its pods and a named port they have; the gateway's sends
    the admin key from the generated Secret (its hashed name), as /metrics needs with API keys."""
    mine = ("namespace: mmgate\nresources: [../../base]\ncomponents: [../../components/prometheus-operator]\n")
    resources = render_overlay(tmp_path, mine)
    monitors = {r["metadata"]["name"]: r for r in resources if r["kind"] == "PodMonitor"}
    assert set(monitors) == {"mmgate-gateway", "vllm"}
    assert all(m["apiVersion"] == f"{MONITORING}/v1" and m["metadata"]["namespace"] == "mmgate"
               for m in monitors.values())
    for (kind, name), monitor in zip((("Deployment", "mmgate-gateway"), ("StatefulSet", "vllm")),
                                     (monitors["mmgate-gateway"], monitors["vllm"]), strict=True):
        workload = one(resources, kind, name)
        template = workload["spec"]["template"]
        assert selects(monitor["spec"]["selector"]["matchLabels"], template["metadata"]["labels"])
        ports = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
        # The job label is the pods' name label: job="mmgate-gateway", job="vllm".
        assert template["metadata"]["labels"][monitor["spec"]["jobLabel"]] == name
    auth = monitors["mmgate-gateway"]["spec"]["podMetricsEndpoints"][0]["authorization"]
    secret = named(resources, "Secret", "mmgate-secrets")
    assert auth["type"] == "Bearer"
    assert auth["credentials"] == {"name": secret["metadata"]["name"], "key": "admin-key"}
    gateway_env = env_values(container(one(resources, "Deployment", "mmgate-gateway"), "gateway"))
    assert gateway_env["MMGATE_ADMIN_KEY_FILE"].endswith("/admin-key")
    assert (COMPONENTS / "prometheus-operator" / "kustomization.yaml").exists()


def test_the_namespace_enforces_pod_security_restricted() -> None:
    overlays = [p for p in KUSTOMIZATIONS if p != BASE]
    for overlay in overlays:
        namespaces = [r for r in render(overlay) if r["kind"] == "Namespace"]
        for namespace in namespaces:
            assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_image_installs_the_otel_extra() -> None:
    """MMGATE_OTLP_TRACES_ENDPOINT needs OpenTelemetry's SDK and exporter: the image installs mmgate
    with its otel extra, and the offline wheelhouse fetches the extra's wheels."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    installs = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert installs and all("/src[otel]" in line for line in installs), installs
    wheelhouse = (ROOT / "tools" / "wheelhouse.sh").read_text()
    assert re.search(r'"\$HERE\[otel\]"', wheelhouse)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("opentelemetry-sdk") for dep in extras["otel"])
