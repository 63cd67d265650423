"""docs/DEPLOY.md as an operator follows it, line by line where a line can be checked here: its overlay
renders and validates as written, its kubectl commands name the namespace, its docker commands give
the drain time to stop, its test commands use the project's environment and name files that exist,
its file tables name the files there are, and the settings it states are the ones the code has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mmgate.config import GatewaySettings
from mmgate.serve.start import CUT_GRACE_S
from tests.deploy.manifests import (
    BASE,
    KUBE,
    ROOT,
    container,
    kubectl,
    named,
    one,
    render,
    render_overlay,
    secret_values,
)
from tests.deploy.memory_load import GatewayPod, quantity_bytes
from tests.deploy.test_manifests import schema_errors

GUIDE = ROOT / "docs" / "DEPLOY.md"
NAMESPACE = "mmgate"
OVERLAY_MARK = "# deploy/kubernetes/overlays/mine/kustomization.yaml"


def guide() -> str:
    return GUIDE.read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", guide(), re.S)


def commands(program: str) -> list[str]:
    """Each command line of the guide's bash blocks that runs ``program`` (continuations joined)."""
    found = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|\||;|\$\(", line.split("#", 1)[0]):
                words = part.split()
                if words and words[0] == program:
                    found.append(part.strip())
    return found


def test_the_guides_overlay_renders_as_written(tmp_path: Path) -> None:
    if kubectl() is None:
        pytest.skip("kubectl is not on PATH: the overlay is not rendered")
    [overlay] = [b for b in blocks("yaml") if b.startswith(OVERLAY_MARK)]
    files = {
        "namespace.yaml": (KUBE / "overlays" / "production" / "namespace.yaml").read_text(),
        "secrets/api-keys.json": '{"sk-0123456789abcdef": "team-a"}',
        "secrets/mmgate.env": "tenant-secret=0123456789abcdef0123\nredis-password=pw-1\n"
                              "routing-sync-secret=0123456789abcdef0123456789abcdef\nadmin-key=admin-1\n",
        "secrets/vllm.env": "hf-token=hf_0123\n",
    }
    resources = render_overlay(tmp_path, overlay, files)
    core = [r for r in resources if not r["apiVersion"].startswith("monitoring.coreos.com")]
    assert schema_errors(core) == []
    assert {r["metadata"]["name"] for r in resources if r["kind"] == "PodMonitor"} == {"mmgate-gateway", "vllm"}
    assert all(r["metadata"].get("namespace") == NAMESPACE for r in resources if r["kind"] != "Namespace")
    assert secret_values(named(resources, "Secret", "mmgate-secrets"))["admin-key"] == "admin-1"
    assert secret_values(named(resources, "Secret", "vllm-secrets"))["hf-token"] == "hf_0123"


def test_kubectl_commands_name_the_namespace() -> None:
    """A command on one object must say where it is; ``apply -k``/``kustomize`` take it from the overlay."""
    lines = commands("kubectl")
    assert lines
    for line in lines:
        words = line.split()
        if words[1] == "kustomize" or (words[1] == "apply" and "-k" in words):
            continue
        assert re.search(rf"(^|\s)-n {NAMESPACE}(\s|$)", line), line


def test_docker_run_gives_the_drain_time_to_stop() -> None:
    need = GatewaySettings().drain_timeout_s + CUT_GRACE_S
    runs = commands("docker")
    runs = [r for r in runs if r.split()[1] == "run" and "mmgate:" in r]
    assert runs
    for run in runs:
        timeout = re.search(r"--stop-timeout[ =](\d+)", run)
        assert timeout and int(timeout.group(1)) > need, run
    assert re.search(r"docker stop -t (\d+)", guide())


def test_test_commands_use_the_projects_environment() -> None:
    lines = [line for block in blocks("bash") for line in block.replace("\\\n", " ").splitlines() if "pytest" in line]
    assert lines
    for line in lines:
        assert line.startswith(".venv/bin/python -m pytest"), line
        for path in re.findall(r"\btests/\S+\.py", line):
            assert (ROOT / path).exists(), path


def test_the_file_tables_name_the_files_there_are() -> None:
    text = guide()
    table = text[text.index("| file (`base/`) | what |"):text.index("| directory | what |")]
    named_files = set(re.findall(r"`([a-z-]+\.yaml)`", table))
    listed = {p.name for p in BASE.glob("*.yaml")}
    assert named_files == listed
    directories = set(re.findall(r"\| `((?:overlays|components)/[a-z-]+)/`", text))
    on_disk = {p.parent.relative_to(KUBE).as_posix() for p in KUBE.glob("*/*/kustomization.yaml")}
    assert directories == on_disk


def test_the_guide_says_what_the_code_does() -> None:
    text = guide()
    assert "--help-all" in text  # --help lists only what an operator usually decides
    sync = text[text.index("`MMGATE_ROUTING_SYNC=1`"):][:600]
    assert "MMGATE_ROUTING_SYNC_SECRET_FILE" in sync  # the sync refuses to start without it
    assert "MMGATE_BACKEND_DNS_START_TIMEOUT" in text
    assert "gateway-secret.yaml" not in text  # the Secrets are generated
    assert "backend list to match" not in text  # the gateways discover vLLM: nothing to match


def test_the_resources_it_states_are_the_deployments() -> None:
    """§3's "Resources" states the gateway's memory request, limit and the settings that bound its
    memory as the rendered Deployment has them (MiB and GiB spelt as the guide spells them)."""
    if kubectl() is None:
        pytest.skip("kubectl is not on PATH: the Deployment is not rendered")
    resources = render(KUBE / "overlays" / "production")
    pod = GatewayPod.from_rendered(resources)
    deployment = one(resources, "Deployment", "mmgate-gateway")
    requests = container(deployment, "gateway")["resources"]["requests"]
    text = guide()
    bullet = text[text.index("* **Resources**"):][:1200]

    def spelt(num_bytes: int) -> str:
        return f"{num_bytes / (1 << 30):g} GiB" if num_bytes >= 1 << 30 else f"{num_bytes >> 20} MiB"

    assert f"{spelt(quantity_bytes(requests['memory']))} requested" in bullet
    assert f"{spelt(pod.memory_limit)} memory limit" in bullet
    for name in ("MMGATE_LOCAL_CACHE_BYTES", "MMGATE_UUID_STORE_BYTES", "MMGATE_MAX_BODY_BYTES"):
        assert f"`{name}`, {spelt(int(pod.env[name]))}" in bullet, name
    pixels = int(pod.env["MMGATE_MAX_DECODE_QUEUE_PIXELS"])
    assert f"`MMGATE_MAX_DECODE_QUEUE_PIXELS`, {pixels // 1_000_000} megapixels" in bullet
