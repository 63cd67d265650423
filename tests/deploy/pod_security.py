"""Kubernetes' Pod Security Standards, level "restricted" (which includes "baseline"), as the rules
of https://kubernetes.io/docs/concepts/security/pod-security-standards/ state them, checked one by one
on a pod template: ``violations(template)`` names each rule a template breaks. The admission
controller cannot run here; this reads the same fields it reads."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

Pod = dict[str, Any]  # a pod template: {"metadata": ..., "spec": ...}

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def containers(pod: Pod) -> Iterator[dict[str, Any]]:
    spec = pod["spec"]
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key, [])


def _pod_ctx(pod: Pod) -> dict[str, Any]:
    return pod["spec"].get("securityContext") or {}


def _ctx(container: dict[str, Any]) -> dict[str, Any]:
    return container.get("securityContext") or {}


def _effective(pod: Pod, container: dict[str, Any], field: str) -> Any:
    """A container's setting, else the pod's (the fields both levels have)."""
    value = _ctx(container).get(field)
    return _pod_ctx(pod).get(field) if value is None else value


def _host_process(pod: Pod) -> bool:
    levels = [_pod_ctx(pod), *(_ctx(c) for c in containers(pod))]
    return not any((level.get("windowsOptions") or {}).get("hostProcess") for level in levels)


def _host_namespaces(pod: Pod) -> bool:
    return not any(pod["spec"].get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))


def _privileged(pod: Pod) -> bool:
    return not any(_ctx(c).get("privileged") for c in containers(pod))


def _baseline_capabilities(pod: Pod) -> bool:
    return all(set((_ctx(c).get("capabilities") or {}).get("add", [])) <= BASELINE_CAPABILITIES
               for c in containers(pod))


def _host_path(pod: Pod) -> bool:
    return not any("hostPath" in v for v in pod["spec"].get("volumes", []))


def _host_ports(pod: Pod) -> bool:
    return not any(p.get("hostPort") for c in containers(pod) for p in c.get("ports", []))


def _apparmor(pod: Pod) -> bool:
    profiles = [(level.get("appArmorProfile") or {}).get("type")
                for level in [_pod_ctx(pod), *(_ctx(c) for c in containers(pod))]]
    annotations = [v for k, v in (pod.get("metadata", {}).get("annotations") or {}).items()
                   if k.startswith("container.apparmor.security.beta.kubernetes.io/")]
    return (all(p in (None, "RuntimeDefault", "Localhost") for p in profiles)
            and all(a == "runtime/default" or a.startswith("localhost/") for a in annotations))


def _selinux(pod: Pod) -> bool:
    for level in [_pod_ctx(pod), *(_ctx(c) for c in containers(pod))]:
        options = level.get("seLinuxOptions") or {}
        if options.get("type", "") not in SELINUX_TYPES or options.get("user") or options.get("role"):
            return False
    return True


def _proc_mount(pod: Pod) -> bool:
    return all(_ctx(c).get("procMount") in (None, "Default") for c in containers(pod))


def _seccomp_not_unconfined(pod: Pod) -> bool:
    levels = [_pod_ctx(pod), *(_ctx(c) for c in containers(pod))]
    return not any((level.get("seccompProfile") or {}).get("type") == "Unconfined" for level in levels)


def _sysctls(pod: Pod) -> bool:
    return all(s["name"] in SAFE_SYSCTLS for s in _pod_ctx(pod).get("sysctls", []))


def _volume_types(pod: Pod) -> bool:
    return all(set(v) - {"name"} <= RESTRICTED_VOLUMES for v in pod["spec"].get("volumes", []))


def _no_privilege_escalation(pod: Pod) -> bool:
    return all(_ctx(c).get("allowPrivilegeEscalation") is False for c in containers(pod))


def _non_root(pod: Pod) -> bool:
    return all(_effective(pod, c, "runAsNonRoot") is True for c in containers(pod))


def _non_root_user(pod: Pod) -> bool:
    return _pod_ctx(pod).get("runAsUser") != 0 and all(_ctx(c).get("runAsUser") != 0 for c in containers(pod))


def _seccomp_set(pod: Pod) -> bool:
    return all((_effective(pod, c, "seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
               for c in containers(pod))


def _capabilities_dropped(pod: Pod) -> bool:
    for c in containers(pod):
        caps = _ctx(c).get("capabilities") or {}
        if "ALL" not in caps.get("drop", []) or set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            return False
    return True


# (level, rule as the standard names it, check): the check is true when the template meets the rule.
RULES: list[tuple[str, str, Callable[[Pod], bool]]] = [
    ("baseline", "HostProcess", _host_process),
    ("baseline", "Host Namespaces", _host_namespaces),
    ("baseline", "Privileged Containers", _privileged),
    ("baseline", "Capabilities", _baseline_capabilities),
    ("baseline", "HostPath Volumes", _host_path),
    ("baseline", "Host Ports", _host_ports),
    ("baseline", "AppArmor", _apparmor),
    ("baseline", "SELinux", _selinux),
    ("baseline", "/proc Mount Type", _proc_mount),
    ("baseline", "Seccomp", _seccomp_not_unconfined),
    ("baseline", "Sysctls", _sysctls),
    ("restricted", "Volume Types", _volume_types),
    ("restricted", "Privilege Escalation", _no_privilege_escalation),
    ("restricted", "Running as Non-root", _non_root),
    ("restricted", "Running as Non-root user", _non_root_user),
    ("restricted", "Seccomp", _seccomp_set),
    ("restricted", "Capabilities", _capabilities_dropped),
]


def violations(pod: Pod) -> list[str]:
    """Each rule of "restricted" (and "baseline") the pod template breaks, as 'level: rule'."""
    return [f"{level}: {rule}" for level, rule, check in RULES if not check(pod)]
