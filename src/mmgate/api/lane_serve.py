"""One chat request served by the lane (``mmgate.api.lane``), with the duties of the aiohttp route
and its middlewares, in their order: the observer (record, request id, access log and tenant
metrics), the tenant limit (``admitted``), the route's tracking (``tracked``: metrics, in-flight
set, 499), then the body (408 past ``--body-timeout``), the pipeline (``Gateway.chat``) and the
answer: whole, or an event stream relayed chunk by chunk (HTTP chunked framing around the
backend's bytes, never re-framed), with the stall cut, the error frame of a backend failing
mid-stream, and the shutdown's cut. A 200's whole reply, or a stream's head with what arrived of
it, is written by the backend connection's callback the moment it is parsed (the request's
``EarlyReply``), before the pipeline unwinds; the task relays the rest. Errors get the same
OpenAI-shaped bodies as everywhere (``error_parts``).
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import time
from collections.abc import Mapping
from email.utils import formatdate
from typing import TYPE_CHECKING

import orjson

from mmgate.api.admin import carries_admin_key
from mmgate.api.forward import STREAM_HEADERS, bind_stream_buffer, stream_cut
from mmgate.api.gateway import ChatOutcome, Gateway
from mmgate.api.relay import admitted, tenant_of, tracked
from mmgate.api.responses import error_frame, error_parts
from mmgate.backends.base import set_early_reply
from mmgate.errors import BodyTimeoutError, MmgateError
from mmgate.metrics import CHAT_ROUTE
from mmgate.observe.ids import REQUEST_ID_HEADER, TRACEPARENT_HEADER, request_id, valid_traceparent
from mmgate.observe.middleware import CLIENT_CLOSED
from mmgate.observe.record import RequestRecord, bind
from mmgate.observe.stream import observed_stream
from mmgate.observe.usage import has_usage

if TYPE_CHECKING:
    from mmgate.api.lane import LaneConnection
    from mmgate.api.lane_head import Head

log = logging.getLogger(__name__)
_REASONS = {s.value: s.phrase for s in http.HTTPStatus}
# Bodies at least this large are joined in a thread (bytes.join drops the GIL), as ``read_body`` does.
_JOIN_IN_THREAD_BYTES = 1 << 20
_END = b"0\r\n\r\n"
_CLOSE = "Connection: close\r\n"
_INTERNAL = orjson.dumps({"error": {"message": "the gateway failed to answer this request (its log says why)",
                                    "type": "internal_error", "param": None, "code": 500}})
_STREAM_LINES = "".join(f"{name}: {value}\r\n" for name, value in STREAM_HEADERS.items())
_date = [0, ""]
Body = bytes | asyncio.Future[list[bytes]]


def _now_date() -> str:
    """The Date header's value, made once a second."""
    now = int(time.time())
    if now != _date[0]:
        _date[0], _date[1] = now, formatdate(now, usegmt=True)
    return str(_date[1])


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


