"""worldrtc's Python client: `worldrtc.Session` connects to a server over WebRTC (see `client.py`)."""

from worldrtc.client import ClientError, ClientRun, Frame, Session

__all__ = ["ClientError", "ClientRun", "Frame", "Session"]
