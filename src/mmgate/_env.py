"""``MMGATE_*`` environment variables: the one place the three programs read them.

A flag ``--some-flag`` reads its default from ``MMGATE_SOME_FLAG``. Only the CLI edge calls these
(``mmgate._settings`` when it builds a program's settings); nothing deeper reads the environment.
"""

from __future__ import annotations

import os

PREFIX = "MMGATE_"
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("", "0", "false", "no", "off")


def env_name(flag: str) -> str:
    """``--some-flag`` → ``MMGATE_SOME_FLAG``."""
    return PREFIX + flag.lstrip("-").replace("-", "_").upper()


def env_value(flag: str) -> str | None:
    """The flag's environment value, or None when the variable is unset."""
    return os.environ.get(env_name(flag))


def env_list(flag: str) -> list[str]:
    """A repeatable flag's values from the environment (comma-separated; empty when unset)."""
    value = env_value(flag) or ""
    return [v.strip() for v in value.split(",") if v.strip()]


def env_bool(flag: str) -> bool | None:
    """A switch from the environment: True for 1/true/yes/on, False for 0/false/no/off or empty,
    None when unset. Any other word raises ValueError (``MMGATE_REDIS_CLUSTER=ture`` is a typo, not
    a quiet False)."""
    value = env_value(flag)
    if value is None:
        return None
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"{env_name(flag)}={value!r} is not a switch value (1/true/yes/on or 0/false/no/off)")
