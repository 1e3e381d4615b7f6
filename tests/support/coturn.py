"""Debian's coturn, started on loopback for a test with TURN REST credentials (use-auth-secret).

Relaying to loopback peers is off in coturn by default (a production server must not relay into its
own host); the test allows it because the media server it relays to is on this machine.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.local_server import free_port
from tests.support.processes import stop
from tests.support.waiting import wait_until

TURNSERVER = "turnserver"
REALM = "worldrtc.test"


@dataclass(frozen=True)
class Coturn:
    port: int
    secret: str
    log: Path

    @property
    def url(self) -> str:
        return f"turn:127.0.0.1:{self.port}?transport=udp"


@contextmanager
def coturn(tmp: Path) -> Iterator[Coturn]:
    if shutil.which(TURNSERVER) is None:
        pytest.skip("coturn's turnserver is missing (make packages installs Debian's coturn)")
    port, secret = free_port(), secrets.token_hex(16)
    relay_lo = 49152 + port % 8000  # a private range of its own, away from other tests' ports
    log = tmp / "coturn.log"
    cmd = [
        TURNSERVER, "-n", "--listening-ip=127.0.0.1", "--relay-ip=127.0.0.1", f"--listening-port={port}",
        f"--min-port={relay_lo}", f"--max-port={relay_lo + 200}", "--use-auth-secret",
        f"--static-auth-secret={secret}", f"--realm={REALM}", "--allow-loopback-peers", "--no-tls", "--no-dtls",
        "--no-cli", "--fingerprint", "--verbose", "--simple-log", f"--log-file={log}",
        f"--pidfile={tmp / 'coturn.pid'}", f"--userdb={tmp / 'turndb'}",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: log.is_file() and "Total General servers" in log.read_text(), 20, "coturn listening")
        yield Coturn(port, secret, log)
    finally:
        stop(proc)
