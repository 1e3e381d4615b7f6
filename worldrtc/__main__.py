"""`python -m worldrtc`: the `worldrtc` command without its console script (worldrtc/cli.py)."""

from worldrtc.cli import main

raise SystemExit(main())
