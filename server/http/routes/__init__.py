"""Every route, one `APIRouter` per resource: probes (`health.py`), what a client reads before it
starts (`model.py`), what an operator reads (`metrics.py`), sessions (`sessions.py`, with their 201
body in `created.py`, shared with seated tickets), waiting-room tickets (`tickets.py`), spectators
(`watch.py`), snapshots and saves (`snapshots.py`: taking one, writing a save) and WHEP (`whep.py`);
`create_app` (server/http/app.py) includes them all."""
