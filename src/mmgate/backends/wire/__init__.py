"""A lean HTTP/1.1 client for the request path to ``http://`` backends: asyncio protocols, httptools'
parser (llhttp, in C) and a bounded keep-alive pool per backend.

Why not aiohttp's client here: a streamed text request through aiohttp's client costs ~0.1 ms of
CPU in Python steps (a ``ClientRequest``/``ClientResponse`` pair, a writer task, a payload
object, per-chunk timer rescheduling), about a quarter of the gateway's whole CPU per text
request. This client does what the request path needs and nothing else: one request a
connection at a time, its head built as one string, the reply parsed in C and handed over as
the bytes arrived (an event stream is relayed as it came, never re-framed). aiohttp stays where it
is not the cost (probes, model listing, ``https://`` backends).

What it keeps of aiohttp's client:

* the pool bound (``limit`` connections in use); a request that finds none free waits for one
  at most ``connect_timeout_s`` and then fails with ``PoolFull`` (the backend is busy, not
  failing);
* ``connect_timeout_s`` for a new connection, ``read_timeout_s`` for each silence of the backend
  while a reply is awaited (not while the caller is busy elsewhere, e.g. writing to a slow
  client: the stream's own stall timeout covers that);
* an idle connection lives ``keepalive_s`` (closed by a sweep, never reused past it), so a request
  is not written on a connection the backend is about to close;
* back-pressure: a streamed reply nobody takes stops reading the socket past 64 KiB.

One thing it adds: ``on_reply``, called with the exchange the moment a 200 reply is parsed whole
(or its head, ``at_head``: an event stream), in the connection's own callback (the chat lane
writes it to its client there, before the request's task wakes; the task still gets the reply).

A connection goes back to the pool only when its reply was read whole, the request was written
whole and the backend did not ask to close; anything else (an error, a cancelled caller, a reply
left unread) closes it. Errors are this module's own (``WireError``); ``HTTPBackend`` maps them
to mmgate's.
"""

from mmgate.backends.wire.errors import BadReply, BrokenOff, ConnectFailed, PoolFull, ReadTimeout, WireError
from mmgate.backends.wire.exchange import Exchange, OnReply
from mmgate.backends.wire.pool import WirePool

__all__ = ["BadReply", "BrokenOff", "ConnectFailed", "Exchange", "OnReply", "PoolFull", "ReadTimeout", "WireError", "WirePool"]
