"""The signaling and streaming server (FastAPI + aiortc)."""
