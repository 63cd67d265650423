"""What the gateway learns about one request while it runs, for its access-log line, its trace
and the per-tenant metrics: one ``RequestRecord``, reachable from anywhere in the request's task
through a context variable (the way OpenTelemetry carries its span), so the pipeline notes what
it decided (model, reuse counts) without every signature carrying the record.

Nothing here does I/O. Outside a request (start-up, probes, tests calling the pipeline directly)
``current()`` is None and every ``note_*`` does nothing.
"""

from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass
from typing import Any, Protocol

from mmgate.observe.ids import REQUEST_ID_HEADER, TRACEPARENT_HEADER
from mmgate.observe.usage import token_usage


class _Counts(Protocol):
    sent: int
    stripped: int
    references: int
    healed: int


class Tracer(Protocol):
    """A request's tracing (``mmgate.observe.tracing``): child spans and the headers that carry
    its context to a backend."""

    def span(self, name: str, attributes: dict[str, Any] | None = None) -> Any: ...

    def inject(self, headers: dict[str, str]) -> None: ...


@dataclass(slots=True)
class RequestRecord:
    """One request as the access log, the trace and the tenant metrics see it."""

    request_id: str
    method: str
    path: str
    started: float
    tracer: Tracer | None = None
    tenant: str | None = None
    model: str | None = None
    status: int | None = None
    sent: int = 0
    stripped: int = 0
    referenced: int = 0
    healed: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    first_byte: float | None = None
    # The client's trace context, passed on as it came when the gateway does not trace.
    traceparent: str | None = None
    # Whether a streamed answer may carry usage (False: a chat stream that did not ask for it,
    # so its chunks need no watching).
    stream_usage: bool = True

    @property
    def images(self) -> int:
        """Images the request carried to its backend: with data, or as references."""
        return self.sent + self.stripped + self.referenced

    def backend_headers(self) -> dict[str, str]:
        """Headers every backend request of this request carries: its id (vLLM's request id is
        built from it) and the W3C ``traceparent``: with tracing, the current span's; without, the
        client's as it came (the gateway takes no part in the trace, as W3C asks of an
        intermediary that does not trace)."""
        headers = {REQUEST_ID_HEADER: self.request_id}
        if self.tracer is not None:
            self.tracer.inject(headers)
        elif self.traceparent is not None:
            headers[TRACEPARENT_HEADER] = self.traceparent
        return headers

    def mark_first_byte(self) -> None:
        if self.first_byte is None:
            self.first_byte = time.perf_counter()

    def note_usage(self, data: bytes | bytearray | memoryview | None) -> None:
        """Take the token counts of the last ``usage`` object in ``data`` (a whole answer, or a
        stream chunk that carries one)."""
        usage = token_usage(data)
        if usage is not None:
            self.prompt_tokens, self.completion_tokens = usage


_current: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar("mmgate_request", default=None)


def current() -> RequestRecord | None:
    """The record of the request this task serves, or None outside one."""
    return _current.get()


def bind(record: RequestRecord | None) -> contextvars.Token[RequestRecord | None]:
    """Make ``record`` the current one (``unbind`` with the token when the request ends)."""
    return _current.set(record)


def unbind(token: contextvars.Token[RequestRecord | None]) -> None:
    _current.reset(token)


def backend_headers() -> dict[str, str] | None:
    """The current request's headers for a backend (``RequestRecord.backend_headers``), or None
    outside a request."""
    record = _current.get()
    return record.backend_headers() if record is not None else None


def request_tenant() -> str | None:
    """The current request's tenant once it authenticated (None: no API keys, or outside a
    request): what a backend's connections are shared by."""
    record = _current.get()
    return record.tenant if record is not None else None


def note_model(model: str | None) -> None:
    """The model the current request was routed by."""
    record = _current.get()
    if record is not None and model is not None:
        record.model = model


def note_chat(model: str, stream_options: object) -> bool:
    """The model a chat request is routed by, and its ``stream_options`` (its stream carries usage
    only when it asks for it); True when the request is traced (its spans are worth making)."""
    record = _current.get()
    if record is None:
        return False
    record.model = model
    record.stream_usage = isinstance(stream_options, dict) and bool(
        stream_options.get("include_usage") or stream_options.get("continuous_usage_stats"))
    return record.tracer is not None


def note_reuse(counts: _Counts) -> None:
    """What the reuse pipeline did with the current request's images."""
    record = _current.get()
    if record is not None:
        record.sent, record.stripped = counts.sent, counts.stripped
        record.referenced, record.healed = counts.references, counts.healed


class _NoSpan:
    """The span of a request that is not traced: does nothing, costs one attribute lookup."""

    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set_attribute(self, key: str, value: object) -> None:
        return None


NO_SPAN = _NoSpan()


def traced() -> bool:
    """Whether the current request is traced (its spans are worth making)."""
    record = _current.get()
    return record is not None and record.tracer is not None


def span(name: str, attributes: dict[str, Any] | None = None) -> Any:
    """A child span of the current request's trace (a context manager whose value has
    ``set_attribute``); a shared no-op when the request is not traced."""
    record = _current.get()
    if record is None or record.tracer is None:
        return NO_SPAN
    return record.tracer.span(name, attributes)
