"""Reliability suite: faults, load and abuse against a real server (python -m benchmarks.reliability)."""
