"""Server settings: command-line flags and WORLDRTC_* environment variables, validated once."""

from __future__ import annotations

import ipaddress

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from server.dispatch import DispatchPolicy
from workers.models.presets import DEFAULT_PRESET


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WORLDRTC_", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    model: str = DEFAULT_PRESET  # a preset, or "synthetic" (workers/runtime/synthetic.py)
    stage_ms: str | None = None  # synthetic model: "encode,dit,decode" hold times in ms
    synthetic_geometry: str | None = None  # synthetic model: the preset whose tensor shapes flow
    placement: str = "cpu"
    checkpoint_dir: str | None = None
    weights_seed: int = 0
    max_sessions: int = Field(default=2, ge=1)
    fps: int | None = Field(default=None, ge=1, le=60)  # video frame rate; None: the model's
    dispatch: DispatchPolicy = DispatchPolicy.JIT  # when a viewer's next chunk starts (server/dispatch.py)
    api_token: str | None = None
    # Browser origins (scheme://host:port) other than the server's own that may call the API; empty: none.
    cors_origins: list[str] = Field(default_factory=list)
    # WebRTC: nothing reaches outside by default. Each entry is an RTCIceServer-like dict.
    ice_servers: list[dict[str, object]] = Field(default_factory=list)
    udp_port_min: int | None = Field(default=None, ge=1, le=65535)
    udp_port_max: int | None = Field(default=None, ge=1, le=65535)
    video_bitrate_bps: int = Field(default=1_500_000, ge=100_000, le=50_000_000)
    # Limits: every wait, body and message rate has one (README "Server").
    offer_timeout_s: float = 30.0
    ice_timeout_s: float = 15.0
    # A viewer that vanishes without closing stops sending RTCP receiver reports (every client that
    # receives video sends them about every second): after this long without one, the session ends.
    peer_timeout_s: float = Field(default=4.5, gt=0)
    idle_timeout_s: float | None = Field(default=300.0, gt=0)  # no control message for this long ends a session
    disconnected_grace_s: float = 3.0
    rest_body_max_bytes: int = 64 * 1024
    image_max_bytes: int = 10 * 1024 * 1024
    sdp_max_bytes: int = 32 * 1024
    control_rate_per_s: float = 120.0
    max_session_s: float | None = None
    drain_timeout_s: float = 30.0
    stats_interval_s: float = 1.0
    closed_session_keep_s: float = 60.0  # a closed session stays visible to GET this long

    @field_validator("udp_port_max")
    @classmethod
    def _range(cls, v: int | None, info: ValidationInfo) -> int | None:
        lo = info.data.get("udp_port_min")
        if (v is None) != (lo is None):
            raise ValueError("set both udp_port_min and udp_port_max, or neither")
        if v is not None and lo is not None and v < lo:
            raise ValueError("udp_port_max must be >= udp_port_min")
        return v

    @model_validator(mode="after")
    def _token_off_loopback(self) -> Settings:
        if not self.is_loopback and not self.api_token:
            raise ValueError(
                f"binding {self.host} exposes the server beyond this machine: set WORLDRTC_API_TOKEN "
                "(or --api-token), or bind 127.0.0.1"
            )
        return self

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False
