"""``mmgate serve --config FILE``: a TOML file below flags and ``MMGATE_*`` variables. Flagged
settings by their flag's name, any setting by its field in its table; unknown keys and bad TOML
refused at start-up naming ``--config``; a real process serves with the file's settings."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from mmgate._settings import ConfigError
from mmgate.config import GatewaySettings
from mmgate.serve.cli import add_arguments, settings_from_args
from tests.support.ports import free_port


def settings(argv: list[str]) -> GatewaySettings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return settings_from_args(parser.parse_args(argv))


def test_layers_flag_over_env_over_file_over_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "mmgate.toml"
    config.write_text(
        'port = 9100\nmax-images-per-request = 7\nallowed-private = ["127.0.0.1"]\nsession-scoping = true\n'
        'max-image-bytes = 1000\n\n[media]\ndecode_workers = 3\n\n[cache]\nfill_wait_s = 0.25\n')
    s = settings(["--config", str(config)])
    assert (s.port, s.max_images_per_request, s.cache.session_scoping) == (9100, 7, True)
    assert s.media.allowed_private == ("127.0.0.1",) and s.media.max_image_bytes == 1000
    assert (s.media.decode_workers, s.cache.fill_wait_s) == (3, 0.25)  # fields without a flag
    assert s.max_body_bytes == GatewaySettings().max_body_bytes  # untouched: the default
    monkeypatch.setenv("MMGATE_PORT", "9200")
    assert settings(["--config", str(config)]).port == 9200  # the variable wins over the file
    assert settings(["--config", str(config), "--port", "9300"]).port == 9300  # the flag over both
    monkeypatch.setenv("MMGATE_CONFIG", str(config))
    assert settings([]).max_images_per_request == 7  # the file named by MMGATE_CONFIG


@pytest.mark.parametrize(("text", "message"), [
    ("nonsense-key = 1\n", "'nonsense-key' is not a setting"),
    ("port = \n", "is not valid TOML"),
    ("port = 'eighty'\n", "--port"),
    ("[media]\nno_such_field = 1\n", "media"),
])
def test_bad_files_fail_start_up_naming_the_setting(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=message):
        settings(["--config", str(config)])
    with pytest.raises(ConfigError, match="--config: cannot read"):
        settings(["--config", str(tmp_path / "missing.toml")])


def test_a_real_gateway_serves_with_the_files_settings(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "mmgate.toml"
    config.write_text(f"port = {port}\nembedded-engines = 1\nsim-speedup = 1000\n")
    proc = subprocess.Popen([sys.executable, "-m", "mmgate", "serve", "--config", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(30)


def test_embedded_runs_get_laptop_sized_caches_unless_set() -> None:
    from mmgate.serve.engines import EMBEDDED_LOCAL_CACHE_BYTES, EMBEDDED_UUID_STORE_BYTES, embedded_defaults

    small = embedded_defaults(settings([]))
    assert (small.cache.local_cache_bytes, small.uuid_store_bytes) == (EMBEDDED_LOCAL_CACHE_BYTES,
                                                                       EMBEDDED_UUID_STORE_BYTES)
    chosen = embedded_defaults(settings(["--local-cache-bytes", "1000", "--uuid-store-bytes", "2000"]))
    assert (chosen.cache.local_cache_bytes, chosen.uuid_store_bytes) == (1000, 2000)
    assert settings([]).cache.local_cache_bytes == 512 * 1024 * 1024  # with backends: the default
