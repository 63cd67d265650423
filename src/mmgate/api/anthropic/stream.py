"""A backend's chat-completions SSE stream relayed as Anthropic's stream events, mapped by
``mmgate.anthropic_chat.stream.StreamMapper`` (vLLM 0.32's ``message_stream_converter``):
``events(stream)`` frames a backend's raw bytes into payloads and maps them, and raises
``BackendProtocolError`` for a stream that ends before its ``[DONE]`` (cut mid-event, or just
closed): the relay ends the client's stream with an Anthropic ``error`` event, not a stream that
simply stops with no ``message_stop``. ``whole_events`` relays a forwarded request's own events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from mmgate.anthropic_chat.stream import StreamMapper
from mmgate.backends.base import drain
from mmgate.errors import BackendProtocolError

# A backend frame longer than this is not a chat chunk: the stream is broken off with an error.
MAX_FRAME_BYTES = 16 * 1024 * 1024


async def events(stream: AsyncIterator[bytes], mapper: StreamMapper | None = None) -> AsyncIterator[bytes]:
    """The Anthropic events for a backend's chat SSE bytes (frames split on blank lines), mapped
    by ``mapper`` (a new one by default): once it is ``done``, what was just yielded is the last
    event. After it the backend's reply is read to its end (``drain``), so that its connection
    goes back to the pool rather than being closed."""
    mapper = StreamMapper() if mapper is None else mapper
    buffer = b""
    async for chunk in stream:
        buffer += chunk
        while not mapper.done:
            end = buffer.find(b"\n\n")
            if end < 0:
                break
            frame, buffer = buffer[:end], buffer[end + 2:]
            for line in frame.split(b"\n"):
                if line.startswith(b"data:"):
                    out = mapper.feed(line[5:].strip().decode("utf-8", "replace"))
                    if out:
                        yield out
        if mapper.done:
            await drain(stream, len(buffer))
            return
        if len(buffer) > MAX_FRAME_BYTES:
            yield mapper.feed("{broken")
            return
    if not mapper.done:
        where = "mid-event" if buffer.strip() else "without its [DONE]"
        raise BackendProtocolError(f"the backend's stream was cut short: it ended {where}")


_ENDS = (b"\nevent: message_stop\n", b"\nevent: error\n")


async def whole_events(stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A backend's own Anthropic event stream (a forwarded request), relayed in whole events, and
    ``BackendProtocolError`` when it ends before its ``message_stop`` (or an ``error``): the relay
    then ends it with an Anthropic ``error`` event, after the last whole event, not after half of
    one (which would break the client's parsing of the error too)."""
    carry = b""
    ended = False
    async for chunk in stream:
        data = carry + chunk if carry else chunk
        cut = data.rfind(b"\n\n") + 2
        if cut < 2:
            carry = data
            if len(carry) > MAX_FRAME_BYTES:
                raise BackendProtocolError(f"the backend sent an event longer than {MAX_FRAME_BYTES} bytes")
            continue
        whole, carry = data[:cut], data[cut:]
        # A line that starts with "event:" is an event's name: a data line holds JSON, no raw newline.
        ended = ended or any(end in b"\n" + whole for end in _ENDS)
        yield whole
    if not ended:
        where = "mid-event" if carry.strip() else "without its message_stop"
        raise BackendProtocolError(f"the backend's stream was cut short: it ended {where}")
