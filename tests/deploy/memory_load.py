"""What tests/deploy/test_memory_limit.py needs beside docker: the gateway container's settings as
the rendered Deployment gives them, an image origin on loopback, the requests of its load, and the
container's memory as its cgroup counts it."""

from __future__ import annotations

import base64
import io
import json
import re
import struct
import threading
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from tests.deploy.manifests import Resource, container, named, one, secret_values

REQUEST_TIMEOUT_S = 120
_QUANTITY = re.compile(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?")
_UNITS = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
          "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def quantity_bytes(text: str) -> int:
    """A Kubernetes memory quantity (``2Gi``, ``512Mi``, ``1000000``) in bytes."""
    match = _QUANTITY.fullmatch(text)
    assert match is not None, f"unsupported quantity {text!r}"
    return int(match.group(1)) * _UNITS[match.group(2)]


@dataclass
class GatewayPod:
    """The gateway container of the rendered Deployment, as docker must run it: its environment
    (Secret references resolved from the rendered Secret), its Secret volumes' files, its emptyDirs
    and its memory limit."""

    env: dict[str, str]
    secret_files: dict[str, dict[str, str]]  # mount path -> file name -> content
    empty_dirs: dict[str, int]  # mount path -> size limit, bytes
    memory_limit: int
    user: str

    @classmethod
    def from_rendered(cls, resources: list[Resource]) -> GatewayPod:
        deployment = one(resources, "Deployment", "mmgate-gateway")
        spec = deployment["spec"]["template"]["spec"]
        cont = container(deployment, "gateway")
        secrets = {r["metadata"]["name"]: secret_values(r) for r in resources if r["kind"] == "Secret"}
        named(resources, "Secret", "mmgate-secrets")  # exactly one, hashed or not
        env = {}
        for item in cont["env"]:
            if "value" in item:
                env[item["name"]] = str(item["value"])
            else:
                ref = item["valueFrom"]["secretKeyRef"]
                env[item["name"]] = secrets[ref["name"]][ref["key"]]
        volumes = {v["name"]: v for v in spec["volumes"]}
        secret_files: dict[str, dict[str, str]] = {}
        empty_dirs: dict[str, int] = {}
        for mount in cont["volumeMounts"]:
            volume = volumes[mount["name"]]
            if "secret" in volume:
                values = secrets[volume["secret"]["secretName"]]
                items = volume["secret"].get("items") or [{"key": k, "path": k} for k in values]
                secret_files[mount["mountPath"]] = {i["path"]: values[i["key"]] for i in items}
            elif "emptyDir" in volume:
                empty_dirs[mount["mountPath"]] = quantity_bytes(volume["emptyDir"]["sizeLimit"])
            else:
                raise AssertionError(f"volume {mount['name']}: only Secret and emptyDir volumes are run here")
        context = spec["securityContext"]
        return cls(env=env, secret_files=secret_files, empty_dirs=empty_dirs,
                   memory_limit=quantity_bytes(cont["resources"]["limits"]["memory"]),
                   user=f"{context['runAsUser']}:{context['runAsGroup']}")

    def file(self, path: str) -> str:
        """The content of a file the pod mounts from a Secret, by its path in the container."""
        folder, name = path.rsplit("/", 1)
        return self.secret_files[folder][name]

    def docker_args(self, tmp: Path, overrides: dict[str, str], dropped: set[str]) -> list[str]:
        """``docker run`` options: the pod's restrictions, its memory limit (no swap), its Secret
        files mounted read-only where the pod mounts them, its emptyDirs as tmpfs of their size,
        and its environment with ``overrides`` in place of the cluster's wiring (``dropped`` left out)."""
        args = ["--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                "--user", self.user, "--memory", str(self.memory_limit), "--memory-swap", str(self.memory_limit)]
        for path, files in self.secret_files.items():
            folder = tmp / ("secret" + path.replace("/", "_"))
            folder.mkdir()
            for name, content in files.items():
                (folder / name).write_text(content)
                (folder / name).chmod(0o644)
            args += ["--volume", f"{folder}:{path}:ro"]
        for path, size in self.empty_dirs.items():
            args += ["--tmpfs", f"{path}:size={size},uid={self.user.split(':')[0]}"]
        env = {k: v for k, v in self.env.items() if k not in dropped} | overrides
        for name, value in env.items():
            args += ["--env", f"{name}={value}"]
        return args


def noise_png(seed: int, width: int, height: int) -> bytes:
    """A PNG of random RGB pixels (incompressible: its size is its pixels' ~3 bytes each), written
    directly (stored deflate blocks) because Pillow's PNG filters cost ~0.2 s a megapixel."""
    rows = np.frombuffer(np.random.default_rng(seed).bytes(height * width * 3), np.uint8).reshape(height, width * 3)
    raw = np.hstack([np.zeros((height, 1), np.uint8), rows]).tobytes()  # filter byte 0 on each row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 0))
            + chunk(b"IEND", b""))


def large_jpeg(width: int, height: int) -> bytes:
    """A JPEG of ``width``x``height`` (noise over a gradient: about 0.4 bytes a pixel)."""
    noise = Image.effect_noise((width, height), 40)
    gradient = Image.linear_gradient("L").resize((width, height))
    out = io.BytesIO()
    Image.merge("RGB", (noise, gradient, noise.transpose(Image.Transpose.FLIP_LEFT_RIGHT))).save(
        out, "JPEG", quality=85)
    return out.getvalue()


class ImageOrigin:
    """An image origin on 127.0.0.1 (a thread): ``/png/<seed>/<w>x<h>`` a noise PNG made on each
    request, ``/jpeg/<n>/<anything>`` one of a few large JPEGs made at start. Counts what it served."""

    def __init__(self, jpeg_size: tuple[int, int], jpeg_variants: int = 2) -> None:
        self.jpegs = [large_jpeg(*jpeg_size) for _ in range(jpeg_variants)]
        self.bytes_served = 0
        self._lock = threading.Lock()
        origin = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                kind, first, second = self.path.strip("/").split("/")
                if kind == "png":
                    width, height = (int(v) for v in second.split("x"))
                    body, mime = noise_png(int(first), width, height), "image/png"
                else:
                    body, mime = origin.jpegs[int(first) % len(origin.jpegs)], "image/jpeg"
                self.send_response(200)
                self.send_header("Content-Type", mime)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                with origin._lock:
                    origin.bytes_served += len(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> ImageOrigin:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def png(self, seed: int, width: int, height: int) -> str:
        return f"http://127.0.0.1:{self.port}/png/{seed}/{width}x{height}"

    def jpeg(self, variant: int, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/jpeg/{variant}/{name}"


def image_part(url: str | None, uuid: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "image_url", "image_url": None if url is None else {"url": url}}
    if uuid is not None:
        part["uuid"] = uuid
    return part


def chat_body(model: str, parts: list[dict[str, Any]]) -> bytes:
    return json.dumps({"model": model, "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is in these images?"}, *parts]}]}).encode()


