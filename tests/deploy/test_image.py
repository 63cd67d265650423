"""The container image (Dockerfile), built and run with the real docker: from a clean checkout, on a
base image made from Debian's packages (no registry is reachable here) and a wheelhouse (pip in the
build reaches no index), it stays under its size budget, runs as a non-root user configured by
MMGATE_* variables, answers the README's two quickstart requests, turns healthy, and on SIGTERM lets a
stream in flight finish before it exits 0.

Skipped, with the reason, where docker cannot run (no docker, no daemon, or no base image and no way
to build it). The first run here builds the base image (debootstrap, minutes) and fills the wheelhouse
(build/wheelhouse); later runs reuse both.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.image import docker, free_port, health, unusable_reason, wait_for
from tests.deploy.manifests import ROOT
from tests.support.redis_servers import RedisClusterServers

REASON = unusable_reason()
# The first test pays for the base image, the wheelhouse and the build (conftest's ``image``).
needs_docker = pytest.mark.skipif(REASON is not None, reason=f"image test: {REASON}")
builds_image = pytest.mark.timeout(1800)

# The image's size budget: 386 MB with PyAV (its FFmpeg libraries are 104 MB of it) on the 123 MB
# Debian base (docs/DEPLOY.md, section 1); a new dependency that crosses it is a decision to state.
MAX_IMAGE_BYTES = 400 * 1000 * 1000
DRAIN_S = 5
REQUEST_TIMEOUT_S = 30
# What the gateway pod's securityContext imposes (deploy/kubernetes/base/gateway-deployment.yaml).
POD_SECURITY = ("--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges")
# The embedded engines run this many times slower than their model, so that a stream of STREAM_TOKENS
# is still going when SIGTERM comes (about 3 s here).
SIM_SPEEDUP = 0.1
STREAM_TOKENS = 40


def readme_requests() -> tuple[str, list[dict[str, Any]]]:
    """The session id and the JSON bodies of the README's two quickstart curl requests."""
    text = (ROOT / "README.md").read_text()
    image = re.search(r"IMG='(data:image/[^']+)'", text)
    assert image is not None, "README lost its IMG= line"
    block = text[image.end():text.index("```", image.end())]
    session = re.findall(r"-H 'x-session-id: ([^']+)'", block)
    bodies = re.findall(r"-d '(\{.*?\})'\n", block.replace("'\"$IMG\"'", image.group(1)), re.S)
    assert len(bodies) == 2 and len(set(session)) == 1, "README's quickstart is no longer two curls of one session"
    return session[0], [json.loads(b) for b in bodies]


def post(url: str, body: dict[str, Any], session: str, key: str | None = None
         ) -> tuple[int, dict[str, str], dict[str, Any]]:
    headers = {"Content-Type": "application/json", "x-session-id": session}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
        return response.status, dict(response.headers), json.loads(response.read())


def stream_lines(url: str, first_line: threading.Event, lines: list[str]) -> None:
    """A streamed chat completion read line by line into ``lines``; ``first_line`` set at its first."""
    body = {"model": "mmgate-sim-vl", "stream": True, "max_tokens": STREAM_TOKENS,
            "messages": [{"role": "user", "content": "count"}]}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
        for raw in response:
            lines.append(raw.decode().strip())
            first_line.set()


@needs_docker
@builds_image
def test_image_is_small_and_not_root(image: str) -> None:
    size = int(docker("image", "inspect", "--format", "{{.Size}}", image).stdout)
    assert size <= MAX_IMAGE_BYTES, f"{size / 1e6:.0f} MB"
    config = json.loads(docker("image", "inspect", "--format", "{{json .Config}}", image).stdout)
    assert config["User"] and not config["User"].startswith(("0", "root"))
    assert config["Healthcheck"]["Test"][0] == "CMD"
    assert config["Entrypoint"] == ["mmgate", "serve"]
    # Only what `mmgate serve` needs: no pip, no sources in the image.
    listing = docker("run", "--rm", "--entrypoint", "sh", image, "-c",
                     "ls /opt/mmgate/bin; test -e /src && echo HAS-SRC; true").stdout.split()
    assert "mmgate" in listing and "pip" not in listing and "HAS-SRC" not in listing


