"""Access-log capture: the lines the gateway writes on the ``mmgate.access`` logger."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from mmgate.observe.access import ACCESS_LOGGER


class Lines(logging.Handler):
    """Every access-log line, formatted as the gateway wrote it."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def access_lines() -> Iterator[list[str]]:
    logger = logging.getLogger(ACCESS_LOGGER)
    handler = Lines()
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)  # as ``mmgate serve``'s default --log-level info sets it
    try:
        yield handler.lines
    finally:
        logger.setLevel(level)
        logger.removeHandler(handler)
