"""The Kubernetes manifests (deploy/kubernetes): every resource of the base files and of each rendered
kustomization is valid against the pinned Kubernetes version's schemas (strict: an unknown field is an
error), and the fleet is wired as docs/DEPLOY.md says — gateway probes, drain, resources, PDB, HPA,
Secret, vLLM behind a headless Service, the Redis Cluster, and every MMGATE_* variable a real flag.
What must hold on day two (rolling secrets, waiting for backends, scaling, disruptions, spread, Pod
Security, monitoring) is in test_day_two.py and test_pod_security.py."""

from __future__ import annotations

import argparse
import copy
import json
import math
import re
from pathlib import Path

import kubernetes_validate
import pytest

from mmgate._env import env_name
from mmgate.config import GatewaySettings
from mmgate.serve.cli import add_arguments
from mmgate.serve.start import CUT_GRACE_S
from tests.deploy.manifests import (
    BASE,
    K8S_VERSIONS,
    KUSTOMIZATIONS,
    Resource,
    arg_value,
    base_files,
    container,
    env_values,
    kubectl,
    load_file,
    named,
    one,
    render,
    secret_values,
    selects,
    undefined_references,
)

needs_kubectl = pytest.mark.skipif(kubectl() is None, reason="kubectl is not on PATH: the kustomizations "
                                   "are not rendered (the base files are still validated one by one)")


