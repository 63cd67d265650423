"""Real vLLM (its CPU build, a tiny Qwen2-VL with dummy weights) and real ``mmgate serve``
processes on loopback, for tests and benchmarks.

``make vllm`` builds the pinned vLLM venv (``.venv-vllm``); the model directory is written here by
``tools/tiny_qwen2vl.py`` when missing. Environment:

* ``MMGATE_VLLM_VENV``  — the venv holding vLLM (default ``<repo>/.venv-vllm``); point it at an
  existing one for quick loops: ``MMGATE_VLLM_VENV=/path/to/vllm-venv``.
* ``MMGATE_VLLM_MODEL`` — the model directory (default ``<repo>/build/tiny-qwen2vl``).
* ``MMGATE_VLLM_START_TIMEOUT`` — seconds one start may take (default 300).

Start-up is bounded: a replica that exits or does not answer ``/health`` in time raises
``VllmStartError`` with the tail of its log. Each replica runs in its own process group and is
killed as a group (vLLM forks an engine-core process) on every exit path. Use it from a fixture::

    @pytest.fixture(scope="session")
    def vllm_replicas(tmp_path_factory):
        with running_replicas(2, tmp_path_factory.mktemp("vllm")) as replicas:
            yield replicas

``tests/conftest.py`` has that fixture (two replicas, started once per session, in parallel);
``replica.url`` is its base URL, ``replica.model`` the served model name, ``replica.cache_counters()``
its ``vllm:mm_cache_queries_total`` / ``vllm:mm_cache_hits_total``, ``replica.restart()`` a real
process restart on the same port (empty caches). ``running_gateway_process`` starts ``mmgate serve``
in front of any backends.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
SERVED_MODEL = "tiny-qwen2vl"
# Flags that start vLLM's CPU build on 2 shared cores. float32, not bfloat16: this machine's CPU
# (AVX2, no AVX512-BF16 or AMX) emulates bfloat16, and the tiny model's TTFT on the sliding-window
# workload halves in float32 (docs/PERFORMANCE.md, "Sim fidelity").
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            # Stored responses (GET/cancel /v1/responses/{id}, previous_response_id, background).
            "VLLM_ENABLE_RESPONSES_API_STORE": "1"}
VLLM_ARGS = ("--load-format", "dummy", "--enforce-eager", "--dtype", "float32", "--max-model-len", "4096",
             "--limit-mm-per-prompt", '{"image": 8}', "--disable-uvicorn-access-log")
_COUNTER = re.compile(r'^(vllm:mm_cache_(?:queries|hits)_total)\{[^}]*\} ([0-9.e+]+)$', re.M)


class VllmUnavailable(RuntimeError):
    """The vLLM venv is not there (run ``make vllm``)."""


class VllmStartError(RuntimeError):
    """A replica exited or did not become healthy in time; the message ends with its log tail."""


@dataclass(frozen=True)
class VllmSetup:
    """Where vLLM and the model are."""

    python: Path
    model_dir: Path
    start_timeout_s: float
    maker: str = "tiny_qwen2vl.py"  # the tools/ script that writes the model directory

    @classmethod
    def locate(cls) -> VllmSetup:
        venv = Path(os.environ.get("MMGATE_VLLM_VENV") or ROOT / ".venv-vllm")
        python = venv / "bin" / "python"
        if not python.exists():
            raise VllmUnavailable(f"no vLLM venv at {venv}: run `make vllm` (or set MMGATE_VLLM_VENV)")
        model = Path(os.environ.get("MMGATE_VLLM_MODEL") or ROOT / "build" / "tiny-qwen2vl")
        timeout = float(os.environ.get("MMGATE_VLLM_START_TIMEOUT") or 300)
        return cls(python=python, model_dir=model, start_timeout_s=timeout)

    def ensure_model(self, *flags: str) -> Path:
        """Write the tiny model directory (a no-op when its stamp matches)."""
        subprocess.run([str(self.python), str(ROOT / "tools" / self.maker), "--out", str(self.model_dir),
                        *flags], check=True, timeout=120, capture_output=True)
        return self.model_dir


def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


class _Process:
    """A child in its own process group, logging to a file, killed as a group."""

    name = "process"

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _spawn(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env={**os.environ, **(env or {})}, cwd=ROOT,
            )

    def wait_ready(self, deadline: float, health: str = "/health") -> None:
        """Until ``health`` answers 200; raises ``VllmStartError`` (with the log tail) on exit or time-out."""
        while True:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise VllmStartError(f"{self.name} on port {self.port} exited ({code}):\n{tail(self.log_path)}")
            with contextlib.suppress(OSError):
                if _get(self.url + health, timeout=1.0)[0] == 200:
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise VllmStartError(f"{self.name} on port {self.port} not healthy in time:\n{tail(self.log_path)}")
            time.sleep(0.25)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM to the whole process group, SIGKILL after ``timeout_s``; always reaps."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # The group may outlive its leader (vLLM's engine core): make sure it is gone.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


class VllmReplica(_Process):
    """One real ``vllm`` OpenAI server on 127.0.0.1 (``python -m vllm.entrypoints.openai.api_server``)."""

    def __init__(self, setup: VllmSetup, log_path: Path, *, extra_args: Sequence[str] = ()) -> None:
        super().__init__(log_path)
        self.setup = setup
        self.extra_args = tuple(extra_args)
        self.model = SERVED_MODEL
        self.name = f"vllm replica :{self.port}"

    def spawn(self) -> None:
        self._spawn([
            str(self.setup.python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.setup.model_dir), "--served-model-name", self.model,
            "--host", "127.0.0.1", "--port", str(self.port), *VLLM_ARGS, *self.extra_args,
        ], VLLM_ENV)

    def start(self) -> None:
        self.spawn()
        self.wait_ready(time.monotonic() + self.setup.start_timeout_s)

    def restart(self) -> None:
        """A real process restart on the same port: vLLM comes back with empty caches."""
        self.stop()
        self.start()

    def cache_counters(self) -> tuple[float, float]:
        """(``vllm:mm_cache_queries_total``, ``vllm:mm_cache_hits_total``) of this replica."""
        return cache_counters(self.url)


def cache_counters(url: str) -> tuple[float, float]:
    """An engine's (``vllm:mm_cache_queries_total``, ``vllm:mm_cache_hits_total``) from its /metrics."""
    text = _get(url + "/metrics", timeout=10.0)[1].decode()
    values = {name: float(v) for name, v in _COUNTER.findall(text)}
    return values.get("vllm:mm_cache_queries_total", 0.0), values.get("vllm:mm_cache_hits_total", 0.0)


