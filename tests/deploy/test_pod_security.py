"""Every pod template of every rendered kustomization (gateways, vLLM, Redis, the Job that forms the
cluster) meets Pod Security "restricted", rule by rule (tests/deploy/pod_security.py), as the
production namespace enforces; and each rule's check can fail."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.deploy.manifests import BASE, KUSTOMIZATIONS, Resource, kubectl, render, workloads
from tests.deploy.pod_security import RULES, violations

pytestmark = pytest.mark.skipif(kubectl() is None, reason="kubectl is not on PATH: nothing is rendered")

RENDERED = {k.relative_to(BASE.parent).as_posix(): k for k in KUSTOMIZATIONS}
EXPECTED_WORKLOADS = {"Deployment/mmgate-gateway", "StatefulSet/vllm", "StatefulSet/redis", "Job/redis-cluster-create"}


@pytest.fixture(scope="module", params=sorted(RENDERED))
def rendered(request: pytest.FixtureRequest) -> list[Resource]:
    return render(RENDERED[request.param])


def test_every_pod_meets_restricted(rendered: list[Resource]) -> None:
    found = {f"{w['kind']}/{w['metadata']['name']}": violations(w["spec"]["template"]) for w in workloads(rendered)}
    assert set(found) == EXPECTED_WORKLOADS
    assert {name: broken for name, broken in found.items() if broken} == {}


def good_pod() -> dict[str, Any]:
    return {"metadata": {}, "spec": {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": False,
                                                         "capabilities": {"drop": ["ALL"]}}}],
        "volumes": [{"name": "tmp", "emptyDir": {}}]}}


def breaking(rule: str) -> dict[str, Any]:
    """A pod that breaks ``rule`` (and, where one field serves two rules, its twin)."""
    pod = good_pod()
    spec, cont = pod["spec"], pod["spec"]["containers"][0]
    ctx = cont["securityContext"]
    match rule:
        case "HostProcess":
            ctx["windowsOptions"] = {"hostProcess": True}
        case "Host Namespaces":
            spec["hostNetwork"] = True
        case "Privileged Containers":
            ctx["privileged"] = True
        case "Capabilities":
            ctx["capabilities"] = {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
        case "HostPath Volumes":
            spec["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
        case "Host Ports":
            cont["ports"] = [{"containerPort": 80, "hostPort": 80}]
        case "AppArmor":
            ctx["appArmorProfile"] = {"type": "Unconfined"}
        case "SELinux":
            ctx["seLinuxOptions"] = {"type": "spc_t"}
        case "/proc Mount Type":
            ctx["procMount"] = "Unmasked"
        case "Seccomp":
            spec["securityContext"]["seccompProfile"] = {"type": "Unconfined"}
        case "Sysctls":
            spec["securityContext"]["sysctls"] = [{"name": "kernel.msgmax", "value": "1"}]
        case "Volume Types":
            spec["volumes"].append({"name": "nfs", "nfs": {"server": "x", "path": "/"}})
        case "Privilege Escalation":
            del ctx["allowPrivilegeEscalation"]
        case "Running as Non-root":
            ctx["runAsNonRoot"] = False
        case "Running as Non-root user":
            ctx["runAsUser"] = 0
        case _:
            raise AssertionError(rule)
    return pod


def test_a_good_pod_breaks_no_rule() -> None:
    assert violations(good_pod()) == []


@pytest.mark.parametrize("rule", sorted({rule for _, rule, _ in RULES}))
def test_each_rule_can_fail(rule: str) -> None:
    broken = {b.split(": ", 1)[1] for b in violations(breaking(rule))}
    # A hostPath volume is also a volume type restricted does not allow.
    assert broken == ({rule, "Volume Types"} if rule == "HostPath Volumes" else {rule})


def test_restricted_needs_capabilities_dropped_and_seccomp_set() -> None:
    """The two restricted rules that a field's absence breaks (baseline allows both)."""
    pod = good_pod()
    del pod["spec"]["containers"][0]["securityContext"]["capabilities"]
    assert violations(pod) == ["restricted: Capabilities"]
    pod = copy.deepcopy(good_pod())
    del pod["spec"]["securityContext"]["seccompProfile"]
    assert violations(pod) == ["restricted: Seccomp"]
