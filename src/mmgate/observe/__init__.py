"""Operability: request ids, the access log, traces and per-tenant counts (docs/OPERATIONS.md).

``middleware.Observer`` wraps every request of the HTTP layer; ``record`` is what the pipeline
notes into while it runs (``note_model``, ``note_reuse``, ``span``), and what a backend client
reads for the headers it sends on (``backend_headers``) and the tenant its connections are
counted for (``request_tenant``).
"""

from mmgate.observe.ids import REQUEST_ID_HEADER, request_id
from mmgate.observe.record import (
    RequestRecord,
    backend_headers,
    current,
    note_chat,
    note_model,
    note_reuse,
    request_tenant,
    span,
    traced,
)

__all__ = ["REQUEST_ID_HEADER", "RequestRecord", "backend_headers", "current", "note_chat", "note_model",
           "note_reuse", "request_id", "request_tenant", "span", "traced"]
