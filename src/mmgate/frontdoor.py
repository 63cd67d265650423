"""The front door: a process of its own that holds client connections until their request headers
are complete, then hands each one, with the bytes read so far, to the gateway process.

Why a process: a flood of slow clients (slowloris) costs whoever holds them an accept, a close and
a few reads per connection; in the gateway's event loop those batches would sit between every step
of a normal request, whether aiohttp holds them until its header deadline or a cap displaces them
(aiohttp has no way of its own to bound them; docs/benchmarks/http-stacks.md, "The slow-client
flood"). Held here, they cost the gateway nothing: it sees a connection only once the connection
has sent a whole request head. What the front door does:

* accepts on the gateway's listening socket (inherited: ``--listen-fd``), at most ``ACCEPT_BATCH``
  a turn, so reads and hand-overs are never queued behind a burst of accepts;
* holds at most ``--max-connections`` connections; at the cap a new one displaces the oldest held
  (the one nearest its deadline: a slow or silent client — every one held here is before its first
  request; one whose head has arrived but not been read yet is read and handed over instead), so a
  client that sends its request promptly is always let in. One held less than ``DISPLACE_AFTER_S``
  is never displaced: at the cap with the oldest that young (a burst of new clients, not a slow
  flood), accepting pauses until it is not, the new clients waiting in the listen backlog;
* closes a connection whose head is not complete ``--header-timeout`` seconds after it connected;
* hands a connection over, as soon as its head is complete (``\\r\\n\\r\\n``, or ``\\n\\n``) or it has
  sent ``--max-head-bytes``, or its first line is no HTTP request line (the gateway's HTTP parser then
  refuses it with a precise answer), over
  the control socket (``--ctrl-fd``, a SOCK_SEQPACKET pair): one message per connection, its bytes
  so far as the payload and its file descriptor attached (SCM_RIGHTS); when the gateway is not
  taking them (stalled: the control socket is full), a connection whose head is complete waits,
  in order, at most ``HAND_OVER_TIMEOUT_S``, and is then answered ``503`` with ``Retry-After`` —
  never closed without an answer — while the front door goes on with every other connection;
* sends its counts (``STATS`` + JSON, no descriptor) when they change, at most every 0.1 s;
* exits when the gateway closes the control socket or sends ``stop``, or dies.

Standard library only, so it starts fast and stays small beside the gateway; the gateway's side is
``mmgate.api.frontsite``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import resource
import selectors
import socket
import time
from collections import OrderedDict, deque

ACCEPT_BATCH = 64
REQUEST_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+ [^ \r\n]+ HTTP/\d\.\d\r?\n")
READ_BYTES = 65536
STATS = b"\x00stats"
STATS_EVERY_S = 0.1
HAND_OVER_TIMEOUT_S = 2.0
# At the cap, a held connection younger than this is not displaced (accepting waits instead).
DISPLACE_AFTER_S = 0.5
_BUSY_BODY = (b'{"error":{"message":"the gateway is busy: retry shortly","type":"rate_limit_error",'
              b'"param":null,"code":"gateway_busy"}}')
BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
                 b"Connection: close\r\nContent-Length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY)


def lines_valid(head: bytearray, start: int) -> bool:
    """False when a line completed at or after ``start`` is neither a request line (the first) nor a
    ``name: value`` header line."""
    while (end := head.find(b"\n", start)) >= 0:
        line = bytes(head[start:end + 1])
        if not (REQUEST_LINE.match(line) if start == 0 else b":" in line):
            return False
        start = end + 1
    return True


class FrontDoor:
    """The loop; ``run()`` returns when the gateway goes away."""

    def __init__(self, listen: socket.socket, ctrl: socket.socket, *, max_connections: int,
                 header_timeout_s: float, max_head_bytes: int) -> None:
        self.listen = listen
        self.ctrl = ctrl
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.max_head_bytes = max_head_bytes
        self.selector = selectors.DefaultSelector()
        # fd -> (socket, bytes so far, deadline); insertion order = connect order = deadline order.
        self.held: OrderedDict[int, tuple[socket.socket, bytearray, float]] = OrderedDict()
        # Whole heads waiting for the gateway to take them: (socket, bytes, hand-over deadline).
        self.ready: deque[tuple[socket.socket, bytearray, float]] = deque()
        self.counts = {"accepted": 0, "handed_over": 0, "displaced": 0, "timed_out": 0,
                       "closed_by_client": 0, "accept_errors": 0, "hand_over_errors": 0, "busy": 0}
        self._sent_counts: dict[str, int] = {}
        self._stats_at = 0.0
        self._accept_paused_until = 0.0

    def run(self) -> None:
        self.listen.setblocking(False)
        self.ctrl.setblocking(False)
        self.selector.register(self.listen, selectors.EVENT_READ, "listen")
        self.selector.register(self.ctrl, selectors.EVENT_READ, "ctrl")
        while True:
            now = time.monotonic()
            timeout = self._next_deadline(now)
            for key, events in self.selector.select(timeout):
                if key.data == "listen":
                    self._accept(time.monotonic())
                elif key.data == "ctrl":
                    if events & selectors.EVENT_WRITE:
                        self._flush_ready(time.monotonic())
                    if events & selectors.EVENT_READ and not self._control():
                        return
                else:
                    self._read(key.fd)
            now = time.monotonic()
            self._expire(now)
            self._expire_ready(now)
            if self._accept_paused_until and now >= self._accept_paused_until:
                self._accept_paused_until = 0.0
                self.selector.register(self.listen, selectors.EVENT_READ, "listen")
            self._report(now)

    def _next_deadline(self, now: float) -> float:
        wait = STATS_EVERY_S if self.counts != self._sent_counts else 1.0
        if self.held:
            wait = min(wait, next(iter(self.held.values()))[2] - now)
        if self.ready:
            wait = min(wait, self.ready[0][2] - now)
        if self._accept_paused_until:
            wait = min(wait, self._accept_paused_until - now)
        return max(0.0, wait)

    def _accept(self, now: float) -> None:
        for _ in range(ACCEPT_BATCH):
            if len(self.held) + len(self.ready) >= self.max_connections and self.held:
                since = next(iter(self.held.values()))[2] - self.header_timeout_s
                if now - since < DISPLACE_AFTER_S:
                    # A burst, not a slow flood: the connections held are new and may be sending
                    # their heads now. New ones wait in the listen backlog until the oldest held
                    # may be displaced; no prompt client is dropped unread.
                    self.selector.unregister(self.listen)
                    self._accept_paused_until = since + DISPLACE_AFTER_S
                    return
            try:
                conn, _ = self.listen.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of descriptors (EMFILE, ENFILE) or the like: back off
                self.counts["accept_errors"] += 1
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._displace_oldest()
                    self.selector.unregister(self.listen)
                    self._accept_paused_until = now + 0.01
                return
            self.counts["accepted"] += 1
            if len(self.held) + len(self.ready) >= self.max_connections:
                self._displace_oldest()
            conn.setblocking(False)
            self.held[conn.fileno()] = (conn, bytearray(), now + self.header_timeout_s)
            self.selector.register(conn, selectors.EVENT_READ, None)

    def _displace_oldest(self) -> None:
        """Make room for one connection: drop the oldest held, unless what it has sent and not yet
        been read completes its head (a burst of accepts runs before the reads of the same turn):
        then it is handed over, never dropped with its request unanswered."""
        if self.held:
            fd = next(iter(self.held))
            self._read(fd)
            if fd in self.held:
                self._drop(fd)
                self.counts["displaced"] += 1

    def _read(self, fd: int) -> None:
        entry = self.held.get(fd)
        if entry is None:
            return
        conn, head, _ = entry
        try:
            data = conn.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(fd)
            self.counts["closed_by_client"] += 1
            return
        start = max(0, len(head) - 3)
        line_start = head.rfind(b"\n") + 1  # where the first line not yet checked begins
        head += data
        if (head.find(b"\r\n\r\n", start) >= 0 or head.find(b"\n\n", start) >= 0
                or len(head) >= self.max_head_bytes or not lines_valid(head, line_start)):
            # Whole head, too long a head, or a line that is no request or header line: the gateway's
            # parser answers it (a 400 naming the fault, not a silent close at the deadline).
            self._hand_over(fd)

    def _hand_over(self, fd: int) -> None:
        conn, head, _ = self.held.pop(fd)
        self.selector.unregister(conn)
        self.ready.append((conn, head, time.monotonic() + HAND_OVER_TIMEOUT_S))
        self._flush_ready(time.monotonic())

    def _flush_ready(self, now: float) -> None:
        """Hand the waiting connections over in order, as far as the gateway takes them; wait for
        the control socket to be writable again when it does not."""
        while self.ready:
            conn, head, _ = self.ready[0]
            try:
                socket.send_fds(self.ctrl, [bytes(head)], [conn.fileno()])
            except (BlockingIOError, InterruptedError):  # the gateway is behind: wait for it
                break
            except OSError:  # the gateway is gone: answer this one, the rest wait for a new one
                self.ready.popleft()
                self.counts["hand_over_errors"] += 1
                self._busy(conn)
                continue
            self.ready.popleft()
            self.counts["handed_over"] += 1
            conn.close()  # the gateway has its own descriptor of it now
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if self.ready else 0)
        if self.selector.get_key(self.ctrl).events != events:
            self.selector.modify(self.ctrl, events, "ctrl")

    def _busy(self, conn: socket.socket) -> None:
        """Answer 503 (the socket's buffer takes the few bytes at once) and close."""
        with contextlib.suppress(OSError):
            conn.send(BUSY_RESPONSE)
        conn.close()

    def _expire_ready(self, now: float) -> None:
        expired = False
        while self.ready and self.ready[0][2] <= now:
            conn, _, _ = self.ready.popleft()
            self.counts["busy"] += 1
            self._busy(conn)
            expired = True
        if expired and not self.ready:
            self.selector.modify(self.ctrl, selectors.EVENT_READ, "ctrl")

    def _drop(self, fd: int) -> None:
        conn, _, _ = self.held.pop(fd)
        self.selector.unregister(conn)
        conn.close()

    def _expire(self, now: float) -> None:
        while self.held:
            fd, (_, _, deadline) = next(iter(self.held.items()))
            if deadline > now:
                return
            self._drop(fd)
            self.counts["timed_out"] += 1

    def _control(self) -> bool:
        """False when the gateway is gone or asks the front door to stop."""
        try:
            message = self.ctrl.recv(64)
        except (BlockingIOError, InterruptedError, TimeoutError):
            return True
        except OSError:
            return False
        return bool(message) and message != b"stop"

    def _report(self, now: float) -> None:
        if self.counts == self._sent_counts or now - self._stats_at < STATS_EVERY_S:
            return
        try:
            self.ctrl.send(STATS + json.dumps(dict(self.counts, held=len(self.held) + len(self.ready))).encode())
        except OSError:
            return
        self._sent_counts = dict(self.counts)
        self._stats_at = now


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mmgate.frontdoor",
                                     description="mmgate's front door (started by mmgate serve)")
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--ctrl-fd", type=int, required=True)
    parser.add_argument("--max-connections", type=int, required=True)
    parser.add_argument("--header-timeout", type=float, required=True)
    parser.add_argument("--max-head-bytes", type=int, default=65536)
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = args.max_connections + 64
    if soft < wanted:
        with contextlib.suppress(ValueError, OSError):  # not allowed: the cap is then what fits
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard), hard))
    listen = socket.socket(fileno=args.listen_fd)
    ctrl = socket.socket(fileno=args.ctrl_fd)
    door = FrontDoor(listen, ctrl, max_connections=args.max_connections,
                     header_timeout_s=args.header_timeout, max_head_bytes=args.max_head_bytes)
    try:
        door.run()
    except KeyboardInterrupt:
        pass
    finally:
        os._exit(0)  # nothing to flush; held connections close with the process


if __name__ == "__main__":
    main()