class _Answer:
    """What went out for one request, for its tracking and its access-log line."""

    __slots__ = ("backend", "bytes_in", "conn", "delivered", "ended", "first_at", "head_sent", "headers", "keep_alive",
                 "record", "status", "whole")

    def __init__(self, conn: LaneConnection, record: RequestRecord, keep_alive: bool) -> None:
        self.conn = conn
        self.record = record
        self.keep_alive = keep_alive
        self.status = 500
        self.backend: str | None = None
        self.whole: bytes | None = None
        self.bytes_in = 0
        self.head_sent = False
        # Written from the backend connection's callback (``EarlyReply``), before the pipeline unwinds:
        self.headers: dict[str, str] | None = None  # the gateway's headers for the reply (None: nothing early)
        self.delivered = False  # the whole reply, or a stream's head, went out early
        self.first_at = 0.0  # when a stream's first chunk did (0.0: none yet)
        self.ended = False  # and its end

    def write_whole(self, content_type: str | None, body: bytes) -> None:
        """The backend's whole 200 reply (``EarlyReply``): what ``_deliver`` would write."""
        headers = self.headers
        if headers is None or self.head_sent:
            return
        try:
            self.whole_body(200, content_type or "application/json", headers, body)
        except ConnectionError:
            return  # ``_deliver`` tries again and finds the client gone
        self.delivered = True

    def write_stream(self, content_type: str | None, chunk: bytes | None, ended: bool) -> None:
        """An event stream's head with what arrived of it, its end when it did (``EarlyReply``):
        what ``_deliver`` would write first; it relays the rest."""
        headers = self.headers
        if headers is None or self.head_sent:
            return
        out = self.stream_head(200, content_type or "text/event-stream", headers)
        if chunk is not None:
            if self.record.stream_usage and has_usage(chunk):  # as ``observed_stream`` would
                self.record.note_usage(chunk)
            out += _chunk(chunk)
        if ended:
            out += _END
        try:
            self.conn.send(out)
        except ConnectionError:
            return  # ``_deliver`` tries again and finds the client gone
        self.delivered = True
        self.first_at = time.perf_counter() if chunk is not None else 0.0
        self.ended = ended

    def stream_head(self, status: int, content_type: str, extra: Mapping[str, str]) -> bytes:
        """An event stream's response head; the connection's send buffer set for streams first."""
        conn = self.conn
        if not conn.buffer_bound and conn.transport is not None:
            bind_stream_buffer(conn.transport)
            conn.buffer_bound = True
        return self.head(status, content_type, extra, None, _STREAM_LINES)

    def head(self, status: int, content_type: str, extra: Mapping[str, str], length: int | None,
             lines: str = "") -> bytes:
        """The response head (the connection closes after it when it must); ``lines``: header
        lines made already."""
        conn = self.conn
        if not self.keep_alive or conn.closing or conn.lane.stopping or conn.body_pending:
            conn.closing = True
        self.status = status
        self.head_sent = True
        self.record.mark_first_byte()
        fields = lines + "".join([f"{name}: {value}\r\n" for name, value in extra.items()])
        framing = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
        return (f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\nContent-Type: {content_type}\r\n{fields}"
                f"{REQUEST_ID_HEADER}: {self.record.request_id}\r\nDate: {_now_date()}\r\n{framing}\r\n"
                f"{_CLOSE if conn.closing else ''}\r\n").encode()

    def whole_body(self, status: int, content_type: str, extra: Mapping[str, str], body: bytes) -> None:
        head = self.head(status, content_type, extra, len(body))
        if len(body) <= 65536:
            self.conn.send(head + body)
        else:
            self.conn.send(head)
            self.conn.send(body)

    def error(self, exc: MmgateError) -> None:
        if self.head_sent:  # the reply, or a stream's head, went out early (``EarlyReply``): it stands
            log.warning("the chat lane answered before the pipeline failed: %s", exc.message)
            self.conn.closing = True  # a stream left unended must not stay open for the next request
            return
        body, headers = error_parts(exc)
        with contextlib.suppress(ConnectionError):
            self.whole_body(exc.status, "application/json", headers or {}, orjson.dumps(body))

    def internal(self) -> None:
        self.conn.closing = True
        if not self.head_sent:
            with contextlib.suppress(ConnectionError):
                self.whole_body(500, "application/json", {}, _INTERNAL)
        else:
            self.conn.abort()


async def serve(conn: LaneConnection, head: Head, body: Body) -> None:
    """Serve one chat request on ``conn`` (its body: here, or to arrive in a future)."""
    lane = conn.lane
    gateway = lane.gateway
    headers = head.headers
    record = RequestRecord(request_id(headers.get(REQUEST_ID_HEADER)), "POST", CHAT_ROUTE, time.perf_counter())
    record.traceparent = valid_traceparent(headers.get(TRACEPARENT_HEADER))
    bind(record)  # in this request's own task (and context)
    answer = _Answer(conn, record, head.keep_alive)
    set_early_reply(answer)
    status = 500
    try:
        try:
            if lane.slots is None:
                await tracked(gateway, CHAT_ROUTE, lambda: _chat(answer, head, body, gateway), task=conn.task)
            else:
                with admitted(gateway, lane.slots, headers, exempt=carries_admin_key(lane.admin_key, headers)):
                    await tracked(gateway, CHAT_ROUTE, lambda: _chat(answer, head, body, gateway), task=conn.task)
        except MmgateError as exc:
            answer.error(exc)
        status = answer.status
    except asyncio.CancelledError:
        status = CLIENT_CLOSED
        raise
    except ConnectionError:
        status = CLIENT_CLOSED
    except Exception:  # a bug of ours, as aiohttp treats one: logged, a 500 if nothing went out yet
        log.exception("the chat lane failed to serve a request")
        answer.internal()
    finally:
        try:
            lane.observer.finish(record, status, headers, bytes_in=answer.bytes_in, bytes_out=conn.bytes_out,
                                 backend=answer.backend, body=answer.whole)
        finally:
            conn.request_done()


