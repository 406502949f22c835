"""The service's connections: a bounded time to send a request, a bounded number held.

uvicorn closes a kept-alive connection that stays idle (5 s), but gives a client all the time
it likes to send a request: a client that sends half a request holds a descriptor for as long
as it stays, and enough of them use up the process's open-files limit, after which every other
client is reset. :func:`guarded_protocol` is uvicorn's HTTP protocol with two bounds:

* **read timeout**: a request (its headers and body) must arrive within ``read_timeout_s`` of
  its first byte, or of the connection's opening; else it is answered 408 and the connection
  closed (closed silently when nothing came). A request being answered is never timed: the
  bound is on the client, not the work.
* **connections**: at most ``max_connections`` are held. One more makes room by closing the
  connection that has waited longest for a request (a half-sent one, or an idle kept-alive
  one), so that slow clients cannot keep a complete request out; when every connection held
  has a request being answered, the new one is refused with 503.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

__all__ = ["MAX_CONNECTIONS", "files_limit", "guarded_protocol", "max_connections"]

log = logging.getLogger(__name__)

#: connections held at most by default (with an open-files limit of at least twice as many)
MAX_CONNECTIONS = 1024


def files_limit() -> int | None:
    """The process's open-files limit (soft; None: unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def max_connections(configured: int | None) -> int:
    """The connections the service holds at most: ``configured`` (default
    :data:`MAX_CONNECTIONS`), and never more than half the open-files limit, so the other half
    stays for the store, the model and the process."""
    limit = files_limit()
    wanted = configured or MAX_CONNECTIONS
    if limit is None or wanted <= limit // 2:
        return wanted
    if configured is not None:
        log.warning(
            "RAG_SERVE_MAX_CONNECTIONS=%d is more than half the open-files limit (%d): %d held",
            configured,
            limit,
            max(limit // 2, 1),
        )
    return max(limit // 2, 1)


def _response(status: bytes, detail: str) -> bytes:
    """A whole HTTP response that closes its connection, with the service's error body."""
    body = json.dumps({"detail": detail}).encode()
    head = (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    return head + body


def guarded_protocol(read_timeout_s: float, max_connections: int) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools or h11, as uvicorn picks) with a read timeout and a
    bound on the connections held (see the module's docstring)."""
    base: Any = AutoHTTPProtocol
    timed_out = _response(
        b"408 Request Timeout", f"the request was not complete within {read_timeout_s:g} s"
    )
    full = _response(
        b"503 Service Unavailable",
        f"the service holds its {max_connections} connections, each with a request being "
        "answered: try again",
    )
    made_room = _response(
        b"503 Service Unavailable",
        f"the service holds its {max_connections} connections: this one, the one that had "
        "waited longest for its request, was closed for another",
    )

    class GuardedProtocol(base):  # type: ignore[misc]  # uvicorn's protocol is untyped here
        """One connection (see :func:`guarded_protocol`)."""

        _reading_since = 0.0
        _idle = False  # its last response was sent and no byte of the next one came yet
        _partial = False  # bytes of a request came and no response was sent for it yet
        _timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._reading(time.monotonic())
            if len(self.connections) > max_connections:
                self._make_room()

        def data_received(self, data: bytes) -> None:
            if self._idle:  # the first bytes of the next request of a kept-alive connection
                self._idle = False
                self._reading(time.monotonic())
            self._partial = True
            super().data_received(data)

        def on_response_complete(self) -> None:
            self._idle = True  # idle from now: uvicorn's keep-alive timeout closes it
            self._partial = False
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            super().connection_lost(exc)

        # -- internals ------------------------------------------------------------------

        def _waiting(self) -> bool:
            """No request of this connection is being answered: it is waiting for the
            client (a request's headers or body, or the next request)."""
            cycle = self.cycle
            return cycle is None or cycle.response_complete or cycle.more_body

        def _reading(self, since: float) -> None:
            """A request is due from ``since``: time it."""
            self._reading_since = since
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self.loop.call_later(read_timeout_s, self._expire)

        def _expire(self) -> None:
            self._timer = None
            if self.transport.is_closing() or self._idle or not self._waiting():
                return  # closed, kept alive (uvicorn times it), or being answered
            left = self._reading_since + read_timeout_s - time.monotonic()
            if left > 0:
                self._timer = self.loop.call_later(left, self._expire)
                return
            self._close(timed_out)

        def _make_room(self) -> None:
            """Close the connection that has waited longest for its request (not this
            one); or refuse this one when every other has a request being answered."""
            waiting = [
                c
                for c in self.connections
                if c is not self
                and isinstance(c, GuardedProtocol)
                and not c.transport.is_closing()
                and c._waiting()
            ]
            if not waiting:
                self.transport.write(full)
                self.transport.close()
                return
            oldest = min(waiting, key=lambda c: (not c._idle, c._reading_since))
            oldest._close(made_room)

        def _close(self, answer: bytes) -> None:
            """Close the connection, with ``answer`` when part of a request came and no
            response began (one that sent nothing is closed silently, as uvicorn closes an
            idle one: a client may be sending its request on it just now)."""
            cycle = self.cycle
            if self._partial and (cycle is None or cycle.response_complete):
                self.transport.write(answer)
            self.transport.close()

    return GuardedProtocol
