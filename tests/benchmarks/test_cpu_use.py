"""CPU use per process over a window (benchmarks/cpu_use.py), read from a real child process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks import cpu_use

# The child spends this much CPU between the two readings, then waits: however loaded the machine,
# the window must account at least this to its role.
BURN_S = 0.3
CHILD = (
    "import sys, time\n"
    "sys.stdin.readline()\n"
    "start = time.process_time()\n"
    f"while time.process_time() - start < {BURN_S}: pass\n"
    "print('burnt', flush=True)\n"
    "sys.stdin.readline()\n"
)


@pytest.mark.processes
def test_a_stage_worker_is_charged_the_cpu_it_spent_in_the_window() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pids = {"dit": [child.pid], "decode": []}
        before = cpu_use.read(pids)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "burnt"
        usage = cpu_use.cores_used(before, cpu_use.read(pids))
    finally:
        child.communicate("stop\n", timeout=10)
    dit_s = usage["processes"]["dit"] * usage["window_s"]
    assert BURN_S <= dit_s <= usage["window_s"] + 0.05
    # The child's parent is this process, which is the clients' role, not a separate server.
    assert set(usage["processes"]) == {"dit", cpu_use.CLIENTS} and usage["cores"] >= 1
    assert usage["machine_busy"] >= usage["processes"]["dit"] - 0.05
    text = cpu_use.describe(usage)
    assert text.startswith("cores used over") and "dit " in text and "stolen" in text


def test_a_window_must_move_forward() -> None:
    reading = cpu_use.read({})
    with pytest.raises(ValueError, match="after the first"):
        cpu_use.cores_used(reading, reading)
