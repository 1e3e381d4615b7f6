"""worldrtc's Python client: `worldrtc.Session` connects to a server over WebRTC (`client.py`).

The `worldrtc` command lives here too (`cli.py`, at the top of the layering: it dispatches to the
server's, the models' and the replay's command lines). The client is imported on first use, so the
command does not load WebRTC to plan a model's memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worldrtc.client import ClientError, ClientRun, Frame, Session

__all__ = ["ClientError", "ClientRun", "Frame", "Session"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from worldrtc import client

        return getattr(client, name)
    raise AttributeError(f"module 'worldrtc' has no attribute {name!r}")