def schema_errors(resources: list[Resource]) -> list[str]:
    errors = []
    for res in resources:
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(res, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = "/".join(str(p) for p in exc.path)
                errors.append(f"{res['kind']}/{res['metadata'].get('name')} ({version}): {path}: {exc.message}")
    return errors


def serve_env_names() -> set[str]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    names = {env_name(opt) for action in parser._actions for opt in action.option_strings
             if opt.startswith("--") and opt not in ("--help", "--help-all")}
    return names


@pytest.fixture(scope="module", params=KUSTOMIZATIONS, ids=lambda p: p.relative_to(BASE.parent).as_posix())
def rendered(request: pytest.FixtureRequest) -> list[Resource]:
    """A kustomization as kubectl renders it (the Secrets are generated: no file holds them)."""
    if kubectl() is None:
        pytest.skip("kubectl is not on PATH: the kustomizations are not rendered")
    return render(request.param)


@pytest.mark.parametrize("path", base_files(), ids=lambda p: p.name)
def test_base_file_is_valid(path: Path) -> None:
    resources = load_file(path)
    assert resources
    assert schema_errors(resources) == []


@needs_kubectl
def test_rendered_kustomization_is_valid(rendered: list[Resource]) -> None:
    assert schema_errors(rendered) == []


def test_validator_refuses_a_broken_manifest() -> None:
    """The check can fail: a misspelt field and a wrongly typed one are each an error (in the
    schemas of every version checked)."""
    deployment = one(load_file(BASE / "gateway-deployment.yaml"), "Deployment", "mmgate-gateway")
    typo = copy.deepcopy(deployment)
    gateway = container(typo, "gateway")
    gateway["readinesProbe"] = gateway.pop("readinessProbe")
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "three"
    assert len(schema_errors([typo])) == len(K8S_VERSIONS)
    assert len(schema_errors([wrong_type])) == len(K8S_VERSIONS)


def test_gateway_probes_drain_and_resources() -> None:
    deployment = one(load_file(BASE / "gateway-deployment.yaml"), "Deployment", "mmgate-gateway")
    pod = deployment["spec"]["template"]["spec"]
    gateway = container(deployment, "gateway")
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/health"
    # Liveness must not follow the backends' health: vLLM down makes gateways unready, not restarted.
    assert gateway["livenessProbe"]["httpGet"]["path"] != "/health"
    pre_stop = gateway["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    env = env_values(gateway)
    drain = float(env.get("MMGATE_DRAIN_TIMEOUT", GatewaySettings().drain_timeout_s))
    need = float(pre_stop[1]) + drain + CUT_GRACE_S
    assert pod["terminationGracePeriodSeconds"] >= math.ceil(need)
    assert {"cpu", "memory"} <= set(gateway["resources"]["requests"])
    assert "memory" in gateway["resources"]["limits"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert gateway["securityContext"]["allowPrivilegeEscalation"] is False
    assert gateway["ports"][0]["containerPort"] == int(env["MMGATE_PORT"])
    assert env["MMGATE_HOST"] == "0.0.0.0"
    # With API keys /metrics answers only the admin key: the manifests set one, and no probe asks it.
    if "MMGATE_API_KEYS_FILE" in env:
        assert "MMGATE_ADMIN_KEY_FILE" in env
        assert "/metrics" not in {gateway[p]["httpGet"]["path"] for p in ("livenessProbe", "startupProbe")}
    rolling = deployment["spec"]["strategy"]["rollingUpdate"]
    assert rolling["maxUnavailable"] == 0


@needs_kubectl
def test_fleet_is_wired(rendered: list[Resource]) -> None:
    deployment = one(rendered, "Deployment", "mmgate-gateway")
    gateway = container(deployment, "gateway")
    env = env_values(gateway)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]

    # Every MMGATE_* variable is one `mmgate serve` reads (a misspelt one would be silently ignored).
    known = serve_env_names()
    assert {name for name in env if name.startswith("MMGATE_")} - known == set()
    assert undefined_references(gateway) == []

    # Service, PDB and HPA point at the gateways.
    service = one(rendered, "Service", "mmgate")
    assert selects(service["spec"]["selector"], pod_labels)
    pdb = one(rendered, "PodDisruptionBudget", "mmgate-gateway")
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    hpa = one(rendered, "HorizontalPodAutoscaler", "mmgate-gateway")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "mmgate-gateway"
    assert hpa["spec"]["minReplicas"] >= 2

    # Every Secret key a pod reads exists in the Secret.
    secrets = {r["metadata"]["name"]: secret_values(r) for r in rendered if r["kind"] == "Secret"}
    for workload in (r for r in rendered if r["kind"] in ("Deployment", "StatefulSet", "Job")):
        spec = workload["spec"]["template"]["spec"]
        for cont in spec["containers"]:
            for item in cont.get("env", []):
                ref = item.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secrets[ref["name"]], (workload["metadata"]["name"], ref)
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                keys = secrets[volume["secret"]["secretName"]]
                assert {i["key"] for i in volume["secret"]["items"]} <= set(keys)
    gateway_secret = named(rendered, "Secret", "mmgate-secrets")["metadata"]["name"]
    assert {"tenant-secret", "api-keys.json"} <= set(secrets[gateway_secret])
    assert env["MMGATE_TENANT_SECRET"] == f"secret:{gateway_secret}/tenant-secret"
    assert env["MMGATE_API_KEYS_FILE"].endswith("/api-keys.json")

    # vLLM: a headless Service in front of a StatefulSet, discovered by the gateways through its DNS name.
    vllm_service = one(rendered, "Service", "vllm")
    assert vllm_service["spec"]["clusterIP"] == "None"
    vllm = one(rendered, "StatefulSet", "vllm")
    assert vllm["spec"]["serviceName"] == "vllm"
    assert selects(vllm_service["spec"]["selector"], vllm["spec"]["template"]["metadata"]["labels"])
    replicas = vllm["spec"]["replicas"]
    port = vllm_service["spec"]["ports"][0]["port"]
    assert replicas >= 2
    assert "MMGATE_BACKEND" not in env  # no static list to keep in step with the replicas
    assert env["MMGATE_BACKEND_DNS"] == f"vllm=http://{vllm_service['metadata']['name']}:{port}"
    assert vllm_service["spec"]["publishNotReadyAddresses"] is False  # a starting replica joins when ready
    # The gateway's assumed processor cache is vLLM's own.
    args = container(vllm, "vllm")["args"]
    assert float(arg_value(args, "--mm-processor-cache-gb") or "nan") == float(env["MMGATE_REUSE_BACKEND_CACHE_GB"])
    limits = json.loads(arg_value(args, "--limit-mm-per-prompt") or "{}")
    assert limits.get("image") == int(env["MMGATE_MAX_IMAGES_PER_REQUEST"])

    # Redis Cluster: 3 masters with one replica each, reached by the gateways in cluster mode.
    redis = one(rendered, "StatefulSet", "redis")
    redis_service = one(rendered, "Service", "redis")
    assert redis_service["spec"]["clusterIP"] == "None"
    assert redis["spec"]["serviceName"] == "redis"
    redis_args = " ".join(container(redis, "redis")["args"])
    assert "--cluster-enabled yes" in redis_args
    create = " ".join(container(one(rendered, "Job", "redis-cluster-create"), "create")["args"])
    per_master = int(re.search(r"--cluster-replicas (\d+)", create).group(1))  # type: ignore[union-attr]
    assert redis["spec"]["replicas"] == 3 * (per_master + 1)
    assert f"for i in {' '.join(str(i) for i in range(redis['spec']['replicas']))};" in create
    assert env["MMGATE_REDIS_CLUSTER"] == "1"
    assert env["MMGATE_REDIS_URL"].startswith("redis://") and "@redis:6379" in env["MMGATE_REDIS_URL"]


def test_env_check_catches_a_misspelt_variable() -> None:
    """The env-name check can fail: a misspelt variable is not one `mmgate serve` reads."""
    known = serve_env_names()
    assert "MMGATE_DRAIN_TIMEOUT" in known and "MMGATE_REDIS_CLUSTER" in known
    assert "MMGATE_DRAIN_TIMOUT" not in known


def test_deploy_guide_names_real_variables() -> None:
    """Every MMGATE_* variable docs/DEPLOY.md tells an operator to set is one `mmgate serve` reads."""
    guide = (BASE.parents[2] / "docs" / "DEPLOY.md").read_text()
    named = set(re.findall(r"\bMMGATE_[A-Z0-9_]*[A-Z0-9]\b", guide)) - {"MMGATE_SOME_FLAG"}  # the naming rule
    assert named and named - serve_env_names() == set()
