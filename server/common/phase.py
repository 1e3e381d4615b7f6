"""The server's phase: serving, then (on SIGTERM) draining, then stopping.

The app state holds it (server/state.py refuses new sessions outside `SERVING`) and the stop policy
(server/http/lifecycle.py) advances it; it lives apart from both so that neither imports the other for it.
"""

from enum import StrEnum


class Phase(StrEnum):
    SERVING = "serving"
    DRAINING = "draining"  # no new sessions; live ones run out
    STOPPING = "stopping"  # closing everything now
