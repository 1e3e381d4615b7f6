"""How a turn hands the slot on (WORLDRTC_TURN_HANDOVER), a setting of its own so that the settings
need not import the usher (server/usher.py) that acts on it."""

from enum import StrEnum


class TurnHandover(StrEnum):
    FRESH = "fresh"  # the next person starts their own world, as after any session
    CONTINUE = "continue"  # the next person takes over the same world where it is (a branch of a snapshot)
