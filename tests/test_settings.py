"""Settings spelled once (``mmgate._settings``, ``mmgate.config``): every field with a flag gets
its flag, its MMGATE_ variable and its --help line from that one definition; bad values name the flag."""

from __future__ import annotations

import argparse

import pytest

from mmgate._settings import ConfigError, MiB, add_flags, flags_of, from_args, help_text
from mmgate.bench import BenchSettings
from mmgate.cli import build_parser
from mmgate.config import CacheSettings, GatewaySettings, MediaSettings, RoutingSettings
from mmgate.serve.cli import settings_from_args, sim_settings_from_args
from mmgate.sim import SimSettings

# The flags `mmgate serve` had before settings were generated, plus the eight it lacked.
SERVE_FLAGS = {
    "--host", "--port", "--backend", "--embedded-engines", "--session-header", "--max-images-per-request",
    "--backend-connect-timeout", "--backend-read-timeout", "--log-level", "--max-image-bytes",
    "--max-image-pixels", "--allowed-private", "--allowed-local-media-path", "--fetch-connect-timeout",
    "--fetch-read-timeout", "--fetch-timeout", "--max-redirects", "--local-cache-bytes", "--redis-url",
    "--redis-cluster", "--redis-connect-timeout", "--redis-io-timeout", "--cache-ttl", "--session-scoping",
    "--reuse", "--reuse-backend-cache-gb", "--uuid-store-bytes", "--uuid-ttl", "--api-keys-file",
    "--health-interval", "--eject-after-failures", "--readmit-after", "--sim-speedup",
    "--sim-mm-processor-cache-gb",
    "--health-timeout", "--max-body-bytes", "--max-uuid-length", "--backend-max-connections",
    "--decode-workers", "--key-prefix", "--local-max-entry-fraction", "--allowed-format",
}


def serve(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_every_gateway_setting_has_a_flag() -> None:
    flagged = {f.path for f in flags_of(GatewaySettings)}
    nested = {"media": MediaSettings, "cache": CacheSettings, "routing": RoutingSettings}
    fields = {(name,) for name in GatewaySettings.model_fields if name not in nested}
    fields |= {(group, n) for group, model in nested.items() for n in model.model_fields}
    assert fields - flagged == set()


def test_serve_keeps_every_flag_name() -> None:
    parser = build_parser()
    serve_parser = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    flags = {opt for action in serve_parser._actions for opt in action.option_strings}
    assert SERVE_FLAGS - flags == set()


def test_defaults_come_from_the_model() -> None:
    assert settings_from_args(serve()) == GatewaySettings()
    assert sim_settings_from_args(serve()) == SimSettings()


def test_flag_then_environment_then_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MMGATE_MAX_IMAGE_BYTES", "1234")
    monkeypatch.setenv("MMGATE_REDIS_CLUSTER", "yes")
    monkeypatch.setenv("MMGATE_REDIS_URL", "redis://127.0.0.1:7000")  # a cluster needs a node
    monkeypatch.setenv("MMGATE_ALLOWED_PRIVATE", "10.0.0.0/8, 127.0.0.1")
    monkeypatch.setenv("MMGATE_HEALTH_TIMEOUT", "0.25")
    monkeypatch.setenv("MMGATE_SIM_SPEEDUP", "50")
    settings = settings_from_args(serve("--max-image-pixels", "99", "--decode-workers", "3",
                                        "--backend", "vllm=http://127.0.0.1:9"))
    assert settings.media.max_image_bytes == 1234
    assert settings.media.max_image_pixels == 99
    assert settings.media.decode_workers == 3
    assert settings.media.allowed_private == ("10.0.0.0/8", "127.0.0.1")
    assert settings.cache.redis_cluster is True
    assert settings.health_timeout_s == 0.25
    assert [(b.kind, b.url) for b in settings.backends] == [("vllm", "http://127.0.0.1:9")]
    assert sim_settings_from_args(serve()).speedup == 50.0
    # The flag wins over the variable.
    assert settings_from_args(serve("--max-image-bytes", "77")).media.max_image_bytes == 77


@pytest.mark.parametrize(
    ("argv", "env", "flag"),
    [
        (["--max-image-bytes", "0"], {}, "--max-image-bytes"),
        (["--local-max-entry-fraction", "2"], {}, "--local-max-entry-fraction"),
        (["--health-timeout", "0"], {}, "--health-timeout"),
        (["--backend", "grpc=http://x:1"], {}, "--backend"),
        ([], {"MMGATE_PORT": "many"}, "--port"),
        ([], {"MMGATE_CACHE_TTL": "0"}, "--cache-ttl"),
        ([], {"MMGATE_SIM_SPEEDUP": "0"}, "--sim-speedup"),
    ],
)
def test_bad_values_name_the_flag(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], env: dict[str, str], flag: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        args = serve(*argv)
        settings_from_args(args)
        sim_settings_from_args(args)
    assert info.value.setting == flag


def test_help_shows_default_and_variable() -> None:
    flag = next(f for f in flags_of(GatewaySettings) if f.flag == "--max-image-bytes")
    assert help_text(flag) == f"largest encoded image accepted, bytes (default {20 * MiB}; env MMGATE_MAX_IMAGE_BYTES)"
    for command in ("serve", "sim"):  # every generated help line formats (a stray % would raise)
        with pytest.raises(SystemExit) as info:
            build_parser().parse_args([command, "--help"])
        assert info.value.code == 0


def test_switches_and_scaled_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser()
    flags = add_flags(parser, BenchSettings)
    args = parser.parse_args(["--dataset", "d.jsonl", "--no-streaming", "--image-cache-mb", "1.5",
                              "--header", "a: b", "--session-header", ""])
    settings = from_args(args, BenchSettings, flags)
    assert settings.stream is False
    assert settings.image_cache_bytes == int(1.5 * MiB)
    assert settings.headers == (("a", "b"),)
    assert settings.session_header is None
    monkeypatch.setenv("MMGATE_NO_STREAMING", "1")
    assert from_args(parser.parse_args(["--dataset", "d"]), BenchSettings, flags).stream is False
    assert from_args(parser.parse_args(["--dataset", "d", "--streaming"]), BenchSettings, flags).stream is True
    with pytest.raises(ConfigError) as info:
        from_args(parser.parse_args(["--dataset", "d", "--header", "nocolon"]), BenchSettings, flags)
    assert info.value.setting == "--header"


def test_routing_flags_and_variables() -> None:
    settings = settings_from_args(serve("--routing", "image-affinity", "--routing-load-factor", "1.25"))
    assert (settings.routing.mode, settings.routing.load_factor) == ("image-affinity", 1.25)
    assert settings_from_args(serve()).routing.mode == "image-affinity"
    assert settings_from_args(serve()).routing.sync_channel == "mmgate:routing"
    assert settings_from_args(serve("--routing-sync-channel", "fleet-2")).routing.sync_channel == "fleet-2"


def test_routing_from_the_environment_and_a_bad_value_names_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MMGATE_ROUTING", "session")
    assert settings_from_args(serve()).routing.mode == "session"
    with pytest.raises(ConfigError) as err:
        settings_from_args(serve("--routing-load-factor", "0.5"))
    assert "--routing-load-factor" in str(err.value.setting)
    monkeypatch.setenv("MMGATE_ROUTING_SYNC_URL", "http://cache:6379")
    with pytest.raises(ConfigError) as err:
        settings_from_args(serve())
    assert "--routing-sync-url" in str(err.value.setting)
