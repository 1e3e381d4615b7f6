"""Regenerate a session from its recording with `benchmarks.replay`, as a user would, and hold it to
every chunk's recorded digest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def regenerate_exactly(record: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Replay `record` (a recording's JSON) headless; assert every chunk's digest equal; the run's report."""
    path, out = folder / "rec.json", folder / "regenerated.json"
    path.write_text(json.dumps(record))
    cmd = [sys.executable, "-m", "benchmarks.replay", "--recording", str(path), "--quiet", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    n = len(record["chunks"])
    assert done.returncode == 0 and f"every chunk's digest equal ({n} of {n})" in done.stdout, done.stdout + done.stderr
    report: dict[str, Any] = json.loads(out.read_text())
    return report
