"""How the server process stops: drain on SIGTERM, stop at once on SIGINT, exit non-zero when the
engine cannot run.

    SIGTERM            `/readyz` and new sessions answer 503 `draining` at once; live sessions go on
                       until they end or `drain_timeout_s` passes, then close with `server_shutdown`;
                       the process exits 0.
    SIGINT, or a second signal while draining
                       every session closes with `server_shutdown` now; the workers get a short
                       grace and are killed; the process exits 0.
    the engine fails   (workers that cannot start, or a stage that cannot be restarted) the cause is
                       logged, naming the stage, and the process exits 1, so that whatever supervises
                       it can start it afresh.

Whichever way, the process exits only after every process it started has (workers, and
multiprocessing's resource tracker), reaped: its exit means everything is gone.

uvicorn's own signal handling would stop listening at the first signal (no `/readyz` to tell a load
balancer about the drain) and re-raise the signal at exit (status 128+n): `WorldServer` replaces it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from types import FrameType

import uvicorn

from server.common.logs import redact_access_log
from server.common.phase import Phase
from server.state import AppState
from workers.runtime.supervisor import reap_children

log = logging.getLogger("worldrtc.server")

DRAIN_POLL_S = 0.1
# Stopping workers may finish their command for the state's `worker_grace_s` (server/state.py
# WORKER_GRACE_S), then are killed; when the stop is forced, for this long, as in-flight HTTP requests.
FORCED_GRACE_S = 0.5
FORCED_HTTP_GRACE_S = 1  # uvicorn takes whole seconds
HTTP_GRACE_S = 5  # in-flight HTTP requests get this long once the server stops listening


class WorldServer(uvicorn.Server):
    """uvicorn's server with the stop policy above. `exit_code` is the process's exit status."""

    def __init__(self, config: uvicorn.Config, state: AppState) -> None:
        super().__init__(config)
        self.state = state
        self.exit_code = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None
        state.request_exit = self.request_exit

    async def serve(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Runs on the loop's thread between two bytecodes: hand the work to the loop.
        if self._loop is None:
            self.should_exit = True
            return
        if sig == signal.SIGTERM and self.state.phase is Phase.SERVING:
            self._loop.call_soon_threadsafe(self._start_drain)
        else:
            self._loop.call_soon_threadsafe(self._stop_now)

    def request_exit(self, code: int) -> None:
        """Stop now with this exit status (called on the loop)."""
        self.exit_code = max(self.exit_code, code)
        self._stop_now()

    def _start_drain(self) -> None:
        if self.state.phase is not Phase.SERVING:
            return
        self.state.phase = Phase.DRAINING
        self._drain = asyncio.get_running_loop().create_task(self._run_drain(), name="drain")

    async def _run_drain(self) -> None:
        state = self.state
        timeout_s = state.settings.drain_timeout_s
        log.info("draining: no new sessions; %d live may run up to %g s", state.active_sessions(), timeout_s)
        deadline = time.monotonic() + timeout_s
        while state.active_sessions() and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        left = state.active_sessions()
        log.info("drained" if not left else f"drain timeout: closing {left} live sessions")
        self.should_exit = True  # the app's shutdown closes what is left with `server_shutdown`

    def _stop_now(self) -> None:
        self.state.phase = Phase.STOPPING
        self.state.worker_grace_s = FORCED_GRACE_S
        self.config.timeout_graceful_shutdown = FORCED_HTTP_GRACE_S  # read by uvicorn when it shuts down
        if self._drain is not None:
            self._drain.cancel()
        self.should_exit = True


def serve(state: AppState, config: uvicorn.Config) -> int:
    """Run the server until it stops; its exit status."""
    config.timeout_graceful_shutdown = HTTP_GRACE_S
    server = WorldServer(config, state)
    redact_access_log()  # uvicorn.Config has set up its loggers by now
    server.run()
    if killed := reap_children():  # the process's exit means every worker is gone
        log.warning("killed %d worker processes still running at exit: %s", len(killed), killed)
    return server.exit_code