@needs_docker
@builds_image
def test_container_serves_the_readme_and_drains_on_sigterm(image: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    run = docker("run", "--detach", "--publish", f"127.0.0.1:{port}:8000", *POD_SECURITY,
                 "--env", "MMGATE_EMBEDDED_ENGINES=3", "--env", f"MMGATE_DRAIN_TIMEOUT={DRAIN_S}",
                 "--env", f"MMGATE_SIM_SPEEDUP={SIM_SPEEDUP}", image)
    name = run.stdout.strip()
    try:
        assert wait_for(lambda: health(url) is not None, 60), docker("logs", name).stderr[-2000:]
        answer = health(url)
        assert answer is not None and answer["status"] == "ok"
        assert len(answer["backends"]) == 3  # MMGATE_EMBEDDED_ENGINES reached the gateway

        session, bodies = readme_requests()
        chat = url + "/v1/chat/completions"
        status1, headers1, first = post(chat, bodies[0], session)
        status2, headers2, second = post(chat, bodies[1], session)
        assert (status1, status2) == (200, 200)
        assert first["choices"][0]["message"]["content"] and second["choices"][0]["message"]["content"]
        assert "sent=1" in headers1["x-mmgate-reuse"]
        assert "referenced=1" in headers2["x-mmgate-reuse"]
        assert headers1["x-mmgate-backend"] == headers2["x-mmgate-backend"]

        def healthy() -> bool:
            state = docker("inspect", "--format", "{{.State.Health.Status}}", name).stdout.strip()
            assert state in ("starting", "healthy"), state
            return state == "healthy"

        assert wait_for(healthy, 40, interval=1.0)

        # SIGTERM while a stream is in flight: the stream finishes (drain), then the gateway exits 0.
        first_line = threading.Event()
        lines: list[str] = []
        reader = threading.Thread(target=stream_lines, args=(chat, first_line, lines), daemon=True)
        reader.start()
        assert first_line.wait(REQUEST_TIMEOUT_S)
        before_sigterm = list(lines)
        docker("stop", "--time", str(DRAIN_S + 20), name, timeout=DRAIN_S + 40)  # SIGTERM, then SIGKILL
        state = json.loads(docker("inspect", "--format", "{{json .State}}", name).stdout)
        logs = docker("logs", name)
        assert state["ExitCode"] == 0 and not state["OOMKilled"], logs.stderr[-2000:]  # not SIGKILL's 137
        reader.join(REQUEST_TIMEOUT_S)
        data = [line for line in lines if line.startswith("data:")]
        assert data[-1] == "data: [DONE]" and not any('"error"' in line for line in data), data[-3:]
        assert "data: [DONE]" not in before_sigterm  # it was still streaming when SIGTERM came
        assert "Traceback" not in logs.stdout + logs.stderr
    finally:
        docker("rm", "--force", name, check=False)


def test_readme_requests_are_found() -> None:
    """The README parse the container test relies on finds both requests, the second by uuid only."""
    session, bodies = readme_requests()
    assert session
    parts = [b["messages"][0]["content"][1] for b in bodies]
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert parts[1]["image_url"] is None and parts[1]["uuid"] == parts[0]["uuid"]


@needs_docker
@builds_image
def test_container_takes_api_keys_and_tenant_secret(image: str, tmp_path: Path) -> None:
    """Configured as the Kubernetes Secret configures it: a mounted keys file and a tenant secret."""
    keys = tmp_path / "api-keys.json"
    keys.write_text(json.dumps({"sk-test-a": "tenant-a"}))
    keys.chmod(0o644)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    run = docker("run", "--detach", "--publish", f"127.0.0.1:{port}:8000", *POD_SECURITY,
                 "--volume", f"{keys}:/etc/mmgate/api-keys.json:ro",
                 "--env", "MMGATE_API_KEYS_FILE=/etc/mmgate/api-keys.json",
                 "--env", "MMGATE_TENANT_SECRET=a-tenant-secret-of-32-characters", image)
    name = run.stdout.strip()
    try:
        assert wait_for(lambda: health(url) is not None, 60), docker("logs", name).stderr[-2000:]
        session, bodies = readme_requests()
        with pytest.raises(urllib.error.HTTPError) as refused:
            post(url + "/v1/chat/completions", bodies[0], session)
        assert refused.value.code == 401
        status, _, answer = post(url + "/v1/chat/completions", bodies[0], session, key="sk-test-a")
        assert status == 200 and answer["choices"][0]["message"]["content"]
    finally:
        docker("rm", "--force", name, check=False)



@needs_docker
@builds_image
def test_two_containers_share_a_redis_cluster(image: str, cluster_servers: RedisClusterServers) -> None:
    """Two gateway containers on one real 3-master Redis Cluster, as the fleet runs them: an image
    sent with its uuid through one is found by uuid alone through the other (the shared uuid store),
    though each has engines of its own. Host networking (the cluster's nodes listen on the host's
    loopback), every port on 127.0.0.1."""
    urls, names = [], []
    try:
        for _ in range(2):
            port = free_port()
            urls.append(f"http://127.0.0.1:{port}")
            names.append(docker(
                "run", "--detach", "--network", "host", *POD_SECURITY,
                "--env", "MMGATE_HOST=127.0.0.1", "--env", f"MMGATE_PORT={port}",
                "--env", f"MMGATE_REDIS_URL={cluster_servers.url}", "--env", "MMGATE_REDIS_CLUSTER=1",
                "--env", "MMGATE_TENANT_SECRET=a-tenant-secret-of-32-characters", image).stdout.strip())
        for url, name in zip(urls, names, strict=True):
            assert wait_for(lambda url=url: health(url) is not None, 60), docker("logs", name).stderr[-2000:]
        session, bodies = readme_requests()
        status1, _, first = post(urls[0] + "/v1/chat/completions", bodies[0], session)
        status2, headers2, second = post(urls[1] + "/v1/chat/completions", bodies[1], session)
        assert (status1, status2) == (200, 200), (first, second)
        assert second["choices"][0]["message"]["content"]
        # The client sent no bytes; the second gateway's engines never saw the image: it took the
        # image from the cluster by uuid (healed) and sent its bytes to its engine.
        reuse = headers2["x-mmgate-reuse"]
        assert "sent=1" in reuse and "healed=1" in reuse, reuse
    finally:
        for name in names:
            docker("rm", "--force", name, check=False)
