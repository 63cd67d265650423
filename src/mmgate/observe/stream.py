"""A relayed event stream, watched for the ``usage`` its last events carry (token counts for the
access log and the tenant metrics); chunks pass through unchanged."""

from __future__ import annotations

from collections.abc import AsyncIterator

from mmgate.observe.record import RequestRecord, current
from mmgate.observe.usage import has_usage


def observed_stream(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``chunks`` as they are, noting usage into the current request's record (``chunks`` itself
    outside a request)."""
    record = current()
    return chunks if record is None or not record.stream_usage else _watched(chunks, record)


async def _watched(chunks: AsyncIterator[bytes], record: RequestRecord) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        if has_usage(chunk):
            record.note_usage(chunk)
        yield chunk
