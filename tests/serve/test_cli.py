"""``mmgate serve`` as a user runs it: a real process on loopback, stopped by SIGTERM; bad settings
refused at start-up with the flag named and exit status 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import orjson
import pytest

from tests.support.ports import free_port

MMGATE = [sys.executable, "-m", "mmgate"]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MMGATE, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("command", ["serve", "sim", "bench"])
def test_help(command: str) -> None:
    result = run(command, "--help")
    assert result.returncode == 0
    assert "--help" in result.stdout


def help_sections(text: str) -> dict[str, set[str]]:
    """``--help`` output as section title -> the flags listed under it."""
    sections: dict[str, set[str]] = {}
    current = ""
    for line in text.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            current = line[:-1]
        elif line.startswith("  --") and current:
            sections.setdefault(current, set()).add(line.split()[0].rstrip(","))
    return sections


def test_serve_help_groups_the_health_flags_apart_from_reuse_and_tenants() -> None:
    sections = help_sections(run("serve", "--help-all").stdout)
    health = {"--health-interval", "--health-timeout", "--eject-after-failures", "--readmit-after"}
    assert sections["backend health"] == health
    assert not health & sections["reuse and tenants"]
    assert {"--reuse", "--api-keys-file", "--tenant-secret"} <= sections["reuse and tenants"]
    assert {"--routing"} <= sections["routing"]


def test_serve_help_lists_what_an_operator_decides_and_help_all_the_rest() -> None:
    short, everything = run("serve", "--help").stdout, run("serve", "--help-all").stdout
    listed = {line.split()[0].rstrip(",") for line in short.splitlines() if line.startswith("  --")}
    every = {line.split()[0].rstrip(",") for line in everything.splitlines() if line.startswith("  --")}
    assert {"--backend", "--port", "--api-keys-file", "--redis-url", "--config", "--help-all"} <= listed
    assert {"--decode-workers", "--health-timeout", "--stream-stall-timeout", "--max-inflation-ratio"} <= every - listed
    assert "--help-all lists them" in short
    assert len(listed - {"--help-all"}) <= 45, sorted(listed)  # what an operator decides stays short
    # A flag left out of --help still works, with its variable.
    result = run("serve", "--decode-workers", "0")
    assert result.returncode == 2 and "--decode-workers" in result.stderr


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--backend", "foo"], "--backend"),
        (["--backend", "grpc=http://x:1"], "--backend"),
        (["--max-image-bytes", "0"], "--max-image-bytes"),
        (["--redis-url", "http://user:secret@cache:6379"], "--redis-url"),
        (["--redis-url", "redis://:secret@127.0.0.1:1/?socket_timeout=2"], "--redis-url"),
        (["--api-keys-file", "/nonexistent/keys.txt"], "--api-keys-file"),
        (["--allowed-private", "10.0.0.0/40"], "--allowed-private"),
        (["--allowed-private", "999.1.1.1"], "'999.1.1.1' is not a valid IP address"),
        (["--fetch-timeout", "-1"], "--fetch-timeout"),
    ],
)
def test_bad_settings_fail_start_up_naming_the_flag(args: list[str], flag: str) -> None:
    result = run("serve", "--port", str(free_port()), *args)
    assert result.returncode == 2, result.stderr
    assert flag in result.stderr
    assert "Traceback" not in result.stderr
    assert "secret" not in result.stderr  # a Redis URL's password is never echoed


def test_serve_answers_and_stops_on_sigterm() -> None:
    port = free_port()
    proc = subprocess.Popen([*MMGATE, "serve", "--port", str(port), "--embedded-engines", "1",
                             "--sim-speedup", "1000"], stderr=subprocess.PIPE, text=True)
    try:
        health = None
        for _ in range(200):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    health = orjson.loads(r.read())
                    break
            except OSError:
                time.sleep(0.1)
        assert health is not None and health["status"] == "ok"
        assert [b["healthy"] for b in health["backends"]] == [True]
        body = orjson.dumps({"model": "mmgate-sim-vl", "messages": [{"role": "user", "content": "hi"}]})
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert orjson.loads(r.read())["choices"][0]["message"]["content"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert "Traceback" not in (proc.stderr.read() if proc.stderr else "")
    finally:
        if proc.poll() is None:
            proc.kill()



@pytest.mark.parametrize(
    ("command", "env", "flag"),
    [
        (["serve"], {"MMGATE_LOG_LEVEL": "loud"}, "--log-level"),
        (["serve"], {"MMGATE_REDIS_CLUSTER": "maybe"}, "--redis-cluster"),
        (["serve"], {"MMGATE_SESSION_SCOPING": "ture"}, "--session-scoping"),
        (["serve", "--redis-cluster"], {}, "--redis-cluster"),  # a cluster and no node to ask
        (["serve", "--allowed-format", "jpg"], {}, "--allowed-format"),  # would refuse every image
        (["bench", "run", "--url", "http://127.0.0.1:9", "--dataset", "x.jsonl"], {"MMGATE_QUIET": "often"},
         "--quiet"),
    ],
)
def test_bad_variables_and_unusable_values_fail_start_up(command: list[str], env: dict[str, str], flag: str) -> None:
    if command[0] == "serve":
        command = [*command, "--port", str(free_port())]
    result = subprocess.run([*MMGATE, *command], capture_output=True, text=True, timeout=60,
                            env={**os.environ, **env})
    assert result.returncode == 2, result.stderr
    assert flag in result.stderr
    assert "Traceback" not in result.stderr
