"""Benchmarks that print figures: headless replay and friends."""