def start_replicas(setup: VllmSetup, count: int, log_dir: Path, *,
                   extra_args: Sequence[str] = ()) -> list[VllmReplica]:
    """Start ``count`` replicas in parallel and wait for all (bounded); on failure none is left."""
    setup.ensure_model()
    replicas = [VllmReplica(setup, log_dir / f"vllm-{i}.log", extra_args=extra_args) for i in range(count)]
    try:
        for r in replicas:
            r.spawn()
        deadline = time.monotonic() + setup.start_timeout_s
        for r in replicas:
            r.wait_ready(deadline)
    except BaseException:
        for r in replicas:
            r.stop()
        raise
    return replicas


@contextlib.contextmanager
def running_replicas(count: int, log_dir: Path, *, extra_args: Sequence[str] = (),
                     setup: VllmSetup | None = None) -> Iterator[list[VllmReplica]]:
    """``count`` real vLLM replicas for the duration of the block; every one stopped at the end."""
    replicas = start_replicas(setup or VllmSetup.locate(), count, log_dir, extra_args=extra_args)
    try:
        yield replicas
    finally:
        for r in replicas:
            r.stop()


class SimProcess(_Process):
    """``mmgate sim`` as its own process, serving the same model name as the replicas."""

    name = "mmgate sim"
    model = SERVED_MODEL

    def start(self, args: Sequence[str] = (), timeout_s: float = 30.0) -> None:
        self._spawn([sys.executable, "-m", "mmgate", "sim", "--host", "127.0.0.1", "--port", str(self.port),
                     "--model", self.model, *args])
        self.wait_ready(time.monotonic() + timeout_s)

    def cache_counters(self) -> tuple[float, float]:
        return cache_counters(self.url)


class GatewayProcess(_Process):
    """``mmgate serve`` as its own process (the installed CLI, exactly as a user runs it); ``src``:
    another tree's ``src/`` to run it from instead (a worktree of an earlier commit)."""

    name = "mmgate serve"

    def __init__(self, log_path: Path, src: Path | None = None) -> None:
        super().__init__(log_path)
        self.src = src
        if src is not None:
            self.name = f"mmgate serve ({src})"

    def start(self, args: Sequence[str], timeout_s: float = 30.0) -> None:
        self._spawn([sys.executable, "-m", "mmgate", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                     *args], None if self.src is None else {"PYTHONPATH": str(self.src)})
        self.wait_ready(time.monotonic() + timeout_s)

    def health(self) -> dict[str, object]:
        parsed: dict[str, object] = json.loads(_get(self.url + "/health")[1] or b"{}")
        return parsed


@contextlib.contextmanager
def running_gateway_process(backends: Sequence[str], log_path: Path, *args: str) -> Iterator[GatewayProcess]:
    """``mmgate serve --backend vllm=URL ... ARGS`` on a free loopback port for the block."""
    gateway = GatewayProcess(log_path)
    flags = [f for url in backends for f in ("--backend", f"vllm={url}")]
    try:
        gateway.start([*flags, *args])
        yield gateway
    finally:
        gateway.stop()
