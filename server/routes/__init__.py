"""The REST routes by resource, one `APIRouter` per module: probes (`health.py`), what a client reads
before it starts (`model.py`), what an operator reads (`metrics.py`) and the sessions (`sessions.py`).
The spectators', snapshots' and WHEP routes live with what they serve (server/watch.py,
server/snapshots.py, server/whep.py); `create_app` (server/app.py) includes them all."""
