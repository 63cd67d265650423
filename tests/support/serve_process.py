"""``mmgate serve`` as a real child process on loopback (its own event loop, its own fds), for
tests of the HTTP edge: start-up and every wait bounded, stopped by SIGTERM (killed if it hangs)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.ports import free_port

MMGATE = [sys.executable, "-m", "mmgate"]


@dataclass
class GatewayProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self, tail: int | None = 4000) -> str:
        """What the process wrote (its last ``tail`` characters; None: all of it, for a search
        that the access log's lines must not push out of view)."""
        text = self.log_path.read_text(errors="replace")
        return text if tail is None else text[-tail:]

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM, then wait (bounded); returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + ("{" if labels else " ")) and all(
                f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@contextlib.contextmanager
def serve_process(tmp_path: Path, *args: str, start_timeout: float = 60) -> Iterator[GatewayProcess]:
    """``mmgate serve --port P ARGS`` (one embedded fast sim engine unless ARGS say otherwise)."""
    port = free_port()
    log_path = tmp_path / f"gateway-{port}.log"
    argv = [*MMGATE, "serve", "--port", str(port), "--embedded-engines", "1", "--sim-speedup", "1000", *args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    gw = GatewayProcess(proc, port, log_path)
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mmgate serve exited ({proc.returncode}):\n{gw.log()}")
            try:
                with urllib.request.urlopen(gw.url + "/health", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"mmgate serve not healthy in {start_timeout}s:\n{gw.log()}") from None
                time.sleep(0.2)
        yield gw
    finally:
        gw.terminate()
