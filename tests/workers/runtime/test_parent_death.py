"""Processes that call die_with_parent exit when their parent is killed, SIGKILL included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.support.processes import pid_alive
from tests.support.waiting import wait_until
from workers.runtime.parent_death import PARENT_POLL_S

pytestmark = pytest.mark.processes

# A parent that starts a spawn pool the way the training CLI's latents phase does, reports its
# worker's pid, then waits for it forever.
PARENT = textwrap.dedent(
    """
    import multiprocessing, os, sys, time
    from concurrent.futures import ProcessPoolExecutor
    from workers.runtime.parent_death import die_with_parent

    if __name__ == "__main__":
        context = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(1, mp_context=context, initializer=die_with_parent, initargs=(os.getpid(),))
        print(pool.submit(os.getpid).result(), flush=True)
        pool.submit(time.sleep, 600)
        time.sleep(600)
    """
)


def test_pool_workers_exit_when_their_parent_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert pid_alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        wait_until(lambda: not pid_alive(child), 10 * PARENT_POLL_S + 5, "the pool worker to exit with its parent")
    finally:
        parent.kill()
