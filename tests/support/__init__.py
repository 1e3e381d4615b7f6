"""Helpers shared by the tests (no tests here): processes and ports, waiting on conditions, fake
clocks, engine session runners, frame comparison under the determinism contract, gloo ranks, and the
small DiT the model and parallel tests share. Test modules import from here, never from each other.
"""
