"""Reading the Kubernetes manifests of ``deploy/kubernetes``: the files of the base as they are, and
each kustomization rendered by ``kubectl kustomize`` (when kubectl is on PATH), as lists of
resources — also an operator's own overlay, written beside a copy of the tree — and the few
questions the tests ask of them."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
BASE = KUBE / "base"
COMPONENTS = KUBE / "components"
OVERLAYS = sorted(p.parent for p in (KUBE / "overlays").glob("*/kustomization.yaml"))
KUSTOMIZATIONS = [BASE, *OVERLAYS]
# The Kubernetes versions the manifests are checked against (kubernetes-validate's bundled schemas):
# the oldest one supported upstream when the manifests were written, and the newest bundled.
K8S_VERSIONS = ("1.32.0", "1.37.0")
RENDER_TIMEOUT_S = 60

Resource = dict[str, Any]


def base_files() -> list[Path]:
    """The resource files the base kustomization lists."""
    listed = yaml.safe_load((BASE / "kustomization.yaml").read_text())["resources"]
    return [BASE / name for name in listed]


def load_file(path: Path) -> list[Resource]:
    """The resources of one YAML file (empty documents dropped)."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def kubectl() -> str | None:
    """kubectl on PATH, or None."""
    return shutil.which("kubectl")


def render(kustomization: Path) -> list[Resource]:
    """``kubectl kustomize`` of a directory, as resources; CalledProcessError carries its stderr."""
    exe = kubectl()
    assert exe is not None
    out = subprocess.run([exe, "kustomize", str(kustomization)], capture_output=True, text=True,
                         timeout=RENDER_TIMEOUT_S, check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def render_overlay(tmp: Path, kustomization: str, files: dict[str, str] | None = None) -> list[Resource]:
    """An operator's overlay ``overlays/mine`` (its kustomization.yaml and other files) rendered
    beside a copy of ``deploy/kubernetes`` in ``tmp`` (kustomize takes no absolute paths)."""
    tree = tmp / "kubernetes"
    if not tree.exists():
        shutil.copytree(KUBE, tree)
    mine = tree / "overlays" / "mine"
    mine.mkdir(parents=True, exist_ok=True)
    (mine / "kustomization.yaml").write_text(kustomization)
    for name, text in (files or {}).items():
        (mine / name).parent.mkdir(parents=True, exist_ok=True)
        (mine / name).write_text(text)
    return render(mine)


def secret_values(secret: Resource) -> dict[str, str]:
    """A Secret's keys and values, from ``data`` (base64, as generators write it) or ``stringData``."""
    values = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
    values.update(secret.get("stringData") or {})
    return values


def named(resources: list[Resource], kind: str, prefix: str) -> Resource:
    """The one resource of that kind whose name is ``prefix`` or ``prefix-<hash>`` (a generated one)."""
    found = [r for r in resources if r["kind"] == kind
             and re.fullmatch(re.escape(prefix) + r"(-[a-z0-9]{10})?", r["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind}/{prefix}[-hash], found {len(found)}"
    return found[0]


def workloads(resources: list[Resource]) -> list[Resource]:
    """Every resource with a pod template: Deployments, StatefulSets, DaemonSets, Jobs."""
    return [r for r in resources if r["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")]


def one(resources: list[Resource], kind: str, name: str) -> Resource:
    """The one resource of that kind and name (AssertionError otherwise)."""
    found = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def container(workload: Resource, name: str) -> dict[str, Any]:
    """A workload's container by name."""
    found = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    assert len(found) == 1, f"{workload['metadata']['name']} has no container {name!r}"
    return found[0]


def env_values(cont: dict[str, Any]) -> dict[str, str]:
    """A container's plain env values (the ones from a Secret map to ``secret:<name>/<key>``)."""
    out: dict[str, str] = {}
    for item in cont.get("env", []):
        if "value" in item:
            out[item["name"]] = str(item["value"])
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            out[item["name"]] = f"secret:{ref['name']}/{ref['key']}"
    return out


def undefined_references(cont: dict[str, Any]) -> list[str]:
    """``$(VAR)`` references in env values and args that no earlier env entry defines (Kubernetes
    leaves those unexpanded: a literal ``$(VAR)`` in a URL or a flag)."""
    seen: set[str] = set()
    missing = []
    for item in cont.get("env", []):
        for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", str(item.get("value", ""))):
            if ref not in seen:
                missing.append(f"{item['name']} uses $({ref})")
        seen.add(item["name"])
    for arg in [*cont.get("command", []), *cont.get("args", [])]:
        missing += [f"arg uses $({r})" for r in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg)
                    if r not in seen]
    return missing


def arg_value(args: list[str], flag: str) -> str | None:
    """The value of ``--flag=value`` (or ``--flag value``) in an argument list."""
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
    return None


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """A matchLabels selector matches these labels."""
    return all(labels.get(k) == v for k, v in selector.items())
