"""Height bands for one device: which rows each band computes so that its own rows come out exact.

The VAE's full-resolution layers (the encoder's first two levels, the decoder's last two) hold
almost all of its activations. Run as N horizontal bands one after another, each band allocates
about 1/N of them. What makes it exact, not an approximation like tiled decoders that blend
overlaps: every layer of a banded run is row-local with a known reach (a 3×3 conv reads one row
above and below, a residual block two, a 2× upsample and its conv half a row of its input, a
stride-2 downsample rows 2j..2j+2), so walking the layers backwards from the rows a band owns gives
every input row they depend on: the band's halo. A band computes its halo rows too (wrongly near
its cut, where it pads with zeros instead of its neighbour's rows), and keeps only its own rows,
whose dependency cone the halo covers. This is the halo exchange of the height-sharded decode
(workers/parallel/halo.py) done once per segment rather than once per conv: more rows recomputed,
no communication, and one band's activations alive at a time.

A band's causal caches (the conv history kept across chunks) are its own and hold its halo rows:
the same rows every chunk, so the next chunk's cone reads the history it needs. Caches therefore
grow by the halo share; the plan counts them by tracing this code.

Layers are described by `RowStep`s, so this module is pure geometry (tested alone); the VAE maps
its layers to steps (workers/models/vae.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class RowKind(enum.Enum):
    SAME = "same"  # output rows are input rows; row j reads input rows j - radius .. j + radius
    UP = "up"  # 2× nearest upsample, then a conv of `radius` rows at the upsampled height
    DOWN = "down"  # pad one row below, conv of 3 rows with stride 2: row j reads input rows 2j .. 2j + 2


@dataclass(frozen=True)
class RowStep:
    kind: RowKind
    radius: int = 0


@dataclass(frozen=True)
class Band:
    in_lo: int  # input rows the band computes, [in_lo, in_hi)
    in_hi: int
    keep_lo: int  # rows of the band's output it keeps, relative to its first output row
    keep_hi: int
    out_lo: int  # the output rows it owns, [out_lo, out_hi)
    out_hi: int


def output_height(steps: list[RowStep], height: int) -> int:
    for step in steps:
        height = height * 2 if step.kind is RowKind.UP else height // 2 if step.kind is RowKind.DOWN else height
    return height


def _needed(step: RowStep, lo: int, hi: int, height_in: int) -> tuple[int, int]:
    """Input rows that output rows [lo, hi) of `step` read, clipped to the frame's [0, height_in)."""
    if step.kind is RowKind.SAME:
        lo, hi = lo - step.radius, hi + step.radius
    elif step.kind is RowKind.UP:
        lo, hi = (lo - step.radius) // 2, (hi - 1 + step.radius) // 2 + 1
    else:
        lo, hi = 2 * lo, 2 * hi + 1
    return max(lo, 0), min(hi, height_in)


def max_bands(steps: list[RowStep], height: int) -> int:
    """The most bands a segment's rows allow: every band keeps at least one row of each output of
    a stride-2 layer (so one row of the segment's output, whichever is coarser)."""
    return max(1, min(output_height(steps, height), height // 2 ** _downs(steps)))


def _downs(steps: list[RowStep]) -> int:
    return sum(step.kind is RowKind.DOWN for step in steps)


def plan_bands(steps: list[RowStep], height: int, bands: int) -> list[Band]:
    """N bands over the segment's output rows, each with the input rows it must compute."""
    most = max_bands(steps, height)
    if not 1 <= bands <= most:
        raise ValueError(
            f"{bands} VAE bands: this geometry's full-resolution layers have rows for at most {most} "
            f"(height {height} px); lower --vae-bands"
        )
    heights = [height]
    for step in steps:
        heights.append(output_height([step], heights[-1]))
    out_height = heights[-1]
    align = 2 ** _downs(steps)  # a band's first input row must land on the stride-2 grid of every downsample
    found = []
    for i in range(bands):
        out_lo, out_hi = i * out_height // bands, (i + 1) * out_height // bands
        lo, hi = out_lo, out_hi
        for step, height_in in zip(reversed(steps), reversed(heights[:-1]), strict=True):
            lo, hi = _needed(step, lo, hi, height_in)
        lo = lo // align * align
        hi = min(-(-hi // align) * align, height)
        first = lo
        for step in steps:  # where the band's computed rows land at the segment's output
            first = first * 2 if step.kind is RowKind.UP else first // 2 if step.kind is RowKind.DOWN else first
        found.append(Band(lo, hi, out_lo - first, out_hi - first, out_lo, out_hi))
    return found
