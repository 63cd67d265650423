"""API keys → tenants, from the ``--api-keys-file`` in both its formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmgate.errors import AuthenticationError, ConfigError
from mmgate.reuse import TenantKeys


def test_tenant_keys_from_lines(tmp_path: Path) -> None:
    path = tmp_path / "keys.txt"
    path.write_text("# comment\nk1 alpha\n\nk2 beta\n")
    keys = TenantKeys.from_file(str(path))
    assert len(keys) == 2
    assert keys.tenant_for("Bearer k1") == "alpha" and keys.tenant_for("bearer  k2 ") == "beta"
    for header in (None, "", "Bearer", "Basic k1", "Bearer nope"):
        with pytest.raises(AuthenticationError):
            keys.tenant_for(header)


def test_an_anthropic_clients_x_api_key_names_the_tenant_unless_authorization_does(tmp_path: Path) -> None:
    path = tmp_path / "keys.txt"
    path.write_text("k1 alpha\nk2 beta\n")
    keys = TenantKeys.from_file(str(path))
    assert keys.tenant_for(None, "k1") == "alpha" and keys.tenant_for("", " k2 ") == "beta"
    assert keys.tenant_for("Bearer k2", "k1") == "beta"  # Authorization decides
    for authorization, api_key in ((None, "nope"), (None, " "), (None, "k1\x00"), (None, "ké"), ("Bearer nope", "k1"),
                                   ("Basic k1", "k1"), (None, None)):
        with pytest.raises(AuthenticationError):
            keys.tenant_for(authorization, api_key)


def test_tenant_keys_from_json(tmp_path: Path) -> None:
    good = tmp_path / "keys.json"
    good.write_text('{"k9": "gamma"}')
    assert TenantKeys.from_file(str(good)).tenant_for("Bearer k9") == "gamma"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("only-one-field\n", "bad.txt:1"),
        ('{"k": 3}', "must map each key"),
        ("{not json", "not valid JSON"),
        ('{"": "t"}', "non-empty key and tenant"),
    ],
)
def test_bad_key_files_name_the_setting(tmp_path: Path, text: str, message: str) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text(text)
    with pytest.raises(ConfigError) as info:
        TenantKeys.from_file(str(bad))
    assert info.value.setting == "--api-keys-file"
    assert message in info.value.message


def test_missing_file_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        TenantKeys.from_file(str(tmp_path / "absent"))
    assert info.value.setting == "--api-keys-file"
