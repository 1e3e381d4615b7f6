"""Every row of the suite, registered by importing its module."""

from benchmarks.reliability import (
    cases_admission,  # noqa: F401
    cases_faults,  # noqa: F401
    cases_fuzz,  # noqa: F401
    cases_lifecycle,  # noqa: F401
    cases_load,  # noqa: F401
    cases_prompts,  # noqa: F401
    cases_recording,  # noqa: F401
    cases_security,  # noqa: F401
    cases_snapshots,  # noqa: F401
    cases_spectators,  # noqa: F401
    cases_waiting,  # noqa: F401
)
