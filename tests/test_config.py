"""The gateway's settings models (``mmgate.config``): their own validators, whatever the CLI."""

from __future__ import annotations

import pytest

from mmgate._settings import ConfigError, build
from mmgate.config import DEFAULT_SESSION_HEADERS, BackendSpec, CacheSettings, GatewaySettings, MediaSettings


def test_backend_spec_parses_kind_and_url() -> None:
    spec = BackendSpec.parse(" VLLM = http://10.0.0.5:8000/ ")
    assert (spec.kind, spec.url) == ("vllm", "http://10.0.0.5:8000")


@pytest.mark.parametrize("text", ["nokind", "grpc=http://x:1", "vllm=ftp://x", "openai=http://"])
def test_bad_backend_spec_names_the_flag(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        BackendSpec.parse(text)
    assert info.value.setting == "--backend"


def test_gateway_settings_take_backend_strings_and_tidy_headers() -> None:
    settings = GatewaySettings(backends=("openai=https://api.example",),  # type: ignore[arg-type]
                               session_headers=(" X-Session-ID ", "", "X-Other"))
    assert settings.backends[0].kind == "openai"
    assert settings.session_headers == ("x-session-id", "x-other")
    assert GatewaySettings().session_headers == DEFAULT_SESSION_HEADERS


def test_media_settings_validators() -> None:
    assert MediaSettings(allowed_formats=("png", "Jpeg")).allowed_formats == ("PNG", "JPEG")
    assert MediaSettings(allowed_private=("10.0.0.0/8", "db.internal")).allowed_private[1] == "db.internal"
    assert MediaSettings(allowed_private=("127.0.0.1", "::1", "fd00::/8", "db-1.internal.", "0xcafe.com")).allowed_private
    for bad in ("10.0.0.0/40", "", "has space", "999.1.1.1", "256.0.0.0/8", "10.0.0.1.", "127.1", "0x7f000001",
                "1.2.3.4.5", "::g", "db.internal:8080", "bad_host!", "-db.internal", "a..b"):
        with pytest.raises(ConfigError) as info:
            build(MediaSettings, allowed_private=(bad,))
        assert info.value.setting == "--allowed-private"


def test_redis_url_scheme_is_checked_without_echoing_it() -> None:
    assert CacheSettings(redis_url="").redis_url is None
    assert CacheSettings(redis_url="rediss://h:6380").redis_url == "rediss://h:6380"
    with pytest.raises(ConfigError) as info:
        build(CacheSettings, redis_url="http://user:pw-123@cache:6379")
    assert info.value.setting == "--redis-url" and "pw-123" not in info.value.message


@pytest.mark.parametrize(
    ("model", "values", "flag"),
    [
        (GatewaySettings, {"port": 70000}, "--port"),
        (GatewaySettings, {"reuse": "sometimes"}, "--reuse"),
        (GatewaySettings, {"media": {"total_timeout_s": 0}}, "--fetch-timeout"),
        (GatewaySettings, {"cache": {"redis_io_timeout_s": -1}}, "--redis-io-timeout"),
        (CacheSettings, {"local_max_entry_fraction": 0}, "--local-max-entry-fraction"),
        (GatewaySettings, {"media": {"allowed_formats": ("JPEG", "jpg")}}, "--allowed-format"),
        (GatewaySettings, {"cache": {"redis_cluster": True}}, "--redis-cluster"),
    ],
)
def test_errors_name_the_flag_even_when_nested(model: type, values: dict[str, object], flag: str) -> None:
    with pytest.raises(ConfigError) as info:
        build(model, **values)
    assert info.value.setting == flag


def test_settings_are_frozen_and_closed() -> None:
    settings = GatewaySettings()
    with pytest.raises(ValueError):
        settings.port = 1  # type: ignore[misc]
    with pytest.raises(ConfigError):
        build(GatewaySettings, no_such_setting=1)