def data_url_png(seed: int, width: int, height: int) -> str:
    return "data:image/png;base64," + base64.b64encode(noise_png(seed, width, height)).decode()


@dataclass
class Outcomes:
    """HTTP statuses by kind of request (thread-safe), and the first few error bodies."""

    counts: dict[str, dict[int, int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, status: int, detail: str = "") -> None:
        with self._lock:
            by_status = self.counts.setdefault(kind, {})
            by_status[status] = by_status.get(status, 0) + 1
            if status not in (200, 429) and len(self.errors) < 10:
                self.errors.append(f"{kind} {status} {detail[:300]}")


def post_chat(url: str, body: bytes, key: str, session: str, outcomes: Outcomes, kind: str) -> None:
    """POST one chat completion; its status (0: no answer) counted under ``kind``."""
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {key}", "x-session-id": session})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            response.read()
            outcomes.add(kind, response.status)
    except urllib.error.HTTPError as exc:
        outcomes.add(kind, exc.code, exc.read().decode(errors="replace"))
    except OSError as exc:  # refused or reset: the gateway died or cut the connection
        outcomes.add(kind, 0, repr(exc))
        time.sleep(0.5)


class CgroupMemory:
    """The container's memory as its cgroup counts it (what the limit and the OOM killer act on):
    now, the peak, and how many processes the OOM killer took. cgroup v1 (docker's cgroupfs
    driver) or v2."""

    def __init__(self, container_id: str) -> None:
        candidates = [Path("/sys/fs/cgroup/memory/docker") / container_id,
                      Path("/sys/fs/cgroup/system.slice") / f"docker-{container_id}.scope",
                      Path("/sys/fs/cgroup/docker") / container_id]
        found = [p for p in candidates if p.is_dir()]
        assert found, f"no cgroup directory of the container among {candidates}"
        self.path = found[0]
        self.v1 = (self.path / "memory.usage_in_bytes").exists()
        self.peak_sampled = 0
        self.at_peak: list[tuple[int, str]] = []  # the processes (MiB, command) at the sampled peak
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _read(self, name: str) -> str:
        return (self.path / name).read_text()

    def usage(self) -> int:
        return int(self._read("memory.usage_in_bytes" if self.v1 else "memory.current"))

    def peak(self) -> int:
        """The kernel's own high-water mark where it keeps one, else the sampled one."""
        name = "memory.max_usage_in_bytes" if self.v1 else "memory.peak"
        return int(self._read(name)) if (self.path / name).exists() else self.peak_sampled

    def stat(self) -> dict[str, int]:
        return {k: int(v) for k, v in (line.split() for line in self._read("memory.stat").splitlines())}

    def oom_kills(self) -> int:
        text = self._read("memory.oom_control" if self.v1 else "memory.events")
        counts = dict(line.split() for line in text.splitlines())
        return int(counts.get("oom_kill", 0))

    def processes(self) -> list[tuple[int, str]]:
        """The container's processes now: resident MiB and command line, largest first."""
        found = []
        for pid in self._read("cgroup.procs").split():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:80]
            except OSError:  # it ended meanwhile
                continue
            rss_kb = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
            found.append((rss_kb // 1024, cmdline.strip()))
        return sorted(found, reverse=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            try:
                usage = self.usage()
                if usage > self.peak_sampled:
                    self.peak_sampled = usage
                    self.at_peak = self.processes()
            except OSError:  # the container is gone
                return

    def __enter__(self) -> CgroupMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