async def _chat(answer: _Answer, head: Head, body: Body, gateway: Gateway) -> tuple[_Answer, bool]:
    started = time.perf_counter()
    tenant = tenant_of(gateway, head.headers) if gateway.tenants is not None else None  # 401 before the body
    if isinstance(body, bytes):
        raw = body
        answer.bytes_in = len(body)
    else:
        raw = await _read(answer, body, gateway.settings.body_timeout_s)
    outcome = await gateway.chat(raw, head.headers, tenant=tenant)
    try:
        return answer, await _deliver(answer, outcome, gateway, started)
    finally:
        outcome.close()  # however it ended: the backend's connection and its outstanding count


async def _read(answer: _Answer, body: asyncio.Future[list[bytes]], timeout_s: float) -> bytes:
    if not body.done():
        try:
            async with asyncio.timeout(timeout_s):
                await body
        except TimeoutError as exc:
            raise BodyTimeoutError(f"request body not received within {timeout_s:g}s "
                                   f"({answer.conn.body_received} bytes arrived)") from exc
    chunks = body.result()
    size = answer.bytes_in = sum(len(c) for c in chunks)
    if len(chunks) == 1:
        return chunks[0]
    if size >= _JOIN_IN_THREAD_BYTES:
        return await asyncio.to_thread(b"".join, chunks)
    return b"".join(chunks)


async def _deliver(answer: _Answer, outcome: ChatOutcome, gateway: Gateway, started: float) -> bool:
    """The reply to the client; whether it went out complete (False: the client went away, or read
    nothing for ``--stream-stall-timeout`` and was cut)."""
    reply = outcome.reply
    conn = answer.conn
    answer.backend = outcome.headers.get("x-mmgate-backend")
    stall_s = gateway.settings.stream_stall_timeout_s
    if reply.stream is None:
        body = reply.body or b""
        if reply.status == 200:
            answer.whole = body
        if not answer.delivered:
            answer.whole_body(reply.status, reply.content_type, outcome.headers, body)
        return await _drained(conn, stall_s, stream=False)
    if answer.delivered:  # the head, and what had arrived, went out from the backend's callback
        pending = b""
        first = not answer.first_at
        if answer.first_at:
            gateway.metrics.first_chunk(answer.first_at - started)
        if answer.ended:
            return await _drained(conn, stall_s)
    else:
        pending = answer.stream_head(reply.status, reply.content_type, outcome.headers)
        if not reply.stream_arrived():
            conn.send(pending)  # nothing to send with the head: the client gets it now
            pending = b""
        first = True
    try:
        async for chunk in observed_stream(reply.stream):
            if first:
                gateway.metrics.first_chunk(time.perf_counter() - started)
                first = False
            if reply.stream_ended():  # the last chunk and the stream's end in one write
                conn.send(pending + _chunk(chunk) + _END)
                return await _drained(conn, stall_s)
            conn.send(pending + _chunk(chunk))
            pending = b""
            if conn.writing_paused and not await _drained(conn, stall_s):  # no coroutine per chunk
                return False
    except MmgateError as exc:
        # The stream has started: the status is sent, so the error travels as an SSE frame.
        log.warning("backend stream failed: %s", exc.message)
        with contextlib.suppress(ConnectionError):
            conn.send(pending + _chunk(error_frame(exc)) + _END)
        return True
    except ConnectionError:
        return False  # the client went away; the caller closes the backend stream
    except asyncio.CancelledError:
        if gateway.stopping:  # cut at shutdown after the drain time: say so in the stream, end it
            with contextlib.suppress(ConnectionError):
                conn.send(pending + _chunk(error_frame(stream_cut())) + _END)
        raise
    try:
        conn.send(pending + _END)
    except ConnectionError:
        return False
    return await _drained(conn, stall_s)


async def _drained(conn: LaneConnection, stall_s: float, *, stream: bool = True) -> bool:
    """Wait while the client's socket is full; past ``stall_s`` the connection is cut (False)."""
    if not conn.writing_paused:
        return True  # far below the high-water mark: no timer to arm
    try:
        async with asyncio.timeout(stall_s):
            await conn.drained()
    except TimeoutError:
        if stream:
            conn.lane.gateway.metrics.streams_stalled.inc()
        log.info("cut a connection whose client read nothing for %gs (--stream-stall-timeout)", stall_s)
        conn.abort()
        return False
    except ConnectionError:
        return False
    return True
