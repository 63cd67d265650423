"""Settings of one ``mmgate bench run``: frozen, validated once, passed down explicitly.

Each setting is defined once, here: its flag, its ``MMGATE_*`` variable and its ``--help`` text are
generated from the field (``mmgate._settings``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator, model_validator

from mmgate._settings import ConfigError, Frozen, MiB, setting
from mmgate.bench.apis import Api
from mmgate.bench.dataset import DatasetType
from mmgate.bench.images import ImageMode

Arrival = Literal["poisson", "constant"]
ENDPOINT, DATASET, LOAD = "endpoint", "dataset", "load"


def parse_header(item: str) -> tuple[str, str]:
    """``NAME:VALUE`` → (name, value); ConfigError naming ``--header`` otherwise."""
    name, sep, value = item.partition(":")
    if not sep or not name.strip():
        raise ConfigError("--header", f"expected NAME:VALUE, got {item!r}")
    return name.strip(), value.strip()


class BenchSettings(Frozen):
    """Everything a benchmark run needs. Load: ``concurrency`` and/or ``request_rate``."""

    url: str = setting("http://127.0.0.1:8000", flag="--url", group=ENDPOINT, min_length=1,
                       help="base URL of the OpenAI-compatible server, with or without /v1")
    api: Api = setting("chat", flag="--api", group=ENDPOINT,
                       help="the client API each session speaks: OpenAI chat completions, OpenAI Responses "
                            "or Anthropic Messages")
    chat_path: str | None = setting(None, flag="--endpoint", group=ENDPOINT,
                                    help="request path (default: the --api's own: /v1/chat/completions, "
                                         "/v1/responses, /v1/messages)")
    model: str | None = setting(None, flag="--model", group=ENDPOINT,
                                help="model name (default: first of /v1/models)")
    api_key: str | None = setting(None, flag="--api-key", group=ENDPOINT, help="sent as Authorization: Bearer KEY")
    headers: tuple[tuple[str, str], ...] = setting((), flag="--header", group=ENDPOINT, metavar="NAME:VALUE",
                                                   help="extra request header (repeatable)")
    engine_metrics: tuple[str, ...] = setting(
        (), flag="--engine-metrics", group=ENDPOINT, metavar="URL",
        help="an engine's base URL (repeatable): its Prometheus /metrics is read before and after the run "
             "(and around each request at --concurrency 1) for processor-cache hits and bytes received")
    session_header: str | None = setting("x-session-id", flag="--session-header", group=ENDPOINT, metavar="NAME",
                                         help="header carrying each session's id ('' to send none)")

    dataset: str = setting(flag="--dataset", group=DATASET, min_length=1,
                           help="JSONL file (AIPerf custom dataset format)")
    dataset_type: DatasetType = setting("single_turn", flag="--dataset-type", group=DATASET,
                                        help="dataset format")
    image_mode: ImageMode = setting("data", flag="--image-mode", group=DATASET,
                                    help="local image files as data: URLs, or served by a loopback image origin")
    origin_host: str = setting("127.0.0.1", flag="--origin-host", group=DATASET,
                               help="address of the loopback image origin")
    origin_port: int = setting(0, flag="--origin-port", group=DATASET, ge=0, le=65535,
                               help="port of the loopback image origin (0: any free port)")
    image_cache_bytes: int = setting(512 * MiB, flag="--image-cache-mb", group=DATASET, scale=MiB, ge=0,
                                     help="memory for prepared images (data: URLs), MiB")

    concurrency: int | None = setting(None, flag="--concurrency", group=LOAD, ge=1, le=100_000,
                                      help="sessions in flight at once (default 1 unless --request-rate)")
    request_rate: float | None = setting(None, flag="--request-rate", group=LOAD, gt=0,
                                         help="requests per second (open-loop arrival schedule)")
    arrival: Arrival = setting("poisson", flag="--arrival", group=LOAD, help="arrival schedule in rate mode")
    max_active_sessions: int = setting(1024, flag="--max-active-sessions", group=LOAD, ge=1, le=100_000,
                                       help="sessions kept in flight in rate mode when no --concurrency caps them")
    request_count: int | None = setting(None, flag="--request-count", group=LOAD, ge=1,
                                        help="requests to send (the dataset is replayed as needed)")
    duration_s: float | None = setting(None, flag="--duration", group=LOAD, gt=0, help="seconds to run")
    warmup_requests: int = setting(0, flag="--warmup-requests", group=LOAD, ge=0,
                                   help="requests sent first and left out of the results")
    grace_period_s: float = setting(30.0, flag="--grace-period", group=LOAD, ge=0,
                                    help="seconds requests in flight may finish after --duration")
    stream: bool = setting(True, flag="--no-streaming", group=LOAD, help="ask for whole (non-streamed) answers")

    uuid_and_strip: bool = setting(
        False, flag="--uuid-and-strip", group=LOAD,
        help="give every image a uuid and send repeats within a session as cache-only references")
    output_length: int | None = setting(None, flag="--output-length", group=LOAD, ge=1,
                                        help="max_tokens of every request (a line's output_length wins)")
    # From --extra-body and --extra-inputs (mmgate.bench.cli.parse_extra): two flags, one field.
    extra_body: dict[str, Any] = setting(default_factory=dict)
    session_prefix: str = setting("", flag="--session-prefix", group=LOAD, help="prefix of every session id")

    request_timeout_s: float = setting(600.0, flag="--request-timeout", group=LOAD, gt=0,
                                       help="seconds one request may take")
    connect_timeout_s: float = setting(10.0, flag="--connect-timeout", group=LOAD, gt=0,
                                       help="seconds to connect to the endpoint")
    max_connections: int = setting(4096, ge=1)
    max_records: int = setting(5_000_000, flag="--max-records", group=LOAD, ge=1,
                               help="per-request rows kept in memory (beyond: a uniform sample)")
    seed: int = setting(0, flag="--seed", group=LOAD, help="seed of every random choice")

    @field_validator("model", "api_key", "session_header", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("headers", mode="before")
    @classmethod
    def _parse_headers(cls, value: Any) -> Any:
        if isinstance(value, tuple | list):
            return tuple(parse_header(v) if isinstance(v, str) else v for v in value)
        return value

    @model_validator(mode="after")
    def _strip_needs_chat(self) -> BenchSettings:
        if self.uuid_and_strip and self.api == "messages":
            raise ConfigError(
                "--uuid-and-strip", "needs --api chat or responses: Anthropic Messages carries no image uuids "
                "(through mmgate, --reuse auto strips the repeats on the engine side)")
        return self

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
