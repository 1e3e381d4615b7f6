"""A bound on what a peer can make the server buffer on its data channel.

aiortc reassembles a fragmented SCTP message in full before handing it on, with no limit of its own
(its advertised `a=max-message-size` only binds senders that honour it), so one hostile peer could
make the server hold any amount of memory. Control messages are a few hundred bytes (4 KiB at
most). So the server advertises MAX_MESSAGE_BYTES, and a peer with more than that waiting in
reassembly has its association aborted: its data channels close, and so does its session.

Process-wide: aiortc builds its SCTP transports itself, so the limits go onto its classes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiortc import rtcsctptransport

log = logging.getLogger("worldrtc.sctp")

MAX_MESSAGE_BYTES = 64 * 1024  # advertised in answers; 16 × the largest control message

_original_receive: Callable[[Any, Any], Awaitable[None]] = rtcsctptransport.RTCSctpTransport._receive_data_chunk


async def _bounded_receive(self: Any, chunk: Any) -> None:
    await _original_receive(self, chunk)
    waiting = sum(len(c.user_data) for stream in self._inbound_streams.values() for c in stream.reassembly)
    if waiting > MAX_MESSAGE_BYTES:
        log.warning("a peer sent a data-channel message over %d bytes: closing its association", MAX_MESSAGE_BYTES)
        await self.stop()


def bound_inbound_messages() -> None:
    """Idempotent."""
    rtcsctptransport.LOCAL_MAX_MESSAGE_SIZE = MAX_MESSAGE_BYTES  # read when an answer is written
    rtcsctptransport.RTCSctpTransport._receive_data_chunk = _bounded_receive  # type: ignore[method-assign]
