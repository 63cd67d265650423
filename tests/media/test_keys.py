"""Cache keys: URL normalisation, content keys, session scoping (pure)."""

from __future__ import annotations

import pytest

from mmgate.media.keys import data_url_key, normalize_url, scope_key, session_scope_key, url_key


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("HTTP://Example.COM/a.png", "http://example.com/a.png"),
        ("http://example.com:80/a.png", "http://example.com/a.png"),
        ("https://example.com:443/a.png", "https://example.com/a.png"),
        ("https://example.com:80/a.png", "https://example.com:80/a.png"),
        ("http://example.com:8080/a.png", "http://example.com:8080/a.png"),
        ("http://example.com/a.png#frag", "http://example.com/a.png"),
        ("http://example.com", "http://example.com/"),
        ("http://example.com/A.PNG?Sig=AbC", "http://example.com/A.PNG?Sig=AbC"),
        ("http://User:PW@Example.com/a", "http://User:PW@example.com/a"),
        ("http://[2001:DB8::1]:80/a", "http://[2001:db8::1]/a"),
        ("  http://example.com/a  ", "http://example.com/a"),
    ],
)
def test_normalize_url(url: str, expected: str) -> None:
    assert normalize_url(url) == expected


def test_equivalent_urls_share_a_key_and_different_ones_do_not() -> None:
    assert url_key("HTTP://Example.com:80/a.png#x") == url_key("http://example.com/a.png")
    assert url_key("http://example.com/a.png") != url_key("http://example.com/A.png")
    assert url_key("http://example.com/a.png?v=1") != url_key("http://example.com/a.png?v=2")
    assert url_key("http://example.com/a.png") != url_key("https://example.com/a.png")
    key = url_key("http://example.com/a.png?token=secret")
    assert key.startswith("url:") and "secret" not in key and len(key) == 4 + 64


def test_data_url_key() -> None:
    assert data_url_key("ab" * 32) == "img:" + "ab" * 32


def test_scoping_partitions_sessions_and_bypasses_without_one() -> None:
    key = url_key("http://example.com/a.png")
    assert scope_key(key, session_scoping=False, session_id="s1") == key
    assert scope_key(key, session_scoping=False, session_id=None) == key
    a = scope_key(key, session_scoping=True, session_id="s1")
    b = scope_key(key, session_scoping=True, session_id="s2")
    assert a is not None and b is not None and a != b
    assert a == scope_key(key, session_scoping=True, session_id="s1")
    assert a.startswith(session_scope_key("s1"))
    assert "session-secret" not in (scope_key(key, session_scoping=True, session_id="session-secret") or "")
    assert scope_key(key, session_scoping=True, session_id=None) is None
    assert scope_key(key, session_scoping=True, session_id="") is None


def test_malformed_port_raises_value_error() -> None:
    with pytest.raises(ValueError):
        normalize_url("http://example.com:99999/a")
