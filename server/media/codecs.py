"""Video codec preference (H.264 first, VP8 fallback) and the encoder bitrate, for aiortc.

Codec order. Safari/iOS WebRTC is built around H.264 (hardware decode), so the offer/answer lists H.264
constrained baseline (profile-level-id 42e01f, packetization-mode 1) first; every browser also does
VP8, which stays as the fallback. RTX (retransmission) is kept so NACKed packets can be resent.

Bitrate. A session encodes once for all its viewers (`server/media/shared_encoder.py`, aiortc's encoder
settings); like aiortc's own encoders (`aiortc.codecs.h264.H264Encoder`, `aiortc.codecs.vpx.Vp8Encoder`)
it starts at its module's DEFAULT_BITRATE, and the driver's REMB feedback moves its target, clamped
to the module's [MIN_BITRATE, MAX_BITRATE]; the clamp and the start value are read from the module
globals at call time. There is no per-sender knob, so `set_video_bitrate` rewrites those globals:
the setting is process-wide. That is acceptable
here because one server process serves one model at one resolution with one configured bitrate;
every session wants the same target. Call it once at startup, before any peer connection encodes.
It also sets the frame rate aiortc's H.264 encoder assumes for rate control (30 fps by default, which
at our 16 fps leaves the real rate at about 16/30 of the target).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

from aiortc import RTCRtpSender, RTCRtpTransceiver
from aiortc.codecs import h264, vpx
from aiortc.rtcrtpparameters import RTCRtpCodecCapability

H264_PROFILE_LEVEL_ID = "42e01f"  # constrained baseline, level 3.1


def _rank(codec: RTCRtpCodecCapability) -> int:
    """Within one codec name: H.264 constrained baseline with packetization-mode 1 first."""
    if codec.name.upper() != "H264":
        return 0
    params = codec.parameters
    exact = (
        str(params.get("profile-level-id", "")).lower() == H264_PROFILE_LEVEL_ID
        and str(params.get("packetization-mode", "")) == "1"
    )
    return 0 if exact else 1


def ordered_video_codecs(order: Sequence[str] = ("H264", "VP8")) -> list[RTCRtpCodecCapability]:
    """aiortc's video capabilities in `order` (by codec name), RTX last; codecs not named are left out."""
    if not order:
        raise ValueError("order must name at least one video codec, e.g. ('H264', 'VP8')")
    caps = RTCRtpSender.getCapabilities("video").codecs
    out: list[RTCRtpCodecCapability] = []
    for name in order:
        matches = sorted((c for c in caps if c.name.upper() == name.upper()), key=_rank)
        if not matches:
            available = sorted({c.name for c in caps if c.name.lower() != "rtx"})
            raise ValueError(f"video codec {name!r} is not supported by aiortc; choose from {available}")
        out.extend(matches)
    out.extend(c for c in caps if c.name.lower() == "rtx")
    return out


def prefer_codecs(
    transceiver: RTCRtpTransceiver, order: Sequence[str] = ("H264", "VP8")
) -> list[RTCRtpCodecCapability]:
    """Set the transceiver's codec preferences (before createOffer/createAnswer); returns the list set."""
    codecs = ordered_video_codecs(order)
    transceiver.setCodecPreferences(codecs)
    return codecs


@dataclass(frozen=True)
class BitrateLimits:
    """One encoder module's bitrate globals, in bits per second."""

    default_bps: int
    min_bps: int
    max_bps: int


@dataclass(frozen=True)
class VideoEncoderSettings:
    """aiortc's process-wide encoder globals that this module touches."""

    h264: BitrateLimits
    vp8: BitrateLimits
    h264_rate_control_fps: int  # aiortc.codecs.h264.MAX_FRAME_RATE


def _limits(mod: ModuleType) -> BitrateLimits:
    return BitrateLimits(mod.DEFAULT_BITRATE, mod.MIN_BITRATE, mod.MAX_BITRATE)


def _apply(mod: ModuleType, lim: BitrateLimits) -> None:
    # aiortc reads these module constants when it builds an encoder.
    for name, value in (
        ("DEFAULT_BITRATE", lim.default_bps),
        ("MIN_BITRATE", lim.min_bps),
        ("MAX_BITRATE", lim.max_bps),
    ):
        setattr(mod, name, value)


def video_encoder_settings() -> VideoEncoderSettings:
    """The current process-wide settings (to log, or to restore after a test)."""
    return VideoEncoderSettings(h264=_limits(h264), vp8=_limits(vpx), h264_rate_control_fps=h264.MAX_FRAME_RATE)


def restore_video_encoder_settings(settings: VideoEncoderSettings) -> None:
    """Put back what `video_encoder_settings()` or `set_video_bitrate()` returned."""
    _apply(h264, settings.h264)
    _apply(vpx, settings.vp8)
    h264.MAX_FRAME_RATE = settings.h264_rate_control_fps


def set_video_bitrate(
    bps: int, min_bps: int | None = None, max_bps: int | None = None, *, fps: int | None = None
) -> VideoEncoderSettings:
    """Process-wide: new encoders start at `bps`; REMB may move them within [min_bps, max_bps].

    Defaults: `max_bps = bps` (the configured rate is a ceiling: on loopback or a fast LAN the browser's
    REMB estimate runs far above it and would otherwise take the rate to aiortc's own maximum) and
    `min_bps = bps // 4` (room to back off under congestion). Applies to H.264 and VP8 alike; encoders
    that already exist pick up the new clamp at their next REMB update.

    `fps` is the session frame rate. aiortc's H.264 encoder tells x264 the stream is 30 fps
    (`h264.MAX_FRAME_RATE`), so x264 budgets bps/30 per frame and a 16 fps stream comes out at about
    16/30 of the target (measured: 161 kbps for 300 kbps, 1137 kbps for 2 Mbps); set to the real rate the
    target holds (303 / 2126 kbps). VP8 needs no such fix (299 / 1969 kbps).
    Returns the previous settings.
    """
    min_bps = bps // 4 if min_bps is None else min_bps
    max_bps = bps if max_bps is None else max_bps
    if not 0 < min_bps <= bps <= max_bps:
        raise ValueError(
            f"need 0 < min_bps <= bps <= max_bps, got min_bps={min_bps}, bps={bps}, max_bps={max_bps}; "
            "video bitrates are in bits per second (e.g. bps=2_000_000)"
        )
    if fps is not None and not 1 <= fps <= 120:
        raise ValueError(f"fps must be the session frame rate (1..120), got {fps}")
    previous = video_encoder_settings()
    limits = BitrateLimits(bps, min_bps, max_bps)
    restore_video_encoder_settings(
        VideoEncoderSettings(
            h264=limits, vp8=limits, h264_rate_control_fps=previous.h264_rate_control_fps if fps is None else fps
        )
    )
    return previous
