"""Building and running the container image for the docker tests of tests/deploy, with the real
docker CLI: why docker cannot be used here (a reason to skip with), a build context that holds
exactly the files of a clean checkout, the wheelhouse, a free port, /health, and small waits."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.deploy.manifests import ROOT

BASE_TAG = "mmgate-base:bookworm-py311"
# The wheelhouse the test fills once (from the package index, on the host) and reuses.
WHEEL_CACHE = ROOT / "build" / "wheelhouse"
DOCKER_TIMEOUT_S = 60
BUILD_TIMEOUT_S = 600


def docker(*args: str, timeout: float = DOCKER_TIMEOUT_S, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the docker CLI; CalledProcessError (with its output) when ``check`` and it fails."""
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=check)


def unusable_reason() -> str | None:
    """Why the image test cannot run here, or None when it can."""
    if shutil.which("docker") is None:
        return "docker is not installed (Debian: apt-get install docker.io debootstrap, then start dockerd)"
    try:
        info = docker("info", "--format", "{{.ServerVersion}}", check=False, timeout=20)
    except subprocess.TimeoutExpired:
        return "docker info did not answer in 20 s"
    if info.returncode != 0:
        return f"the docker daemon is not usable: {info.stderr.strip().splitlines()[-1:]}"
    if docker("image", "inspect", BASE_TAG, check=False).returncode != 0:
        if os.geteuid() != 0:
            return f"base image {BASE_TAG} is missing and building it (debootstrap) needs root"
        if shutil.which("debootstrap") is None:
            return f"base image {BASE_TAG} is missing and debootstrap is not installed"
    return None


def build_base_image(timeout: float) -> None:
    """The Debian base image (tools/debian_base_image.sh; nothing to do when docker has it)."""
    subprocess.run([str(ROOT / "tools" / "debian_base_image.sh"), BASE_TAG], capture_output=True,
                   text=True, timeout=timeout, check=True)


def clean_checkout(dest: Path) -> Path:
    """Copy the files a clone of this tree would have — tracked and untracked-but-not-ignored — so
    that no build output, venv or wheel of this working tree reaches the build."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, check=True, timeout=30).stdout
    archive = dest.with_suffix(".tar")
    with tarfile.open(archive, "w") as tar:
        for name in sorted(set(filter(None, listed.decode().split("\0")))):
            if (ROOT / name).exists():  # listed but deleted in the working tree
                tar.add(ROOT / name, arcname=name, recursive=False)
    dest.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    archive.unlink()
    return dest


def fill_wheelhouse(dest: Path, timeout: float) -> int:
    """Copy the cached wheelhouse into ``dest`` (filling the cache first when it is empty or was
    filled for other dependencies: its stamp hashes pyproject.toml and tools/wheelhouse.sh, which
    picks the extras); the wheel count."""
    stamp = WHEEL_CACHE / "pyproject.sha256"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()
                          + (ROOT / "tools" / "wheelhouse.sh").read_bytes()).hexdigest()
    if not any(WHEEL_CACHE.glob("*.whl")) or not stamp.exists() or stamp.read_text() != want:
        subprocess.run([str(ROOT / "tools" / "wheelhouse.sh"), str(WHEEL_CACHE), sys.executable],
                       capture_output=True, text=True, timeout=timeout, check=True)
        stamp.write_text(want)
    wheels = list(WHEEL_CACHE.glob("*.whl"))
    for wheel in wheels:
        shutil.copy2(wheel, dest / wheel.name)
    return len(wheels)


def wait_for(predicate: Any, timeout: float, interval: float = 0.5) -> bool:
    """Poll ``predicate()`` until it is true or ``timeout`` seconds pass; its last answer."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def health(url: str) -> dict[str, Any] | None:
    """The gateway's /health answer at ``url``, or None while it answers nothing (or not 200)."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer
    except (OSError, urllib.error.URLError):
        return None
