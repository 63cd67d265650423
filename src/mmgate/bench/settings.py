"""Settings of one ``mmgate bench run``: frozen, validated once, passed down explicitly."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from pydantic import Field, model_validator

from mmgate.bench.dataset import DatasetType
from mmgate.bench.images import ImageMode
from mmgate.config import MiB, _Frozen

Arrival = Literal["poisson", "constant"]

# Field → the flag the user typed, for error messages (read-only).
FLAG_NAMES: Mapping[str, str] = MappingProxyType({
    "duration_s": "--duration",
    "request_timeout_s": "--request-timeout",
    "connect_timeout_s": "--connect-timeout",
    "grace_period_s": "--grace-period",
    "image_cache_bytes": "--image-cache-mb",
    "extra_body": "--extra-inputs",
    "stream": "--no-streaming",
})


class BenchSettings(_Frozen):
    """Everything a benchmark run needs. Load: ``concurrency`` and/or ``request_rate``."""

    url: str = Field(min_length=1)
    dataset: str = Field(min_length=1)
    dataset_type: DatasetType = "single_turn"
    model: str | None = None
    api_key: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    session_header: str | None = "x-session-id"
    chat_path: str = "/v1/chat/completions"
    stream: bool = True

    concurrency: int | None = Field(None, ge=1, le=100_000)
    request_rate: float | None = Field(None, gt=0)
    arrival: Arrival = "poisson"
    # Sessions kept in flight in rate mode when no --concurrency caps them.
    max_active_sessions: int = Field(1024, ge=1, le=100_000)
    request_count: int | None = Field(None, ge=1)
    duration_s: float | None = Field(None, gt=0)
    warmup_requests: int = Field(0, ge=0)
    grace_period_s: float = Field(30.0, ge=0)

    uuid_and_strip: bool = False
    output_length: int | None = Field(None, ge=1)
    extra_body: dict[str, Any] = Field(default_factory=dict)
    session_prefix: str = ""

    image_mode: ImageMode = "data"
    image_cache_bytes: int = Field(512 * MiB, ge=0)
    origin_host: str = "127.0.0.1"
    origin_port: int = Field(0, ge=0, le=65535)

    request_timeout_s: float = Field(600.0, gt=0)
    connect_timeout_s: float = Field(10.0, gt=0)
    max_connections: int = Field(4096, ge=1)
    max_records: int = Field(5_000_000, ge=1)
    seed: int = 0

    @model_validator(mode="after")
    def _default_load(self) -> BenchSettings:
        if self.concurrency is None and self.request_rate is None:
            object.__setattr__(self, "concurrency", 1)
        return self

    @property
    def cycles_dataset(self) -> bool:
        """With a count or a duration the dataset is replayed as often as needed."""
        return self.request_count is not None or self.duration_s is not None

    def public_config(self) -> dict[str, Any]:
        """The settings recorded in ``summary.json`` (the API key left out)."""
        data = self.model_dump(mode="json", exclude={"api_key"})
        data["headers"] = [k for k, _ in self.headers]
        return data
