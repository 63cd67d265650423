"""A real nginx on loopback in front of a gateway, run from the shipped configuration
(``deploy/nginx/nginx.conf`` and ``mmgate.conf``) with only what a throwaway instance needs changed:
the listen port, the gateway's address, and the pid file, logs and temporary files in a directory of
its own (so it runs without root). Used by tests/deploy/test_nginx_front.py and
benchmarks/regression/edge_load.py."""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.ports import free_port

SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "nginx"
TEMP_DIRS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


def nginx_binary() -> str | None:
    """nginx's path (Debian puts it in /usr/sbin, often not on a user's PATH), or None."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


def write_config(directory: Path, listen_port: int, upstream_port: int) -> Path:
    """The shipped files copied into ``directory``, pointed at ``upstream_port`` and listening on
    ``listen_port``; returns the main file's path."""
    site = (SHIPPED / "mmgate.conf").read_text()
    site, listens = re.subn(r"listen \d+", f"listen 127.0.0.1:{listen_port}", site)
    site, servers = re.subn(r"server 127\.0\.0\.1:\d+;", f"server 127.0.0.1:{upstream_port};", site)
    if (listens, servers) != (1, 1):
        raise ValueError("deploy/nginx/mmgate.conf: expected one listen and one upstream server line")
    (directory / "mmgate.conf").write_text(site)
    temp = "".join(f"    {name}_temp_path {directory / name};\n" for name in TEMP_DIRS)
    main = (SHIPPED / "nginx.conf").read_text().replace("    include mmgate.conf;", temp + "    include mmgate.conf;")
    path = directory / "nginx.conf"
    path.write_text(main)
    return path


@contextlib.contextmanager
def nginx_in_front(directory: Path, upstream_port: int, timeout_s: float = 10.0) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """nginx (its master process) and the port it listens on, in front of 127.0.0.1:``upstream_port``;
    stopped on exit (SIGQUIT, then killed if it lingers)."""
    binary = nginx_binary()
    if binary is None:
        raise FileNotFoundError("nginx is not installed (Debian: apt-get install nginx-light)")
    port = free_port()
    config = write_config(directory, port, upstream_port)
    log = directory / "error.log"
    proc = subprocess.Popen(
        [binary, "-p", str(directory), "-c", str(config), "-e", str(log),
         "-g", f"daemon off; pid {directory / 'nginx.pid'};"],
        stdout=subprocess.DEVNULL, stderr=log.open("ab"))
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {log.read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"nginx did not listen on {port}: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)
        yield proc, port
    finally:
        proc.terminate()  # SIGTERM: nginx's fast shutdown
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
