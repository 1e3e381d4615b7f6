"""The synthetic timing model: the real pipeline with stages that hold for fixed times.

    python -m server --model synthetic --stage-ms 100,800,500 [--synthetic-geometry lingbot-world-v2-14b]
        [--synthetic-state-mib 2048]

Every stage runs in its real worker process and moves tensors of a real preset's shapes through the
real channels (default: the 832×480 geometry of `lingbot-world-v2-14b`, so transport, frame
conversion and video encoding cost what they will in service), but instead of computing it holds
its worker for its stated time per chunk (encode, DiT, decode). The decode stage's frames carry their
own global frame number (`workers/frame_stamp.py`) over a moving background, so a client can tell
new frames from repeats, and their order, exactly. This is how a deployment's pipelining, pacing and
capacity are checked without a GPU. `state_mib` gives each session's DiT stage that much state (a
real model's KV cache is GiBs), which a snapshot copies and a save writes to disk.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from workers.models.presets import ModelPreset, get_preset

SYNTHETIC = "synthetic"
DEFAULT_STAGE_MS = (100.0, 800.0, 500.0)
DEFAULT_GEOMETRY = "lingbot-world-v2-14b"


@dataclass(frozen=True)
class SyntheticModel:
    encode_s: float = DEFAULT_STAGE_MS[0] / 1000
    dit_s: float = DEFAULT_STAGE_MS[1] / 1000
    decode_s: float = DEFAULT_STAGE_MS[2] / 1000
    geometry: str = DEFAULT_GEOMETRY  # the preset whose tensor shapes flow
    state_mib: float = 0.0  # kept per session by the DiT stage (in a snapshot, in a save)

    def __post_init__(self) -> None:
        if min(self.encode_s, self.dit_s, self.decode_s) <= 0:
            raise ValueError("synthetic stage times must be positive")
        if self.state_mib < 0:
            raise ValueError(f"a synthetic session's state cannot be negative: {self.state_mib:g} MiB")
        get_preset(self.geometry)  # a clear error for an unknown geometry, now

    @staticmethod
    def parse(stage_ms: str | None, geometry: str | None = None, state_mib: float = 0.0) -> SyntheticModel:
        """From "encode,dit,decode" in milliseconds (e.g. "100,800,500"; None: the defaults)."""
        ms: tuple[float, ...] = DEFAULT_STAGE_MS
        if stage_ms is not None:
            bad = ValueError(f"stage times must be three numbers of ms, encode,dit,decode; got {stage_ms!r}")
            try:
                ms = tuple(float(x) for x in stage_ms.split(","))
            except ValueError:
                raise bad from None
            if len(ms) != 3:
                raise bad
        return SyntheticModel(ms[0] / 1000, ms[1] / 1000, ms[2] / 1000, geometry or DEFAULT_GEOMETRY, state_mib)

    @property
    def stage_ms(self) -> str:
        return ",".join(f"{1000 * s:g}" for s in (self.encode_s, self.dit_s, self.decode_s))

    def preset(self) -> ModelPreset:
        """The geometry preset, named and described as the synthetic model it stands in for."""
        note = (
            f"synthetic timing model: stages hold {self.stage_ms} ms (encode, DiT, decode) and move "
            f"{self.geometry} tensors; frames show their own frame number"
        )
        return dataclasses.replace(get_preset(self.geometry), name=SYNTHETIC, weights_note=note, bundled_weights=None)


def resolve_model(
    name: str, stage_ms: str | None = None, geometry: str | None = None, state_mib: float = 0.0
) -> tuple[ModelPreset, SyntheticModel | None]:
    """A model name as users give it: a preset, or `synthetic` with its stage times, geometry and state."""
    if name == SYNTHETIC:
        synthetic = SyntheticModel.parse(stage_ms, geometry, state_mib)
        return synthetic.preset(), synthetic
    if stage_ms is not None or geometry is not None or state_mib:
        raise ValueError("stage times, a synthetic geometry and state only apply to --model synthetic")
    return get_preset(name), None
